"""Wake-ups between supervisors sharing one PostgreSQL queue: LISTEN/NOTIFY (SPEC §16).

A supervisor that submits or finishes tasks calls `notify(conn)` inside that transaction; every
supervisor keeps a `Listener`, whose `fileno()` joins the descriptors its loop waits on, so
that the others claim what became ready at once instead of at their next poll. Polling stays
the fallback, and the truth: a wake-up carries nothing but "look now", a lost one costs a poll
interval, and a listener that has died (server restart, killed backend, PgBouncer in transaction
mode, which passes no LISTEN: `[daemon] notify = false`) is noticed and reconnected with backoff
while the loop polls.

NOTIFY takes a lock for the whole database at commit, held until the commit is done: one per
transaction, however many tasks it submitted or finished, keeps that cheap (and PostgreSQL
would fold identical ones into one anyway, after queueing each).

psycopg is imported by the Listener only: `notify` on a SQLite connection does nothing and
loads nothing.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any, Callable

from daemon.store import backend, db
from daemon.store.postgres import connecting

if TYPE_CHECKING:
    import psycopg

CHANNEL = "fredica_wakeup"
RECONNECT_FIRST = 0.5  # seconds before the first reconnect; doubles each failure
RECONNECT_MAX = 30.0
CONNECT_TIMEOUT = 5  # seconds a connect may take (libpq's connect_timeout), on its own thread
CONNECTING_LOOK = 0.1  # while a reconnect is under way, how often the loop looks whether it is done
# A peer gone without a word (a host or network lost) never makes the socket readable: TCP
# keepalives find it out within about a minute (ignored on a Unix socket, where the kernel knows).
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def notify(conn: sqlite3.Connection) -> None:
    """Wake every listening supervisor when the caller's transaction commits (never if it rolls
    back); at most one NOTIFY per transaction. Outside a transaction, at once. Nothing on SQLite
    (one supervisor per database: nobody to wake), nor when `[daemon] notify` is off
    (`conn.notify_wakeups`)."""
    if backend.of(conn) != backend.POSTGRESQL or not getattr(conn, "notify_wakeups", False):
        return
    in_transaction = conn.in_transaction
    if in_transaction and getattr(conn, "wakeup_queued", False):
        return
    # Signed with the sender's supervisor name: its own listener need not wake its own loop.
    statement, params = "SELECT pg_notify(?, ?)", (CHANNEL, getattr(conn, "notify_sender", ""))
    if not in_transaction:
        conn.execute(statement, params)
        return
    db.execute_later(conn, statement, params)  # no round trip of its own: it goes with the next
    conn.wakeup_queued = True  # type: ignore[attr-defined]  # cleared by the adapter at COMMIT/ROLLBACK


class Listener:
    """A connection of its own that LISTENs for wake-ups, for a loop that waits with poll(2).

    `fileno()` goes into the loop's wait while `healthy`; when it is readable (or at any other
    time) `drain()` takes what arrived. A dead connection is found by `drain()`, which then makes
    the listener unhealthy (the loop polls meanwhile) and, on later calls, reconnects once the
    backoff has passed. The descriptor changes with each connection: ask `fileno()` each wait.
    """

    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic,
                 reconnect_first: float = RECONNECT_FIRST, reconnect_max: float = RECONNECT_MAX,
                 own_name: str | None = None) -> None:
        self.url = url
        self.own_name = own_name  # wake-ups signed with it (sent by this supervisor) are not counted
        self._clock = clock
        self._first = reconnect_first
        self._max = reconnect_max
        self._delay = reconnect_first
        self._retry_at = 0.0
        self._conn: psycopg.Connection[Any] | None = None
        self.last_error: str | None = None  # why it is not healthy, for the daemon's log
        self._connector: connecting.Connector[psycopg.Connection[Any]] = connecting.Connector(
            self._open, lambda conn: conn.close(), name="fredica-listener")
        self._connect(clock(), wait=CONNECT_TIMEOUT + 1.0)  # at start-up: healthy at once if it can be

    @property
    def healthy(self) -> bool:
        """Whether it is connected and listening: wake-ups reach it (else the caller polls)."""
        return self._conn is not None

    @property
    def next_attempt_at(self) -> float | None:
        """While not healthy: when `drain()` tries to connect again (by its clock); else None."""
        return None if self._conn is not None else self._retry_at

    @property
    def backend_pid(self) -> int | None:
        """The server process of its connection (None while down)."""
        return None if self._conn is None else self._conn.pgconn.backend_pid

    def fileno(self) -> int:
        """The connection's socket, readable when wake-ups (or its end) arrived. ValueError while
        not healthy: the caller waits on its other descriptors and polls."""
        if self._conn is None:
            raise ValueError("the wake-up listener is not connected")
        return self._conn.pgconn.socket

    def drain(self, now: float | None = None) -> int:
        """Take every wake-up that has arrived, without blocking; how many. A reconnect counts as
        one: what was sent while it was down is lost, so the caller looks once."""
        now = self._clock() if now is None else now
        if self._conn is None:
            return 1 if now >= self._retry_at and self._connect(now) else 0
        import psycopg

        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:
            self._lost(now, str(exc))
            return 0
        count = 0
        own = self.own_name.encode() if self.own_name is not None else None
        while (notice := pgconn.notifies()) is not None:
            if own is None or notice.extra != own:
                count += 1
        if pgconn.status != psycopg.pq.ConnStatus.OK:  # read the server's goodbye, and its end
            self._lost(now, pgconn.get_error_message() or "the connection was closed")
        return count

    def close(self) -> None:
        self._connector.abandon()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, now: float, wait: float | None = None) -> bool:
        """Connect and LISTEN, on a thread of its own (`connecting`): whether it is done. While
        it is under way the loop polls, and looks again within CONNECTING_LOOK; a failure counts
        as one, for the backoff. `wait`: how long to wait for it (the first look's short wait
        by default; at start-up, as long as a connect may take)."""
        import psycopg

        try:
            conn = self._connector.look(wait)
        except psycopg.Error as exc:
            self._lost(now, str(exc))
            return False
        if conn is None:
            self._retry_at = now + CONNECTING_LOOK  # not a failure: no backoff
            return False
        self._conn = conn
        self._delay = self._first
        self.last_error = None
        return True

    def _open(self) -> psycopg.Connection[Any]:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, **_KEEPALIVES)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _lost(self, now: float, why: str) -> None:
        """Down (a connection lost, or an attempt failed): the next attempt after the delay, which
        doubles with each failure in a row (a server restarting is not hammered)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._delay = self._first
        self._retry_at = now + self._delay
        self._delay = min(self._delay * 2, self._max)
        self.last_error = " ".join(why.split()) or "the connection failed"
