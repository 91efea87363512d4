"""A connection to the server made on a thread of its own, for a loop that must not wait for it.

When the server's host is away without a word (a network lost, a host powered off), a connect
waits for libpq's `connect_timeout` (seconds) before it fails. The supervisor's loop reconnects
its session and its wake-up listener itself, and while it waited there it steered nothing: a
cancel or a pause of a task running on this host, which needs no database, waited as long.
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


class Connecting(Generic[C]):
    """One connect (`open`) running on a daemon thread: `result` looks whether it is done."""

    def __init__(self, open: Callable[[], C], close: Callable[[C], None], name: str) -> None:
        self._open, self._close = open, close
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: C | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            made = self._open()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller of `result`)
            self._error = exc
            return
        with self._lock:
            if not self._abandoned:
                self._made = made
                return
        self._close(made)  # nobody wants it any more

    def result(self, wait: float = 0.0) -> C | None:
        """The connection once made (the caller's from then on); None while it is being made;
        the connect's own error if it failed. Waits up to `wait` seconds for it."""
        self._thread.join(wait)
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise self._error
        return self._made

    def abandon(self) -> None:
        """Its connection, if one comes, is closed instead of handed over (the caller closed)."""
        with self._lock:
            self._abandoned = True
            made, self._made = self._made, None
        if made is not None:
            self._close(made)
