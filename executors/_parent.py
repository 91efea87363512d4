"""Processes bound to their parent: a child that dies with it (Linux's PR_SET_PDEATHSIG), used by
a launcher's forks and by the commands the built-in executors start, so that neither runs on
unsupervised; and a process that runs attempts, which adopts what its descendants orphan
(PR_SET_CHILD_SUBREAPER), so that nothing they started outlives it (a launcher's fork ends what
its attempt left before it reports; a process that runs several attempts, when it exits)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
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


def adopt_orphans() -> None:
    """Become the parent of every process orphaned below this one, instead of init: one that
    detached (setsid, a double fork) is then still this process's to end (`end_leftovers`).
    Not inherited by forks: each process that runs attempts calls it."""
    if _prctl is not None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def end_leftovers(rounds: int = 3, wait: float = 2.0) -> list[int]:
    """SIGKILL every process this one started or adopted that still runs, and reap it; the pids
    ended. One system call when there are none, the usual case."""
    try:
        os.waitpid(-1, os.WNOHANG)  # reaps one that ended, if any; raises if there is no child at all
    except ChildProcessError:
        return []
    import psutil  # only now: an attempt that left nothing does not pay for it

    ended: list[int] = []
    # Several rounds: a process forked by a leftover just before it was killed is orphaned to
    # this one, and found by the next look.
    for _ in range(rounds):
        try:
            found = psutil.Process().children(recursive=True)
        except psutil.Error:
            break
        alive = [process for process in found if running(process)]
        if not alive:
            break
        for process in alive:
            with contextlib.suppress(psutil.Error):  # checks the pid still names that process
                process.kill()
                ended.append(process.pid)
        psutil.wait_procs(alive, timeout=wait)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # zombies: adopted ones that ended on their own
            pass
    return ended


def running(process: Any) -> bool:
    """Still the process it was (psutil checks its start time), and not a zombie: it may have
    ended, and been reaped, since it was listed."""
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
