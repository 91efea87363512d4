"""The task rows `fredica export` writes, read the same way from SQLite and PostgreSQL.

Keyset pages by `seq` (`seq > last one ORDER BY seq LIMIT n`), all inside one read transaction:
never more than a page in memory whatever the table's size, one snapshot of the queue from the
first row to the last (REPEATABLE READ on PostgreSQL, where each statement would otherwise see
the commits made since the one before), and one code path for both backends, where a server-side
cursor would be PostgreSQL's alone.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Generator, Sequence

from daemon.store import backend, task_reads

# What a row says, in this order: who it is, where it is, how it went, when.
COLUMNS = (
    "id", "workflow_run_id", "type", "queue", "status", "is_held", "priority", "retry_count", "max_retries",
    "progress", "status_text", "error_type", "error", "material_id", "idempotency_key",
    "created_at", "started_at", "completed_at", "payload", "result",
)
PAGE = 500  # rows read at once: a page of large payloads stays a few megabytes

_SNAPSHOT = {
    backend.SQLITE: "BEGIN",  # deferred: the snapshot of its first read, held until the end
    backend.POSTGRESQL: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
}
# SQLite, given several statuses, would merge two index searches and sort what they find for
# every page: each page re-reading every match after it, quadratic in the matches. NOT INDEXED
# keeps it on the rowid's range, one pass over the table in all. PostgreSQL's planner weighs the
# LIMIT against how many rows match, and chooses the primary key's order itself.
_TASKS = {backend.SQLITE: "task NOT INDEXED", backend.POSTGRESQL: "task"}
_HAS_TASKS = {
    backend.SQLITE: "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'task'",
    backend.POSTGRESQL: "SELECT to_regclass('task') IS NOT NULL",
}


def holds_tasks(conn: sqlite3.Connection) -> bool:
    """Whether the database has a task table (a fredica database, on either backend)."""
    return bool(conn.execute(_HAS_TASKS[backend.of(conn)]).fetchone()[0])


def rows(conn: sqlite3.Connection, *, statuses: Sequence[str] = (), run_id: str | None = None,
         page: int | None = None) -> Generator[dict[str, Any], None, None]:
    """The tasks in submission order, each a dict of COLUMNS: those in any of the status words
    `statuses` (as `ls --status` takes them) and of the run `run_id` (a full id), if given; read
    `page` rows at a time (PAGE)."""
    size = PAGE if page is None else page
    clauses, params = ["seq > ?"], []
    if statuses:
        clause, values = task_reads.status_where(list(statuses))
        clauses.append(clause)
        params += values
    if run_id is not None:
        clauses.append("workflow_run_id = ?")
        params.append(run_id)
    sql = f"SELECT seq, {', '.join(COLUMNS)} FROM {_TASKS[backend.of(conn)]} WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"
    conn.execute(_SNAPSHOT[backend.of(conn)])
    try:
        after = 0  # seqs start at 1
        while True:
            found = conn.execute(sql, [after, *params, size]).fetchall()
            for row in found:
                yield {column: row[column] for column in COLUMNS}
            if len(found) < size:
                return
            after = found[-1]["seq"]
    finally:
        # Read-only: nothing to commit. A connection that broke has nothing to roll back.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
