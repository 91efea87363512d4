"""Work other threads hand to the supervisor's loop thread, which alone uses the database.

A thread serving a control-socket client calls `call(fn)`: `fn` is queued, the loop is woken
through a pipe, and the caller waits. The loop runs the queued functions together in one
transaction (at the start of its tick, before the tick's own work), each undone alone if it
fails, and answers them only after that transaction is committed: nobody is told of a change that
could still be rolled back.

The loop also counts its commits (`note_commit`), so that a thread waiting for tasks to end
(`wait_for_commit`) wakes when something may have changed, rather than poll the database.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import os
import queue
import sqlite3
import threading
from typing import Any, Callable, Iterator, TypeVar

from daemon import faults
from daemon.errors import ShuttingDown, LoopBusy, RequesterGone  # noqa: F401 (re-exported: this module's errors live in the catalogue)
from daemon.store import db

T = TypeVar("T")
Answer = tuple["concurrent.futures.Future[Any]", bool, Any]  # the future, whether fn returned, what


# Whether the one a request is made for still waits for its answer (a control-socket client that
# has not hung up), for the calls made in this context.
_still_waiting: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "fredica_still_waiting", default=None
)


@contextlib.contextmanager
def on_behalf_of(still_waiting: Callable[[], bool]) -> Iterator[None]:
    """Calls made inside are dropped, not run, if `still_waiting()` is False when the loop takes
    them: a client that gave up (and may try again) must never find its request done after all.
    `still_waiting` runs on the loop thread."""
    token = _still_waiting.set(still_waiting)
    try:
        yield
    finally:
        _still_waiting.reset(token)


def requester_waiting() -> bool:
    """Whether the one the current request is made for still waits for its answer (True when
    nobody said: not a control-socket request)."""
    still_waiting = _still_waiting.get()
    return still_waiting is None or still_waiting()


class LoopHandoff:
    """The queue of handed-over calls and the pipe that wakes the loop for them."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any], Callable[[], bool] | None]
        ] = queue.SimpleQueue()
        # Never closed: `wake` may run in a signal handler at any time, and writing to a closed
        # descriptor number could hit whatever file reused it.
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self.loop_ident: int | None = None  # the loop thread, once it runs
        self.finished = threading.Event()  # the loop has ended: calls are refused
        self.commits = 0  # the loop's commits so far
        self._committed = threading.Condition()

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        """Run `fn` on the loop thread and return its result once committed (directly if already
        on that thread, or if no loop runs yet)."""
        if self.finished.is_set():
            raise ShuttingDown("the daemon is shutting down")
        if self.loop_ident is None or threading.get_ident() == self.loop_ident:
            return fn()
        future = self.submit(fn, _still_waiting.get())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            # Withdrawn, so that a caller told it failed (and who may try again) never finds it
            # done after all. Too late if the loop has started it: its answer then comes with the
            # commit of the tick it runs in.
            if future.cancel():
                raise LoopBusy(
                    f"the daemon did not take the request within {timeout:g} s (it is busy): nothing was done"
                ) from None
            return future.result()

    def submit(self, fn: Callable[[], T], still_waiting: Callable[[], bool] | None) -> concurrent.futures.Future[T]:
        """Queue `fn` for the loop without waiting: its future is answered once the transaction
        it ran in is committed (or refused, never run, if `still_waiting()` is False by then).
        For a caller that must not block: the control socket's I/O thread, whose request the
        future's callback answers. A future refused at once once the loop has ended."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self.finished.is_set():
            future.set_running_or_notify_cancel()
            future.set_exception(ShuttingDown("the daemon is shutting down"))
            return future
        self._calls.put((fn, future, still_waiting))
        if threading.get_ident() != self.loop_ident:  # the loop itself ticks next anyway
            self.wake()
        if self.finished.is_set():  # ended meanwhile: it may never look at the queue again
            self.refuse_pending(ShuttingDown("the daemon is shutting down"))
        return future

    def end(self) -> None:
        """The loop has ended: refuse calls from now on, and wake whoever waits for a commit."""
        with self._committed:
            self.finished.set()
            self._committed.notify_all()

    def note_commit(self) -> None:
        """The loop has committed a transaction: wake whoever waits for a change (loop thread)."""
        with self._committed:
            self.commits += 1
            self._committed.notify_all()

    def wait_for_commit(self, seen: int, timeout: float) -> int:
        """Block until a commit after the `seen`-th (or the loop ends, or `timeout` passes); the
        count then. Any thread but the loop's."""
        with self._committed:
            self._committed.wait_for(lambda: self.commits != seen or self.finished.is_set(), timeout)
            return self.commits

    def pending(self) -> int:
        """How many calls wait for the loop."""
        return self._calls.qsize()

    def wake(self) -> None:
        """Make the loop tick now (safe from any thread and from signal handlers)."""
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full, so a wake-up is already pending

    def clear_wake_ups(self) -> None:
        """Empty the pipe once the loop has woken: one tick serves every wake-up so far."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def run_calls(self, conn: sqlite3.Connection) -> list[Answer]:
        """Run the calls handed over, each in a savepoint of the open transaction; their answers,
        to give with `answer` once it is committed."""
        answers: list[Answer] = []
        while True:
            try:
                fn, future, still_waiting = self._calls.get_nowait()
            except queue.Empty:
                return answers
            if future.set_running_or_notify_cancel():
                if still_waiting is not None and not still_waiting():
                    answers.append((future, False, RequesterGone("the client stopped waiting: nothing was done")))
                    continue
                try:
                    with db.savepoint(conn):
                        answers.append((future, True, fn()))
                except BaseException as exc:  # handed back to the caller, never kills the loop
                    kind = faults.classify(exc)
                    if kind is not None:
                        # The database's fault, not the request's: the whole tick is rolled back
                        # and every request in it refused, this one too.
                        answers.append((future, False, exc))
                        self.refuse(answers, faults.refusal(kind))
                        raise
                    answers.append((future, False, exc))

    @staticmethod
    def answer(answers: list[Answer]) -> None:
        for future, ok, value in answers:
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    @staticmethod
    def refuse(answers: list[Answer], exc: BaseException) -> None:
        """The transaction they ran in was rolled back: nothing they asked for happened."""
        for future, _, _ in answers:
            future.set_exception(exc)

    def refuse_pending(self, exc: BaseException) -> None:
        """Refuse every call still waiting for the loop, running none of them."""
        while True:
            try:
                _, future, _ = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
