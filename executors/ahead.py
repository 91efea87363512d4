"""Attempts sent ahead (a queue's prefetch, SPEC §15), as the executor process keeps them.

The supervisor sends a task ahead while the attempt it is to follow still runs; the process
starts it on its own once that one is over, saying {"type": "started", "attempt"} before any
executor code runs. A "revoke" command takes it back: the process answers {"type": "revoked",
"attempt"} if it has not started it (and then never does), or nothing if it has (its "started"
is already on the channel). Each is decided once, never both ways:

- `AheadAttempts`, in a process that runs attempts one at a time: the next one is read from the
  assignment pipe by the main thread once the current one is over, while a revoke is read by the
  control reader's thread; one lock orders the two.
- `WaitingBehind`, in an event-loop process: each assignment names the attempt it follows
  (`after`); the loop's one thread does everything.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Protocol

from executors.assignment import Assignment

# Attempts whose start is remembered, to leave a revoke that crossed it unanswered: one comes
# within moments of the start, so a few suffice (an event-loop process starts many at once).
REMEMBERED_STARTS = 4096


class _Status(Protocol):
    def put(self, message: dict[str, Any]) -> None: ...


class _Remembered:
    """A set that forgets its oldest members past `limit`."""

    def __init__(self, limit: int = REMEMBERED_STARTS) -> None:
        self._items: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._limit = limit

    def add(self, item: str) -> None:
        self._items[item] = None
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items


class AheadAttempts:
    """The attempts sent ahead to a process that runs one at a time (see the module docstring)."""

    def __init__(self, status: _Status) -> None:
        self._status = status
        self._lock = threading.Lock()
        self._started = _Remembered()
        self._revoked = _Remembered()

    def start(self, attempt: str) -> bool:
        """Start `attempt` (main thread) unless it was revoked; False: it was, and is dropped."""
        with self._lock:
            if attempt in self._revoked:
                return False
            self._started.add(attempt)
            self._status.put({"type": "started", "attempt": attempt})
            return True

    def revoke(self, attempt: str) -> None:
        """Never start `attempt` (control reader's thread), unless it has started."""
        with self._lock:
            if attempt in self._started or attempt in self._revoked:
                return
            self._revoked.add(attempt)
            self._status.put({"type": "revoked", "attempt": attempt})


class WaitingBehind:
    """The attempts an event-loop process was sent ahead, each waiting behind the one it follows
    (see the module docstring). It runs as many at once as the supervisor gave it without
    `prefetched`: each that ends starts the one waiting behind it."""

    def __init__(self) -> None:
        self._waiting: dict[str, Assignment] = {}  # arrived, not started, by token
        self._behind: dict[str, list[str]] = {}  # token -> those waiting behind it
        self._started = _Remembered()
        self._revoked_early: set[str] = set()  # revoked before their assignment arrived
        # A revoked attempt's place: what it waited behind, for those sent to follow it.
        self._links: collections.OrderedDict[str, str | None] = collections.OrderedDict()

    def arrive(self, assignment: Assignment, running: Callable[[str], bool]) -> bool:
        """An assignment sent ahead came: True to start it now (what it follows is over); else it
        waits, or was revoked already and is dropped. What this (and `ended`, `revoke`) says to
        start counts as started from then on."""
        token = assignment.attempt
        if token in self._revoked_early:
            self._revoked_early.discard(token)
            self._link(token, assignment.after)
            return False
        after = self._resolve(assignment.after)
        if after is not None and (after in self._waiting or running(after)):
            self._waiting[token] = assignment
            self._behind.setdefault(after, []).append(token)
            return False
        self._started.add(token)
        return True

    def ended(self, token: str) -> list[Assignment]:
        """`token`'s attempt is over: those that waited behind it, to start now."""
        return self._start(self._behind.pop(token, []))

    def revoke(self, token: str, running: Callable[[str], bool]) -> tuple[bool, list[Assignment]]:
        """Take `token` back: whether to answer "revoked" (it never started, and never will), and
        those that waited behind it and must start now (what it followed is over)."""
        if token in self._started or token in self._revoked_early:
            return False, []
        assignment = self._waiting.pop(token, None)
        if assignment is None:  # not arrived yet: dropped when it does
            self._revoked_early.add(token)
            return True, []
        self._link(token, assignment.after)
        for after, tokens in self._behind.items():
            if token in tokens:
                tokens.remove(token)
                break
        followers = self._behind.pop(token, [])
        target = self._resolve(assignment.after)
        if target is not None and (target in self._waiting or running(target)):
            self._behind.setdefault(target, []).extend(followers)
            return True, []
        return True, self._start(followers)

    def _start(self, tokens: list[str]) -> list[Assignment]:
        starting = [self._waiting.pop(t) for t in tokens if t in self._waiting]
        for assignment in starting:
            self._started.add(assignment.attempt)
        return starting

    def clear(self) -> None:
        """The daemon is gone: nothing waiting may start."""
        self._waiting.clear()
        self._behind.clear()

    def _link(self, token: str, after: str | None) -> None:
        self._links[token] = after
        while len(self._links) > REMEMBERED_STARTS:
            self._links.popitem(last=False)

    def _resolve(self, after: str | None) -> str | None:
        seen = 0
        while after is not None and after in self._links and seen <= len(self._links):
            after, seen = self._links[after], seen + 1
        return after
