"""Processes bound to their parent: a child that dies with it (Linux's PR_SET_PDEATHSIG), used by
a launcher's forks and by the commands the built-in executors start, so that neither runs on
unsupervised; a process that runs attempts, which adopts what its descendants orphan
(PR_SET_CHILD_SUBREAPER), so that nothing they started outlives it (a launcher's fork ends what
its attempt left before it reports; a process that runs several attempts, when it exits); and an
attempt whose daemon has died, which is ended, with its process tree, within a second (SPEC §13).

The daemon is the only writer of each executor process's control pipe, so the pipe's hang-up
says it is gone, killed or not, whatever the attempt is doing: a launcher waits for its fork and
for that hang-up at once; a process that runs attempts itself has a thread that waits for it
(`watch_daemon`). Either then ends the attempt (`end_orphaned_attempt`) and writes one line to
its log. An attempt that writes on its status channel meanwhile finds it broken (EPIPE) and
waits to be ended (`await_end`), with no traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import signal
import threading
from typing import Any, NoReturn

from executors import tasklog
from executors.output import AttemptOutput

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


# --- an attempt whose daemon has died -----------------------------------------------------------

ORPHANED = "the daemon is gone: this attempt is ended, with every process it started"
LOOK_INTERVAL = 1.0  # seconds between two looks at a running attempt's log, from outside it
_HUNG_UP = select.POLLHUP | select.POLLERR
_ending = threading.Lock()  # one thread ends an orphaned attempt; any other waits for the exit


class AttemptState:
    """What is known of the attempt a process runs, in memory that a launcher shares with its
    forks (made before they are forked): whether it took its task, whether it has sent its
    result, and its log, so that the launcher can end the attempt of a fork whose daemon has
    died, say so in its log, and keep that log within its limit while the fork runs."""

    IDLE, TAKEN, REPORTED = 0, 1, 2
    _PATH = 16  # the state byte, the log's rotation size (8 bytes), then the log's path
    _SIZE = _PATH + 4096

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self._SIZE)

    @property
    def state(self) -> int:
        return self._map[0]

    def reset(self) -> None:
        """No attempt: the next fork waits for its task."""
        self._map[0] = self.IDLE

    def take(self) -> None:
        """The attempt has read its whole task: it is under way (its log not yet known)."""
        self._map[self._PATH] = 0
        self._map[0] = self.TAKEN

    def log_to(self, log_path: str, max_log_bytes: int) -> None:
        """The attempt under way writes `log_path`, within `max_log_bytes`."""
        path = os.fsencode(log_path)[: self._SIZE - self._PATH - 1]
        self._map[1:9] = max(1, max_log_bytes // 2).to_bytes(8, "little")
        self._map[self._PATH : self._PATH + len(path) + 1] = path + b"\0"

    def reported(self) -> None:
        """The attempt has sent its result: it is over, whatever happens to the daemon now."""
        self._map[0] = self.REPORTED

    def log_path(self) -> str | None:
        """The log of the attempt under way, if there is one."""
        if self._map[0] != self.TAKEN:
            return None
        path = self._map[self._PATH : self._SIZE].split(b"\0", 1)[0]
        return os.fsdecode(path) if path else None

    def keep_log_within_limit(self) -> None:
        """Rotate the log of the attempt under way if it has reached half its limit."""
        path = self.log_path()
        if path is not None:
            tasklog.rotate(path, int.from_bytes(self._map[1:9], "little"))


def daemon_gone(events: int) -> bool:
    """Whether poll(2)'s `events` for a control pipe say that the daemon is gone."""
    return bool(events & _HUNG_UP)


def end_orphaned_attempt(attempt: AttemptState) -> NoReturn:
    """The daemon is gone: end every process below this one (a launcher's fork and all it
    started; or, in a process that runs attempts, all those started), write one line saying so
    to the log of the attempt that was under way, and exit."""
    if not _ending.acquire(blocking=False):
        threading.Event().wait()  # another thread of this process is at it, and exits
    path = attempt.log_path()
    end_leftovers(wait=0.5)
    if path is not None:
        AttemptOutput.append_line(path, "WARNING", ORPHANED)
    os._exit(1)


def watch_daemon(control_fd: int, attempt: AttemptState) -> None:
    """In a process that runs attempts itself: a thread that ends the attempt under way once the
    daemon is gone (the control pipe hangs up), and keeps its log within its limit meanwhile
    (what the process writes is counted as it goes, not what its commands write straight to it)."""

    def watch() -> None:
        poller = select.poll()
        poller.register(control_fd, 0)  # its hang-up only: the commands are the control reader's
        while True:
            if any(daemon_gone(events) for _, events in poller.poll(LOOK_INTERVAL * 1000)):
                end_orphaned_attempt(attempt)
            attempt.keep_log_within_limit()

    threading.Thread(target=watch, name="fredica-daemon-watch", daemon=True).start()


def await_end(control_fd: int, bound: float = 5.0) -> NoReturn:
    """In a launcher's fork whose status channel broke (EPIPE): its daemon is gone, and the
    launcher, which sees that too, ends this attempt and says so. Wait for that, a bounded time."""
    poller = select.poll()
    poller.register(control_fd, 0)
    if any(daemon_gone(events) for _, events in poller.poll(bound * 1000)):
        threading.Event().wait(bound)
    os._exit(1)
