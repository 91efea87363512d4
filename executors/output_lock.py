"""An exclusive lock on the file a built-in executor writes, held while it writes it.

The lock is an flock(2) on `<output>.lock`: the kernel releases it when its process dies, however
it dies, so a crash never leaves a stale lock. A task that finds the output locked waits for it
as the seed's resource case does: it pauses itself (`ctx.request_pause`, reason "waiting for
<output>") while a thread of its own polls for the lock and resumes it (`ctx.request_resume`) once
the lock is its own. A cancel ends the wait at once; a user's resume only interrupts it (the task
pauses itself again).

The holder removes the lock file when it is done, so no `.lock` file is left after a task ends
normally; a waiter that then gets the lock on the removed file sees that the path is no longer
that file, and starts over on the new one.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from executors import _process
from executors.base import ExecuteResult

if TYPE_CHECKING:
    from executors.base import TaskContext

POLL_INTERVAL = 0.2  # how soon a waiter notices the lock is free (the writer it waits for runs for long)
RESUME_RETRY = 0.05  # how often the lock's thread repeats a resume the waiting thread has not seen


class OutputLock:
    """The held lock on one output; `release` it (or let the process die) when the output is written."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file and release the lock (in that order: while it is still held, the
        file cannot be another task's lock). Safe to call twice."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only directory, say: the lock still goes with the descriptor
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_locked(output: Path, ctx: TaskContext, write: Callable[[], ExecuteResult]) -> ExecuteResult:
    """What `write` returns, run while holding the lock of `output` (its directory made first,
    the lock waited for as above); CANCELLED if the task is cancelled while it waits, IO_ERROR
    if the directory or the lock file cannot be made."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return ExecuteResult(error=f"cannot create {output.parent}: {exc}", error_type="IO_ERROR")
    try:
        lock = hold(output, ctx)
    except OSError as exc:
        return ExecuteResult(error=f"cannot lock {output}: {exc}", error_type="IO_ERROR")
    if lock is None:
        return _process.cancelled_result()
    with lock:
        return write()


def lock_path(output: Path) -> Path:
    """Where the lock of `output` lives: beside it, so that every task writing it finds it."""
    return output.with_name(output.name + ".lock")


def try_lock(output: Path) -> OutputLock | None:
    """The lock of `output` if no other process holds it, else None; OSError if the lock file
    cannot be opened (the output's directory must exist)."""
    path = lock_path(output)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _still_at(fd, path):
            return OutputLock(path, fd)
        os.close(fd)  # its holder removed it while we waited: the lock is now the new file's


def hold(output: Path, ctx: TaskContext) -> OutputLock | None:
    """The lock of `output`, waited for (paused, as above) if another task holds it; None if the
    task is cancelled first. OSError if the lock file cannot be opened."""
    lock = try_lock(output)
    if lock is not None or ctx.cancelled:
        return lock
    reason = f"waiting for {output}"
    ctx.log.info("%s: another task is writing it", output)
    waiter = _Waiter(output, ctx)
    waiter.start()
    try:
        while not waiter.finished.is_set():
            ctx.progress(0, reason)
            # Returns once resumed: by the waiter, by a user's resume (the loop pauses again), or
            # by a cancel (which sets the resume Event too).
            ctx.request_pause(reason)
            if ctx.cancelled:
                break
    finally:
        waiter.stop()
    if waiter.error is not None:
        raise waiter.error
    if ctx.cancelled and waiter.lock is not None:
        waiter.lock.release()  # got just as the task was cancelled: not for a task that ends now
        return None
    return waiter.lock


class _Waiter:
    """The thread that polls for the lock while the task's thread is paused, and resumes it."""

    def __init__(self, output: Path, ctx: TaskContext) -> None:
        self._output = output
        self._ctx = ctx
        self._stopped = threading.Event()  # the task's thread is done waiting
        self.finished = threading.Event()  # the lock is ours, or it cannot be had
        self.lock: OutputLock | None = None
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="fredica-output-lock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Called by the task's thread once it has stopped waiting: ends the thread."""
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            # A cancel wakes the poll at once (wait_cancelled), and then the task's thread stops us.
            while not self._stopped.is_set():
                self.lock = try_lock(self._output)
                if self.lock is not None:
                    break
                if self._ctx.wait_cancelled(POLL_INTERVAL):
                    self._stopped.wait()
                    return
        except OSError as exc:
            self.error = exc
        self.finished.set()
        # The task's thread may not be in request_pause yet (it is started first), and a resume
        # before the pause would be lost: repeated until that thread has seen it. A resume with
        # no pause of its own in progress does nothing.
        while not self._stopped.is_set():
            self._ctx.request_resume()
            self._stopped.wait(RESUME_RETRY)


def _still_at(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (its holder may have removed it)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
