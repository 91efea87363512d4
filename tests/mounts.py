"""Real small or read-only filesystems for the fault tests: a tmpfs mounted as root (CI runs as
root, so there it must work; elsewhere the test is skipped when it cannot)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(directory: Path, size: str) -> None:
    """Mount a tmpfs of `size` (e.g. "16m") on `directory`; unmount it with `unmount`."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            raise AssertionError(f"cannot mount a tmpfs as root: {mounted.stderr}")
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")


def unmount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], check=False)
