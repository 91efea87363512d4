"""Listing tasks a page at a time: `ls` (sorted, filtered, limited), `show RUN`'s counts, `watch`.

A listing never reads more than it sends: each page is its own short query that goes on from the
last row of the page before (keyset pagination, not OFFSET, which would read every earlier row
again), so neither a page's memory nor the read snapshot it holds grows with the table; `count`
answers the "N more" line without reading the rows.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Iterator, Protocol, Sequence

from daemon import models
from daemon.models import Task, TaskStatus
from daemon.store.task_reads import status_clause  # the one spelling of the status words in SQL

# The order `--sort status` shows: what needs a look (running, waiting) before what has ended.
_STATUS_ORDER = (TaskStatus.RUNNING, TaskStatus.CLAIMED, TaskStatus.PENDING, TaskStatus.FAILED,
                 TaskStatus.CANCELLED, TaskStatus.COMPLETED)
_STATUS_RANK = "CASE status " + " ".join(f"WHEN '{s.value}' THEN {i}" for i, s in enumerate(_STATUS_ORDER)) + " END"
# How long it ran (or has run so far); -1 for one that never started, so it sorts last.
_DURATION = "COALESCE(COALESCE(completed_at, :now) - started_at, -1)"

# Each sort: (SQL expression, descending?) keys, the last one unique (seq) so pages never overlap.
SORTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "submitted": (("seq", True),),  # newest first
    "priority": (("priority", True), ("seq", False)),  # the order they are claimed in
    "status": ((_STATUS_RANK, False), ("seq", True)),  # running, waiting, failed, cancelled, completed
    "type": (("type COLLATE NOCASE", False), ("seq", True)),  # by type name, newest first within one
    "duration": ((_DURATION, True), ("seq", True)),  # longest first (so far, for running ones)
}
assert tuple(SORTS) == models.TASK_SORTS
DEFAULT_SORT = "submitted"
PAGE_SIZE = 500  # rows a page holds: a frame of a few hundred kilobytes


class Reader(Protocol):
    """What a page is read through: a connection, or one that picks the calling thread's."""

    def execute(self, sql: str, parameters: Any = ..., /) -> sqlite3.Cursor: ...


@dataclasses.dataclass(frozen=True)
class TaskQuery:
    """Which tasks a listing holds (filters as `task_reads.list_tasks` takes them) and in what order."""

    status: Sequence[str] | None = None  # stored statuses or the words people see
    run_id: str | None = None
    task_type: str | None = None  # any case
    since: float | None = None  # submitted at or after this Unix time
    sort: str = DEFAULT_SORT
    now: float = 0.0  # the time a running task's duration is measured to (`duration` sort)

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """The WHERE terms of the filters, with their named parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {"now": self.now}
        if self.status is not None:
            clause, values = status_clause(list(self.status))
            for index, value in enumerate(values):
                clause = clause.replace("?", f":status{index}", 1)
                params[f"status{index}"] = value
            clauses.append(clause)
        if self.run_id is not None:
            clauses.append("workflow_run_id = :run_id")
            params["run_id"] = self.run_id
        if self.task_type is not None:
            clauses.append("type = :task_type COLLATE NOCASE")
            params["task_type"] = self.task_type
        if self.since is not None:
            clauses.append("created_at >= :since")
            params["since"] = self.since
        return clauses, params


def count(conn: sqlite3.Connection, query: TaskQuery) -> int:
    """How many tasks the query holds (without reading them)."""
    clauses, params = query.where()
    sql = "SELECT count(*) FROM task" + (" WHERE " + " AND ".join(clauses) if clauses else "")
    return conn.execute(sql, params).fetchone()[0]


def page(conn: Reader, query: TaskQuery, size: int, after: Sequence[Any] | None = None
         ) -> tuple[list[Task], tuple[Any, ...] | None]:
    """Up to `size` tasks of the query in its order, after the row whose sort key is `after` (None:
    from the start); and the sort key of the last one, where the next page starts (None: no row)."""
    keys = SORTS[query.sort]
    clauses, params = query.where()
    if after is not None:
        clauses.append(_after(keys, len(after)))
        params.update({f"k{index}": value for index, value in enumerate(after)})
    key_columns = ", ".join(f"{expr} AS k{index}" for index, (expr, _) in enumerate(keys))
    order = ", ".join(f"k{index} {'DESC' if desc else 'ASC'}" for index, (_, desc) in enumerate(keys))
    sql = f"SELECT *, {key_columns} FROM task"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += f" ORDER BY {order} LIMIT :size"
    rows = conn.execute(sql, {**params, "size": size}).fetchall()
    if not rows:
        return [], None
    last = tuple(rows[-1][f"k{index}"] for index in range(len(keys)))
    return [Task.from_row(row) for row in rows], last


def _after(keys: Sequence[tuple[str, bool]], given: int, index: int = 0) -> str:
    """`key0 > :k0 OR (key0 = :k0 AND (key1 > :k1 OR ...))`, each comparison in its key's direction."""
    expr, desc = keys[index]
    beyond = f"({expr}) {'<' if desc else '>'} :k{index}"
    if index == given - 1:
        return f"({beyond})"
    return f"({beyond} OR (({expr}) = :k{index} AND {_after(keys, given, index + 1)}))"


def tasks(conn: Reader, query: TaskQuery, limit: int | None = None,
          size: int = PAGE_SIZE) -> Iterator[list[Task]]:
    """The query's tasks page by page (at most `limit` in all), each page read when it is asked for."""
    after: tuple[Any, ...] | None = None
    left = limit
    while left is None or left > 0:
        want = size if left is None else min(size, left)
        found, after = page(conn, query, want, after)
        if found:
            yield found
        if len(found) < want:
            return
        if left is not None:
            left -= len(found)


def counts_by_display_status(conn: sqlite3.Connection, run_id: str) -> dict[str, int]:
    """How many of a run's tasks are in each status as people see it (waiting, paused, ...)."""
    counts: dict[str, int] = {}
    rows = conn.execute(
        "SELECT status, is_paused, is_held, count(*) AS n FROM task WHERE workflow_run_id = ?"
        " GROUP BY status, is_paused, is_held",
        (run_id,),
    )
    for row in rows:
        name = models.display_status(row["status"], bool(row["is_paused"]), bool(row["is_held"]))
        counts[name] = counts.get(name, 0) + row["n"]
    return counts
