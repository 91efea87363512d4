"""Reads for the web page and its live feed (SPEC §17): newest tasks by page, what changed since a
look, and the tallies `/metrics` reports. Nothing here writes.

The live feed looks at the few tasks that are claimed or running (through `task_by_status`) and at
the rows added since its last look (by `seq`), so one look costs the same with 10 or 100,000
tasks stored; the tallies read indexes only.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Sequence

from daemon.store import task_reads

# Columns of a task the page has no use for, or that change with nothing to show (a heartbeat).
# Every other column goes to the page, so one another module adds (a hold, say) reaches it too.
LEFT_OUT = frozenset({"payload", "result", "error", "depends_on", "heartbeat_at", "payload_refs", "executor_pid",
                      "executor_started_at", "queue_explicit", "unmet_deps"})


def _select(conn: sqlite3.Connection) -> str:
    # The columns as a query reports them (no rows read), which both backends do alike: SQLite's
    # PRAGMA table_info has no PostgreSQL counterpart.
    columns = conn.execute("SELECT * FROM task LIMIT 0").description
    names = [column[0] for column in columns if column[0] not in LEFT_OUT]
    return f"SELECT {', '.join(names)} FROM task"


def _dicts(rows: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]  # sqlite3.Row: the names as the table has them


def active(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The claimed and running tasks (never more than the workers and their prefetch)."""
    return _dicts(conn.execute(f"{_select(conn)} WHERE status IN ('claimed', 'running')"))


def added_since(conn: sqlite3.Connection, seq: int, limit: int) -> list[dict[str, Any]]:
    """Tasks stored after `seq`, oldest first, at most `limit`."""
    return _dicts(conn.execute(f"{_select(conn)} WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)))


def by_ids(conn: sqlite3.Connection, ids: Sequence[str]) -> list[dict[str, Any]]:
    """The named tasks as they are now (an id no longer stored is left out)."""
    if not ids:
        return []
    return _dicts(conn.execute(f"{_select(conn)} WHERE id IN ({', '.join('?' * len(ids))})", list(ids)))


def last_seq(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT coalesce(max(seq), 0) FROM task").fetchone()[0]


def newest(conn: sqlite3.Connection, *, status: str | None = None, run_id: str | None = None,
           task_type: str | None = None, before: int | None = None, limit: int = 50) -> tuple[list[dict[str, Any]], int]:
    """One page of tasks, newest first, older than seq `before` when given; with how many match
    in all (filtered as `task_reads.list_tasks`)."""
    clauses, params = task_reads.filters(status=status, run_id=run_id, task_type=task_type)
    total = conn.execute(f"SELECT count(*) FROM task{_where(clauses)}", params).fetchone()[0]
    if before is not None:
        clauses, params = [*clauses, "seq < ?"], [*params, before]
    rows = conn.execute(f"{_select(conn)}{_where(clauses)} ORDER BY seq DESC LIMIT ?", [*params, limit])
    return _dicts(rows), total


def _where(clauses: list[str]) -> str:
    return (" WHERE " + " AND ".join(clauses)) if clauses else ""


# --- tallies for /metrics ------------------------------------------------------------------------


def tasks_by_status_and_queue(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
    """(status, queue, count) for every pair that has tasks."""
    return [tuple(row) for row in conn.execute("SELECT status, queue, count(*) FROM task GROUP BY status, queue")]


def restart_entries_by_disposition(conn: sqlite3.Connection) -> dict[str, int]:
    return {row[0]: row[1] for row in conn.execute("SELECT disposition, count(*) FROM restart_task_log GROUP BY disposition")}
