"""What the daemon creates is its user's alone: task payloads (a DOWNLOAD's headers may hold
credentials), results and logs live in it. Files and directories that exist already keep their
modes; the systemd units go further (UMask=0077)."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> None:
    """mkdir -p: the directory, if this creates it, is 0700 (parents it creates get the default)."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)


def private_file(path: Path | str) -> None:
    """Create the file, empty and 0600, unless it exists: whoever opens it next keeps that mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
