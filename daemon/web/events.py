"""Live task changes for the page (`GET /api/v1/events`, server-sent events): one producer for
every open page.

A single thread looks at the database at most once per `INTERVAL`, and only after the
supervisor's loop has committed something (`Supervisor.wait_for_commit`): it reads the claimed and
running tasks and the rows added since its last look (`store.live`), compares them with what it
saw, and encodes what changed once. That text goes to every subscriber's queue on the HTTP event
loop. So five pages cost what one does, and a page is at most about INTERVAL behind the database.
A subscriber too slow to keep up is told to load again (`resync`) and dropped, never waited for.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from typing import Any, AsyncIterator, Callable

import structlog

from daemon import faults
from daemon.store import db, live, task_reads

log = structlog.get_logger("fredica.http")
INTERVAL = 0.2  # seconds between two looks at most: the page's lag behind the database
COUNTS_INTERVAL = 1.0  # the counts by status (a scan of an index) are read at most this often
ADDED_MAX = 500  # new rows sent one by one per look; past that the pages are told to load again
KEEPALIVE = 15.0  # seconds between comments on a quiet stream, so a gone client is noticed
QUEUE_MAX = 64  # events a subscriber may lag behind before it is dropped


def sse(event: str, data: Any) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


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
        self.loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: set[asyncio.Queue[bytes | None]] = set()  # touched on the event loop only
        self._has_subscribers = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, dict[str, Any]] = {}  # the active tasks as last sent
        self._last_seq = 0
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
        conn = db.connect_reader(self.database)
        try:
            self._last_seq = live.last_seq(conn)
            seen_commits = -1
            while not self._stopping.is_set():
                if not self._has_subscribers.wait(1.0):
                    continue
                commits = self.wait_for_commit(seen_commits, 1.0)
                if commits == seen_commits or self._stopping.is_set():
                    continue
                seen_commits = commits
                try:
                    if db.is_lost(conn):  # a PostgreSQL restart: a new session, or the same error again
                        db.reconnect(conn)
                    changes = self.look(conn, time.monotonic())
                except sqlite3.Error as exc:  # a fault the loop deals with; the page waits
                    if isinstance(exc, sqlite3.DatabaseError) and self.report_corruption is not None:
                        faults.reader_refusal(exc, self.report_corruption)  # corruption ends the daemon
                    log.warning("http_events_read_failed", error=str(exc))
                    changes = None
                if changes is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(self._fan_out, changes)
                    except RuntimeError:
                        return  # the event loop has closed: the server is stopping
                self._stopping.wait(self.interval)
        finally:
            conn.close()

    def look(self, conn: sqlite3.Connection, now: float) -> bytes | None:
        """One look: what changed since the last, as one event (None: nothing did)."""
        self.looks += 1
        current = {row["id"]: row for row in live.active(conn)}
        changed = [row for task_id, row in current.items() if self._seen.get(task_id) != row]
        left = [task_id for task_id in self._seen if task_id not in current]
        changed += live.by_ids(conn, left)
        added = live.added_since(conn, self._last_seq, ADDED_MAX)
        resync = len(added) == ADDED_MAX
        if added:
            self._last_seq = added[-1]["seq"] if not resync else live.last_seq(conn)
            changed += [row for row in added if row["id"] not in current]
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
