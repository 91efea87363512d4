"""Sessions whose server stops answering are given up, so that nothing waits on one for ever.

A server whose host froze, or a network that drops packets without a word, leaves a statement
sent and no answer coming: libpq then waits in recv() for as long as TCP takes to give up (about
15 minutes on Linux, and for ever if the server's own kernel still acknowledges). The
supervisor's loop would steer nothing all that time: no timeout enforced, no cancel sent, no
request answered, not even with the refusal an outage gives (SPEC §13: a database error never
hangs the daemon).

So each connection notes when its round trip began (`PostgresConnection.waiting_since`), and one
thread per process looks at the watched ones a few times per `limit`: a session that has waited
longer is shut down (`shutdown(2)` from this thread ends the recv() blocked in the other at once).
psycopg raises there, the error is a lost connection, and the owner rides it out as any outage
(SPEC §13), reconnecting on a thread of its own; the server process of the session given up is
ended then, with the transaction it may still hold. On a server that works, no statement of the
daemon takes near the limit (its bulk paths go in chunks); what may rightly wait long (a
migration waiting for the lock of a `fredica db copy`) runs unwatched, as does the copy itself.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from typing import Protocol

# Seconds a round trip may wait for its server's answer ([daemon] database_answer_timeout).
DEFAULT_LIMIT = 60.0


class Watched(Protocol):
    waiting_since: float | None
    answer_lock: threading.Lock

    def give_up(self, limit: float) -> None: ...


class AnswerWatch:
    """The watcher thread and the sessions it watches (see the module docstring)."""

    def __init__(self, limit: float = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._sessions: weakref.WeakSet[Watched] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._limit_changed = threading.Event()

    @property
    def limit(self) -> float:
        return self._limit

    @limit.setter
    def limit(self, seconds: float) -> None:
        # The thread may be in a wait of a quarter of the old limit (a minute's, set before the
        # daemon read its config): it looks again now, at the pace of the new one.
        self._limit = seconds
        self._limit_changed.set()

    def watch(self, session: Watched) -> None:
        with self._lock:
            self._sessions.add(session)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fredica-answer-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            # A few looks per limit: a session is given up between 1 and 1.25 limits after its
            # round trip began.
            self._limit_changed.wait(max(0.05, self._limit / 4))
            self._limit_changed.clear()
            self.look(time.monotonic())

    def look(self, now: float) -> None:
        """Give up every watched session that has waited for an answer longer than the limit."""
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            since = session.waiting_since
            if since is None or now - since <= self._limit:
                continue
            with session.answer_lock:
                # Still that round trip: its owner clears `waiting_since` under this lock before
                # it may close the connection, so the socket shut below is still this session's.
                if session.waiting_since == since:
                    session.give_up(self._limit)


WATCH = AnswerWatch()


def shut(fd: int) -> bool:
    """End both directions of the socket `fd` (a duplicate is shut, the same socket: the caller's
    fd stays open for its owner to close); whether it could be."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    return True
