"""Reads of many tasks: by what people call them (status words: `waiting`, `held`, `paused`,
SPEC §14; a run; a type), their counts by status, and the results a task's dependencies left it.

Apart from the task repository (`tasks`, which keeps the read of one row by id that its
transitions use) because none of these is part of a transition: they serve the CLI's and the web
page's listings, the bulk requests' selectors, exports and dispatch.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable, Sequence

from daemon import models
from daemon.models import Task, TaskStatus
from daemon.store import statuses


def list_tasks(
    conn: sqlite3.Connection,
    *,
    status: str | Iterable[str] | None = None,
    run_id: str | None = None,
    task_type: str | None = None,
    limit: int | None = None,
) -> list[Task]:
    """Tasks in submission order, filtered by status(es), run and type (any case).

    A status is a stored one or a word people see (`waiting`, `held`, `paused`: `status_clause`)."""
    clauses, params = filters(status=status, run_id=run_id, task_type=task_type)
    sql = "SELECT * FROM task"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [Task.from_row(row) for row in conn.execute(sql, params)]


def filters(
    *, status: str | Iterable[str] | None = None, run_id: str | None = None, task_type: str | None = None
) -> tuple[list[str], list[Any]]:
    """The WHERE clauses (to join with AND) and their parameters for a task filter: status
    words (`status_clause`), a run's full id, a type in any case."""
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clause, values = status_clause([status] if isinstance(status, str) else list(status))
        clauses.append(clause)
        params.extend(values)
    if run_id is not None:
        clauses.append("workflow_run_id = ?")
        params.append(run_id)
    if task_type is not None:
        clauses.append("type = ? COLLATE NOCASE")
        params.append(task_type)
    return clauses, params


def status_where(words: Sequence[str]) -> tuple[str, list[str]]:
    """The SQL condition, and its parameters, that keeps the tasks in any of the status `words`
    as `list_tasks` filters them: for the readers of the task table outside this module (`export`)."""
    return status_clause(words)


def status_clause(words: Sequence[str]) -> tuple[str, list[str]]:
    """The WHERE clause for status words, as people see them (SPEC §14): `waiting` is a claimed
    task or a pending one not held, `held` a pending task that is held, `paused` a running task
    that is paused. The stored statuses take all theirs: `running` takes paused tasks in, and
    `pending` held ones."""
    stored = {str(word) for word in words if word in set(TaskStatus)}
    waiting, held = models.DisplayStatus.WAITING in words, models.DisplayStatus.HELD in words
    if waiting:
        stored.add(TaskStatus.CLAIMED.value)
    if waiting and held:
        stored.add(TaskStatus.PENDING.value)  # both halves of pending: the plain stored status
    parts = [f"status IN ({', '.join('?' * len(stored))})"] if stored else []
    if TaskStatus.PENDING not in stored and (waiting or held):
        parts.append(f"(status = {statuses.PENDING} AND is_held = {int(held)})")
    if models.DisplayStatus.PAUSED in words and TaskStatus.RUNNING not in stored:
        parts.append(f"(status = {statuses.RUNNING} AND is_paused = 1)")
    if not parts:
        return "1 = 0", []  # no word that names a state: nothing matches (PostgreSQL wants a boolean)
    return "(" + " OR ".join(parts) + ")", sorted(stored)


def results_of(conn: sqlite3.Connection, task_ids: Sequence[str]) -> dict[str, Any]:
    """Parsed `result` of each given task (dependency id → result), for `ctx.upstream`."""
    if not task_ids:
        return {}
    rows = conn.execute(
        f"SELECT id, result FROM task WHERE id IN ({', '.join('?' * len(task_ids))})", list(task_ids)
    )
    return {row["id"]: (None if row["result"] is None else json.loads(row["result"])) for row in rows}


def count_by_status(conn: sqlite3.Connection) -> dict[str, int]:
    """How many tasks are in each status (every status present, zero included), and how many
    of the pending ones are `held` (SPEC §14: they show as held)."""
    counts = {status.value: 0 for status in TaskStatus}
    for status, count in conn.execute("SELECT status, count(*) FROM task GROUP BY status"):
        counts[status] = count
    counts[models.DisplayStatus.HELD.value] = conn.execute(
        f"SELECT count(*) FROM task WHERE status = {statuses.PENDING} AND is_held = 1"
    ).fetchone()[0]
    return counts
