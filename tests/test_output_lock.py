"""The lock on an output (executors.output_lock): a waiter pauses itself and is resumed when the
lock is free, a cancel ends the wait, a dead holder's lock is free, the lock file does not stay.

Holders are real processes (the lock is a process's, released by the kernel); the waiter runs in
this process with a real TaskContext, whose messages are recorded.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from executors import output_lock
from executors.base import TaskContext
from tests import media
from tests.conftest import wait_for

HOLDER = """
import sys
from pathlib import Path
from executors import output_lock
lock = output_lock.try_lock(Path(sys.argv[1]))
print("held" if lock is not None else "busy", flush=True)
sys.stdin.read()  # until the test closes it
lock.release()
"""


class Holder:
    """A process holding the lock of `output` until `release` (or until it is killed)."""

    def __init__(self, output: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == "held\n"

    def release(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(10) == 0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


class Waiter:
    """`output_lock.hold` in a thread of this process, as an executor's main thread runs it."""

    def __init__(self, output: Path) -> None:
        self.sink = media.Recorder()
        self.cancel, self.resume = threading.Event(), threading.Event()
        self.resume.set()  # running
        self.ctx = TaskContext(media.make_task("DOWNLOAD", id=f"waiter-{id(self)}"), self.sink, self.cancel,
                               self.resume)  # type: ignore[arg-type]
        self.lock: output_lock.OutputLock | None = None
        self.thread = threading.Thread(target=self._run, args=(output,))
        self.thread.start()

    def _run(self, output: Path) -> None:
        self.lock = output_lock.hold(output, self.ctx)

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.sink.messages if m["type"] in ("pause_request", "resume_request")]

    def wait_paused(self) -> None:
        wait_for(lambda: "pause_request" in self.kinds() and not self.resume.is_set())

    def finish(self) -> output_lock.OutputLock | None:
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.lock


@pytest.fixture
def output(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "clip.mp4"
    # No waiting thread outlives its wait.
    assert not [t for t in threading.enumerate() if t.name == "fredica-output-lock"]


def test_a_free_output_is_locked_at_once_and_its_lock_file_removed_on_release(output: Path) -> None:
    waiter = Waiter(output)
    lock = waiter.finish()
    assert lock is not None and waiter.sink.messages == []  # no pause, no progress
    assert output_lock.lock_path(output).exists()
    with pytest.raises(BlockingIOError):  # another process's descriptor cannot have it now
        with open(output_lock.lock_path(output), "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.release()
    assert not output_lock.lock_path(output).exists()


def test_a_second_writer_pauses_itself_until_the_first_is_done(output: Path) -> None:
    holder = Holder(output)
    waiter = Waiter(output)
    waiter.wait_paused()
    pause = next(m for m in waiter.sink.messages if m["type"] == "pause_request")
    assert pause["reason"] == f"waiting for {output}"
    assert {"type": "progress", "percent": 0, "text": f"waiting for {output}"} in waiter.sink.messages
    assert waiter.thread.is_alive()  # still waiting: the holder holds
    holder.release()
    lock = waiter.finish()
    assert lock is not None and waiter.kinds() == ["pause_request", "resume_request"]
    assert waiter.resume.is_set()
    lock.release()


def test_a_users_resume_does_not_end_the_wait(output: Path) -> None:
    holder = Holder(output)
    waiter = Waiter(output)
    waiter.wait_paused()
    waiter.resume.set()  # what the supervisor's resume command does
    wait_for(lambda: waiter.kinds().count("pause_request") == 2)  # paused itself again
    assert waiter.thread.is_alive()
    holder.release()
    lock = waiter.finish()
    assert lock is not None
    lock.release()


def test_a_cancel_ends_the_wait_at_once(output: Path) -> None:
    holder = Holder(output)
    waiter = Waiter(output)
    waiter.wait_paused()
    waiter.cancel.set()  # what the supervisor's cancel command does: cancel, then resume
    waiter.resume.set()
    assert waiter.finish() is None
    holder.release()  # it held the lock all along


def test_a_holder_that_dies_leaves_no_stale_lock(output: Path) -> None:
    holder = Holder(output)
    waiter = Waiter(output)
    waiter.wait_paused()
    holder.kill()  # SIGKILL: no release, the lock file stays, the kernel frees the lock
    assert output_lock.lock_path(output).exists()
    lock = waiter.finish()
    assert lock is not None
    lock.release()
    assert not output_lock.lock_path(output).exists()


def test_a_lock_got_on_a_removed_lock_file_is_given_up_for_the_new_file(
    output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A waiter opens the lock file, its holder removes it and releases the lock, then the waiter's
    # flock succeeds: on a file no one else will ever open. It must start over on the path's file.
    first = output_lock.try_lock(output)
    assert first is not None
    flock = fcntl.flock
    calls: list[Any] = []

    def released_before_the_first_flock(fd: int, operation: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            first.release()  # between this waiter's open and its flock
        flock(fd, operation)

    monkeypatch.setattr(output_lock.fcntl, "flock", released_before_the_first_flock)
    lock = output_lock.try_lock(output)
    assert lock is not None and len(calls) == 2
    monkeypatch.undo()
    path = output_lock.lock_path(output)
    with open(path, "rb") as f:  # the lock is on the file the path names
        with pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.release()
