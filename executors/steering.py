"""Cancel, pause and resume: the supervisor's control messages and the Events an attempt sees.

The supervisor writes small framed messages, `{"type": "cancel" | "pause" | "resume", "attempt"}`,
on a control pipe of each executor process. A thread in the process that runs attempts reads them
and applies each to the Events of the attempt it names (a token unique to one attempt in that
process, so a command meant for an earlier attempt, even of the same task, never steers a later one): `TaskContext` still gets a cancel Event
and a resume Event (set = running), and the seed's pause protocol (clear, put, wait) is unchanged.

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
from typing import Any

from executors.channel import HEADER_SIZE, READ_CHUNK, encode

COMMANDS = ("cancel", "pause", "resume")
# Commands for attempts this process has not started yet (the supervisor may pause a task the
# moment it has sent it): kept for this many attempts, so stale ones cannot pile up.
PENDING_ATTEMPTS = 8


def command(kind: str, attempt: str) -> bytes:
    """One framed control message for the attempt named `attempt`."""
    if kind not in COMMANDS:
        raise ValueError(f"unknown control command {kind!r}")
    return encode({"type": kind, "attempt": attempt})


class Steering:
    """One attempt's cancel and resume Events, as the supervisor's commands leave them."""

    def __init__(self, attempt: str) -> None:
        self.attempt = attempt
        self.cancel = threading.Event()
        self.resume = threading.Event()
        self.resume.set()  # set = running; a pause clears it

    def apply(self, kind: str) -> None:
        if kind == "cancel":
            # Cancel first, then wake a paused executor: it must see why it was woken.
            self.cancel.set()
            self.resume.set()
        elif kind == "pause":
            self.resume.clear()
        elif kind == "resume":
            self.resume.set()


class ControlReader:
    """Reads the control pipe in a daemon thread and steers the attempt each command names."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._current: Steering | None = None
        self._pending: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        threading.Thread(target=self._run, name="fredica-control", daemon=True).start()

    def steer(self, attempt: str) -> Steering:
        """The Events of the attempt that starts now (with the commands already sent for it)."""
        steering = Steering(attempt)
        with self._lock:
            for kind in self._pending.pop(attempt, []):
                steering.apply(kind)
            self._pending.clear()  # meant for attempts that are over or never came
            self._current = steering
        return steering

    def _apply(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("type") not in COMMANDS:
            return
        kind, attempt = message["type"], str(message.get("attempt"))
        with self._lock:
            if self._current is not None and self._current.attempt == attempt:
                self._current.apply(kind)
                return
            self._pending.setdefault(attempt, []).append(kind)
            self._pending.move_to_end(attempt)
            while len(self._pending) > PENDING_ATTEMPTS:
                self._pending.popitem(last=False)

    def _run(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._fd, READ_CHUNK)
            except OSError:
                return
            if not chunk:
                return  # the supervisor is gone
            buffer += chunk
            while len(buffer) >= HEADER_SIZE:
                length = int.from_bytes(buffer[:HEADER_SIZE], "big")
                if len(buffer) < HEADER_SIZE + length:
                    break
                body, buffer = buffer[HEADER_SIZE : HEADER_SIZE + length], buffer[HEADER_SIZE + length :]
                try:
                    self._apply(json.loads(body))
                except ValueError:
                    pass  # only the supervisor writes here; never let a bad message stop steering
