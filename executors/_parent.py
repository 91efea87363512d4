"""A child that dies with its parent (Linux's PR_SET_PDEATHSIG): used by a launcher's forks and
by the commands the built-in executors start, so neither runs on unsupervised."""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
try:  # resolved at import, never in a forked child, where loading a library is not safe
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` dies (nothing where there is no prctl).

    Call it in the child right after the fork; `parent` is the pid the parent had before forking.
    """
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)
