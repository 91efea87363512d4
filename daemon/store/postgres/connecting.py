"""Connections to the server made on a thread of their own, for a loop that must not wait.

When the server's host is away without a word (a network lost, a host powered off), a connect
waits for libpq's `connect_timeout` (seconds) before it fails. The supervisor's loop reconnects
its session and its wake-up listener itself, and while it waited there it steered nothing: no
timeout, no stop's escalation, no answer to a request, not even the refusal an outage gives.
So the loop starts the connect here and looks back later: at most one connect at a time, each
look costing nothing (or a short wait just after the start, which a server that answers meets).
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

C = TypeVar("C")

# How long the look that starts a connect waits for it: a server that answers (a restart that
# is over, a local socket) is reached within it, in the same look, as it was before.
FIRST_WAIT = 0.1


class _Attempt(Generic[C]):
    """One connect on its daemon thread, and what came of it."""

    def __init__(self, open: Callable[[], C], close: Callable[[C], None], name: str) -> None:
        self._close = close
        self._lock = threading.Lock()
        self.abandoned = False
        self.made: C | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(open,), name=name, daemon=True)
        self.thread.start()

    def _run(self, open: Callable[[], C]) -> None:
        try:
            made = open()
        except BaseException as exc:  # noqa: BLE001 (handed to the look that finds it done)
            self.error = exc
            return
        with self._lock:
            if not self.abandoned:
                self.made = made
                return
        self._close(made)  # nobody wants it any more

    def abandon(self) -> None:
        with self._lock:
            self.abandoned = True
            made, self.made = self.made, None
        if made is not None:
            self._close(made)


class Connector(Generic[C]):
    """Makes connections with `open` (closed with `close` if nobody takes them), one at a time,
    each on a daemon thread: `look` starts one if none is under way and says how it stands."""

    def __init__(self, open: Callable[[], C], close: Callable[[C], None], name: str) -> None:
        self._open, self._close, self._name = open, close, name
        self._attempt: _Attempt[C] | None = None

    @property
    def under_way(self) -> bool:
        return self._attempt is not None

    def look(self, wait: float | None = None) -> C | None:
        """The new connection once made (the caller's from then on); None while it is being
        made; the connect's own error if it failed. Either of those ends the attempt: the next
        look starts another. Waits up to `wait` seconds (by default FIRST_WAIT on the look that
        starts a connect, none on the others)."""
        if self._attempt is None:
            self._attempt = _Attempt(self._open, self._close, self._name)
            wait = FIRST_WAIT if wait is None else wait
        attempt = self._attempt
        attempt.thread.join(wait or 0.0)
        if attempt.thread.is_alive():
            return None
        self._attempt = None
        if attempt.error is not None:
            raise attempt.error
        return attempt.made

    def abandon(self) -> None:
        """The caller is closing: a connection still to come is closed instead of handed over."""
        if self._attempt is not None:
            self._attempt.abandon()
            self._attempt = None
