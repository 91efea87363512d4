"""What the page reads beyond the operations: tasks newest first by page, and a task's log followed.

`GET /api/v1/page/tasks?status=&type=&run=&before=SEQ&limit=50` gives one page of tasks, newest
first, with the total that match, so the first load reads 50 rows whatever the database holds.
`GET /api/v1/page/log?id=ID` streams a task's log as server-sent events, from its last
`LOG_TAIL` bytes on, until the task has ended and all of its log was sent.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from typing import Any, AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon import errors, faults, models, protocol
from daemon.store import db, live
from daemon.store import ids as id_store
from daemon.web import api, events

PAGE_MAX = 500  # rows one page may ask for
LOG_TAIL = 64 * 1024  # bytes of a log shown when it is opened
LOG_CHUNK = 64 * 1024  # bytes read at once while following
LOG_INTERVAL = 0.25  # seconds between two looks at a followed log


class Views:
    """The page's own reads, each run on the API's pool with a read-only connection per thread."""

    def __init__(self, database: Any, api_: api.Api, stopping: Callable[[], bool],
                 report_corruption: Callable[[BaseException], None] = lambda exc: None) -> None:
        self.database = database
        self.report_corruption = report_corruption
        self.api = api_
        self.stopping = stopping
        self._reader = db.ThreadReaders(self.database)


    def _tasks_page(self, status: str | None, task_type: str | None, run: str | None, before: int | None,
                    limit: int) -> dict[str, Any]:
        if status is not None and status not in models.TASK_FILTER_WORDS:
            raise errors.ProtocolError(f"unknown status {protocol.shown(status)}")

        def page(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
            run_id = None if run is None else id_store.run_id(conn, run)
            return live.newest(conn, status=status, run_id=run_id, task_type=task_type, before=before, limit=limit)

        try:
            rows, total = self._reader.read(page)
        except sqlite3.DatabaseError as exc:
            raise faults.reader_refusal(exc, self.report_corruption) from None
        return {"tasks": rows, "total": total}

    async def tasks(self, request: Request) -> Response:
        query = request.query_params
        try:
            before = _integer(query.get("before"), "before")
            limit = _integer(query.get("limit"), "limit")
            limit = 50 if limit is None else limit
            if not 0 < limit <= PAGE_MAX:
                raise errors.ProtocolError(f"limit must be between 1 and {PAGE_MAX}")
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(
                self.api.pool, self._tasks_page, query.get("status") or None, query.get("type") or None,
                query.get("run") or None, before, limit)
        except errors.FredicaError as exc:
            return api.refusal(exc)
        return api.json_response({"ok": True, "data": data})

    async def log(self, request: Request) -> Response:
        given = request.query_params.get("id", "")
        try:
            found = await self.api.run("log_path", {"id": given})
        except errors.FredicaError as exc:
            return api.refusal(exc)
        return StreamingResponse(self._follow(given, found["path"]), media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})

    async def _follow(self, given: str, path: str) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        offset = None
        active = True
        while not self.stopping():
            offset, text = await loop.run_in_executor(self.api.pool, _read_from, path, offset)
            if text:
                yield events.sse("log", {"text": text})
            elif not active:
                yield events.sse("end", {})
                return
            else:
                # Ended? Asked only when the log has nothing new: its last lines come first.
                active = (await self.api.run("log_path", {"id": given}))["active"]
                await asyncio.sleep(LOG_INTERVAL)


def _read_from(path: str, offset: int | None) -> tuple[int | None, str]:
    """(the new offset, the text after `offset`); None: from the log's last LOG_TAIL bytes."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if offset is None or offset > size:  # first look, or rotated since (SPEC §13)
                offset = max(0, size - LOG_TAIL)
            handle.seek(offset)
            data = handle.read(LOG_CHUNK)
    except FileNotFoundError:
        return offset, ""  # not written yet
    return offset + len(data), data.decode(errors="replace")


def _integer(text: str | None, name: str) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise errors.ProtocolError(f"{name} must be an integer, not {protocol.shown(text)}") from None
