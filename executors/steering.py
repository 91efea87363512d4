"""Cancel, pause and resume: the supervisor's control messages and the Events an attempt sees.

The supervisor writes small framed messages, `{"type": "cancel" | "pause" | "resume", "attempt"}`
(a cancel also says why: `"reason": "cancel" | "timeout" | "shutdown"`), on a control pipe of each
executor process. A thread in the process that runs attempts reads them
and applies each to the Events of the attempt it names (a token unique to one attempt in that
process, so a command meant for an earlier attempt, even of the same task, never steers a later
one): `TaskContext` still gets a cancel Event and a resume Event (set = running), and the seed's
pause protocol (clear, put, wait) is unchanged.

An event-loop process (`executors.event_loop`) reads the pipe with its loop instead, and hands
the bytes to a `Commands`, as `ControlReader` does: one parser and one routing of commands for
both, to the many attempts the loop holds (each a `Steered`, with asyncio Events).

A "revoke" names an attempt sent ahead (prefetch, SPEC §15) that has not started: it goes to the
process's own record of those (`executors.ahead`), which decides it against the attempt's start.

The thread starts the first time an attempt uses one of its Events (or at once, for an attempt of
a queue that sends tasks ahead: a revoke must be answered while it runs), after applying every command
already in the pipe, so that use sees them all. An attempt that never looks at its Events (most
short tasks) never pays for a thread; in a fresh fork per attempt that is a fifth of its cost.

Why not `multiprocessing.Event`s shared with the supervisor: they keep a count of waiting
processes, and setting one waits for every counted waiter to wake. A process that dies while one
of its threads waits on it (a killed attempt, or any attempt of a launcher, which ends with
`os._exit`) leaves a waiter that never wakes, and the supervisor's next `set()` would block its
loop for good. Events private to the attempt, set by its own thread, have no such failure.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from typing import Any, Callable

from executors import framing
from executors.channel import MAX_MESSAGE, READ_CHUNK, encode, poll_now

# "revoke": for an attempt sent ahead (prefetch, SPEC §15) that the process has not started: it
# answers {"type": "revoked", "attempt"} and never starts it, or nothing if it already has.
COMMANDS = ("cancel", "pause", "resume", "revoke")
# Commands for attempts this process has not started yet (the supervisor may pause a task the
# moment it has sent it): kept for this many attempts, so stale ones cannot pile up.
PENDING_ATTEMPTS = 8


def command(kind: str, attempt: str, reason: str | None = None) -> bytes:
    """One framed control message for the attempt named `attempt` (`reason`: why it is cancelled)."""
    if kind not in COMMANDS:
        raise ValueError(f"unknown control command {kind!r}")
    message = {"type": kind, "attempt": attempt}
    if reason is not None:
        message["reason"] = reason
    return encode(message)


class SteeredEvent(threading.Event):
    """A threading Event whose every use first makes sure the process's control reader has run:
    whatever the supervisor sent before this moment is applied before the Event is looked at."""

    def __init__(self, reader: ControlReader) -> None:
        super().__init__()
        self._reader = reader

    def is_set(self) -> bool:
        self._reader.start()
        return super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self._reader.start()
        return super().wait(timeout)

    def set(self) -> None:
        self._reader.start()
        super().set()

    def clear(self) -> None:
        self._reader.start()
        super().clear()


class Steered:
    """One attempt as the commands steer it, whatever kind its Events are (threading ones here,
    asyncio ones in an event-loop process: `executors.event_loop`): what each command does, and
    in which order, is spelled out once, in `apply`."""

    def __init__(self, attempt: str) -> None:
        self.attempt = attempt
        self._cancel_reason: str | None = None

    @property
    def cancel_reason(self) -> str | None:
        """Why the supervisor cancelled the attempt ("cancel": a user; "timeout"; "shutdown": the
        daemon stops and will run it again), once it has; None before that, or if it did not say."""
        return self._cancel_reason

    def apply(self, kind: str, reason: str | None = None) -> None:
        """Apply one command to this attempt."""
        if kind == "cancel":
            self._cancel_reason = reason
            # Cancel first, then wake a paused executor: it must see why it was woken.
            self._set_cancel()
            self._set_resume()
        elif kind == "pause":
            self._clear_resume()
        elif kind == "resume":
            self._set_resume()

    def _set_cancel(self) -> None:
        raise NotImplementedError

    def _set_resume(self) -> None:
        raise NotImplementedError

    def _clear_resume(self) -> None:
        raise NotImplementedError


class Steering(Steered):
    """One attempt's cancel and resume Events, as the supervisor's commands leave them."""

    def __init__(self, attempt: str, reader: ControlReader) -> None:
        super().__init__(attempt)
        self.cancel = SteeredEvent(reader)
        self.resume = SteeredEvent(reader)
        threading.Event.set(self.resume)  # set = running; a pause clears it
        self._reader = reader

    @property
    def cancel_reason(self) -> str | None:
        self._reader.start()
        return self._cancel_reason

    # The plain Event methods: these run inside the reader, which needs no starting.
    def _set_cancel(self) -> None:
        threading.Event.set(self.cancel)

    def _set_resume(self) -> None:
        threading.Event.set(self.resume)

    def _clear_resume(self) -> None:
        threading.Event.clear(self.resume)


class Commands:
    """The control pipe's bytes as commands, each applied to the attempt it names: one of those
    `attach`ed, or kept for an attempt not started yet (up to `pending_attempts` of them, so
    stale ones cannot pile up). Used by both kinds of executor process."""

    def __init__(self, pending_attempts: int = PENDING_ATTEMPTS) -> None:
        self._lock = threading.Lock()  # guards the attempts' state: _attempts and _pending
        self._frames: framing.Frames | None = framing.Frames(MAX_MESSAGE)
        self._attempts: dict[str, Steered] = {}
        self._pending: collections.OrderedDict[str, list[tuple[str, str | None]]] = collections.OrderedDict()
        self._pending_attempts = pending_attempts
        # Where a "revoke" goes (it is for no attempt under way): the process's `AheadAttempts`.
        self.on_revoke: Callable[[str], None] | None = None

    def attach(self, steered: Steered, *, only: bool = False) -> None:
        """Steer `steered` from now on, after the commands already sent for it. `only`: it is
        the process's one attempt now; every other, and what is kept for any other, is dropped."""
        with self._lock:
            for kind, reason in self._pending.pop(steered.attempt, []):
                steered.apply(kind, reason)
            if only:
                self._pending.clear()  # meant for attempts that are over or never came
                self._attempts.clear()
            self._attempts[steered.attempt] = steered

    def detach(self, attempt: str) -> None:
        """The attempt is over: a later command for it is kept as for an unknown one, then dropped."""
        with self._lock:
            self._attempts.pop(attempt, None)

    def feed(self, chunk: bytes) -> None:
        """Apply every command `chunk` completes (bytes of a frame not complete yet are kept)."""
        if self._frames is None:
            return
        try:
            bodies = self._frames.bodies(chunk)
        except framing.Oversized:
            # `command` encodes none that long: the pipe's framing is lost, and no later command can be
            # found in it. Only the supervisor writes here, so this is a bug of ours; the attempt
            # runs on unsteered (as it would if its Events were never looked at).
            self._frames = None
            return
        for body in bodies:
            try:
                self._apply(json.loads(body))
            except ValueError:
                pass  # only the supervisor writes here; never let a bad message stop steering

    def _apply(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("type") not in COMMANDS:
            return
        kind, attempt = message["type"], str(message.get("attempt"))
        if kind == "revoke":
            if self.on_revoke is not None:
                self.on_revoke(attempt)
            return
        reason = message.get("reason")
        reason = reason if isinstance(reason, str) else None
        with self._lock:
            steered = self._attempts.get(attempt)
            if steered is not None:
                steered.apply(kind, reason)
                return
            self._pending.setdefault(attempt, []).append((kind, reason))
            self._pending.move_to_end(attempt)
            while len(self._pending) > self._pending_attempts:
                self._pending.popitem(last=False)


class ControlReader(Commands):
    """Reads the control pipe and steers the process's one attempt: first when the attempt uses
    its Events (`start`), then in a daemon thread."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._start_lock = threading.Lock()
        self._started = False
        self._thread: threading.Thread | None = None

    def steer(self, attempt: str) -> Steering:
        """The Events of the attempt that starts now (with the commands already sent for it)."""
        steering = Steering(attempt, self)
        self.attach(steering, only=True)
        return steering

    def start(self) -> None:
        """Apply the commands already in the pipe, then keep reading in a daemon thread (once)."""
        if self._started:
            return
        with self._start_lock:  # another thread's first use waits until every command is applied
            if self._started:
                return
            if self._read_available():
                self._thread = threading.Thread(target=self._run, name="fredica-control", daemon=True)
                self._thread.start()
            self._started = True

    def _read_available(self) -> bool:
        """Apply what can be read without waiting; False once the pipe is closed."""
        try:
            while poll_now(self._fd):
                chunk = os.read(self._fd, READ_CHUNK)
                if not chunk:
                    return False  # the supervisor is gone
                self._feed(chunk)
        except OSError:
            return False
        return True

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, READ_CHUNK)
            except OSError:
                return
            if not chunk:
                return  # the supervisor is gone
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        self.feed(chunk)

