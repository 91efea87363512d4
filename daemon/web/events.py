"""Live task changes for the page (`GET /api/v1/events`, server-sent events): one producer for
every open page.

A single thread looks at the database at most once per `INTERVAL`, and only after the
supervisor's loop has committed something (`Supervisor.wait_for_commit`): it reads the claimed and
running tasks and the rows added since its last look (`store.live`), compares them with what it
saw, and encodes what changed once. That text goes to every subscriber's queue on the HTTP event
loop. So five pages cost what one does, and a page is at most about INTERVAL behind the database.
A subscriber too slow to keep up is told to load again (`resync`) and dropped, never waited for.

On PostgreSQL (SPEC §16) this supervisor's commits are not all there is to see: the others of the
database run tasks and record their progress, and tell nobody (they NOTIFY submits and ends, not
progress). So there the producer looks every INTERVAL while a page is open, whatever this loop did:
the page of any host shows every task of the queue live.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from typing import Any, AsyncIterator, Callable

import structlog

from daemon import faults
from daemon.store import backend, db, live, task_reads

log = structlog.get_logger("fredica.http")
INTERVAL = 0.2  # seconds between two looks at most: the page's lag behind the database
COUNTS_INTERVAL = 1.0  # the counts by status (a scan of an index) are read at most this often
ADDED_MAX = 500  # new rows sent one by one per look; past that the pages are told to load again
KEEPALIVE = 15.0  # seconds between comments on a quiet stream, so a gone client is noticed
RECONNECT_WAIT = 1.0  # seconds between two attempts to open the feed's reader
QUEUE_MAX = 64  # events a subscriber may lag behind before it is dropped
# Seconds a seq missing below seen ones is waited for: longer than a writer's transaction takes
# from its insert to its commit, short enough that rows above it are not read again for long.
GAP_WAIT = 10.0


def sse(event: str, data: Any) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Arrivals:
    """Which rows read by `seq` are new, where seqs may be committed out of order.

    On SQLite the one writer commits seqs in order, so "after the greatest seq seen" is exact. On
    PostgreSQL each supervisor's transaction takes its seqs when it inserts and shows them when it
    commits: a row of seq 10 can appear after one of seq 11 was seen. So the horizon stops below a
    missing seq, and the rows above it are read again (those sent left out) until it appears or
    has been missing for GAP_WAIT: a rolled-back insert, or an idempotent submit that met its
    key, leaves a seq that no row will ever have."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon  # every seq up to here was sent or given up: read after it
        self._sent: set[int] = set()  # seqs above the horizon already sent
        self._missing_since: tuple[float, int] | None = None  # when seqs went missing, and below which

    def fresh(self, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """The rows of `rows` (read after the horizon) not sent before; the horizon moved on."""
        new = [row for row in rows if row["seq"] not in self._sent]
        self._sent.update(row["seq"] for row in new)
        self._advance(now)
        return new

    def skip_to(self, seq: int) -> None:
        """Everything up to `seq` counts as sent (the pages were told to load again)."""
        self.horizon, self._sent, self._missing_since = seq, set(), None

    def _advance(self, now: float) -> None:
        while self.horizon + 1 in self._sent:
            self._sent.remove(self.horizon + 1)
            self.horizon += 1
        if not self._sent:
            self._missing_since = None  # no seq is missing below a seen one
        elif self._missing_since is None or self._missing_since[1] <= self.horizon:
            self._missing_since = (now, max(self._sent))
        elif now - self._missing_since[0] >= GAP_WAIT:
            # Every seq still missing below that bound has been missing for GAP_WAIT: given up.
            self.skip_to(self._missing_since[1])


class TaskChanges:
    """The one producer of task changes, and its subscribers (asyncio queues on one event loop)."""

    def __init__(self, database: Any, commits: Callable[[], int], wait_for_commit: Callable[[int, float], int],
                 *, interval: float = INTERVAL,
                 report_corruption: Callable[[BaseException], None] | None = None) -> None:
        self.database = database
        self.report_corruption = report_corruption  # the supervisor's: a corrupt database ends the daemon
        self.commits = commits
        self.wait_for_commit = wait_for_commit
        self.interval = interval
        # Other supervisors write this database too: their changes come with no commit of ours.
        self.shared = backend.is_postgres(database)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: set[asyncio.Queue[bytes | None]] = set()  # touched on the event loop only
        self._has_subscribers = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, dict[str, Any]] = {}  # the active tasks as last sent
        self.arrivals = Arrivals(0)  # the rows added since the last look, by seq
        self._counts: dict[str, int] | None = None
        self._counts_at = float("-inf")  # the first look reads them
        self.looks = 0  # how many times the database was read (for tests and benchmarks)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._thread = threading.Thread(target=self._run, name="fredica-http-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the producer and every stream (each gets its end marker)."""
        self._stopping.set()
        self._has_subscribers.set()
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._fan_out, None)
            except RuntimeError:
                pass  # the loop closed meanwhile: the streams are gone with it
        if self._thread is not None:
            self._thread.join(5)

    # --- the subscribers' side (the event loop) ----------------------------------------------------

    async def stream(self) -> AsyncIterator[bytes]:
        """A subscriber's events until the server stops or the client goes."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_MAX)
        self._subscribers.add(queue)
        self._has_subscribers.set()
        try:
            yield sse("hello", {"interval": self.interval})
            while not self._stopping.is_set():
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except asyncio.TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if item is None:
                    return
                yield item
        finally:
            self._subscribers.discard(queue)
            if not self._subscribers:
                self._has_subscribers.clear()

    def _fan_out(self, data: bytes | None) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(data)
            except asyncio.QueueFull:
                # Too slow to follow: told to load again, and dropped rather than waited for.
                self._subscribers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(sse("resync", {}))
                queue.put_nowait(None)

    # --- the producer (its own thread) --------------------------------------------------------------

    def _run(self) -> None:
        # Opened at once, not at the first subscriber: the rows a page may miss are those added
        # after this horizon, so it must be taken before any page subscribes.
        conn = self._connect(failing=False)
        late = conn is None
        try:
            seen_commits = -1
            failing = late  # the last look (or connection) failed
            while not self._stopping.is_set():
                if conn is None:
                    conn = self._connect(failing)
                    if conn is None:  # a PostgreSQL server away when the daemon started: later
                        failing = True
                        self._stopping.wait(RECONNECT_WAIT)
                        continue
                    if self.loop is not None:  # rows may have come before this late horizon
                        with contextlib.suppress(RuntimeError):
                            self.loop.call_soon_threadsafe(self._fan_out, sse("resync", {}))
                if not self._has_subscribers.wait(1.0):
                    continue
                if not self.shared:
                    commits = self.wait_for_commit(seen_commits, 1.0)
                    if commits == seen_commits or self._stopping.is_set():
                        continue
                    seen_commits = commits
                try:
                    if db.is_lost(conn):  # a PostgreSQL restart: a new session, or the same error again
                        db.reconnect(conn)
                    changes = self.look(conn, time.monotonic())
                    failing = False
                except sqlite3.Error as exc:  # a fault the loop deals with; the page waits
                    if isinstance(exc, sqlite3.DatabaseError) and self.report_corruption is not None:
                        faults.reader_refusal(exc, self.report_corruption)  # corruption ends the daemon
                    if not failing:  # once per outage: on PostgreSQL it fails at every look until it ends
                        log.warning("http_events_read_failed", error=str(exc))
                    failing, changes = True, None
                if changes is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(self._fan_out, changes)
                    except RuntimeError:
                        return  # the event loop has closed: the server is stopping
                self._stopping.wait(self.interval)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self, failing: bool) -> sqlite3.Connection | None:
        """The feed's own reader, and the seq its arrivals start after; None while the database
        cannot be read (said once per outage), rather than a producer thread ended for good."""
        conn = None
        try:
            conn = db.connect_reader(self.database)
            self.arrivals = Arrivals(live.last_seq(conn))
            return conn
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            if not failing:
                log.warning("http_events_read_failed", error=str(exc))
            return None

    def look(self, conn: sqlite3.Connection, now: float) -> bytes | None:
        """One look: what changed since the last, as one event (None: nothing did)."""
        self.looks += 1
        current = {row["id"]: row for row in live.active(conn)}
        changed = [row for task_id, row in current.items() if self._seen.get(task_id) != row]
        left = [task_id for task_id in self._seen if task_id not in current]
        changed += live.by_ids(conn, left)
        added = live.added_since(conn, self.arrivals.horizon, ADDED_MAX)
        resync = len(added) == ADDED_MAX
        if resync:
            self.arrivals.skip_to(live.last_seq(conn))
        else:
            changed += [row for row in self.arrivals.fresh(added, now) if row["id"] not in current]
        self._seen = current
        message: dict[str, Any] = {}
        if changed and not resync:
            message["tasks"] = changed
        if resync:
            message["resync"] = True
        if now - self._counts_at >= COUNTS_INTERVAL:
            self._counts_at = now
            counts = task_reads.count_by_status(conn)
            if counts != self._counts:
                self._counts = message["counts"] = counts
        return sse("tasks", message) if message else None
