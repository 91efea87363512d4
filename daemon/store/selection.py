"""The tasks a bulk request's selectors name (SPEC §14): their ids only, a chunk at a time.

A selector may match 50,000 tasks: they are read by `seq`, each chunk a range past the last
one's end, so that neither side holds more than a chunk of ids, and no cursor stays open between
chunks (the loop writes in between). An operation selects only the tasks it can act on (its
`Scope`): `cancel --run R` cancels the run's unfinished tasks, and does not refuse its finished
ones one by one.
"""

from __future__ import annotations

import enum
import sqlite3
from typing import Any, Iterator, Sequence

from daemon.models import TaskStatus
from daemon.store import statuses, task_reads


class Scope(enum.Enum):
    """The tasks an acting operation can act on, as SQL (the statuses' literals, `statuses`)."""

    UNFINISHED = f"status IN ({statuses.ACTIVE})"
    UNPAUSED = f"status = {statuses.RUNNING} AND is_paused = 0"
    PAUSED = f"status = {statuses.RUNNING} AND is_paused = 1"
    NOT_HELD = f"status = {statuses.PENDING} AND is_held = 0"
    HELD = f"status = {statuses.PENDING} AND is_held = 1"
    PENDING = f"status = {statuses.PENDING}"
    ENDED_UNDONE = f"status IN ({statuses.literals([TaskStatus.FAILED, TaskStatus.CANCELLED])})"


def task_ids(
    conn: sqlite3.Connection,
    *,
    scope: Scope | None = None,
    status: Sequence[str] = (),
    run_id: str | None = None,
    task_type: str | None = None,
    chunk: int = 1000,
    newest_first: bool = False,
) -> Iterator[list[str]]:
    """The ids of the tasks in `scope` that match every selector given (status words as `ls
    --status` takes them, a run's full id, a type in any case), in submission order (or the
    newest first), `chunk` at a time."""
    clauses, params = task_reads.filters(status=list(status) or None, run_id=run_id, task_type=task_type)
    clauses.insert(0, f"seq {'<' if newest_first else '>'} ?")
    if scope is not None:
        clauses.append(f"({scope.value})")
    order = "DESC" if newest_first else ""
    sql = f"SELECT seq, id FROM task WHERE {' AND '.join(clauses)} ORDER BY seq {order} LIMIT ?"
    after = 2**63 - 1 if newest_first else 0
    while True:
        rows: list[Any] = conn.execute(sql, [after, *params, chunk]).fetchall()
        if not rows:
            return
        yield [row[1] for row in rows]
        if len(rows) < chunk:
            return
        after = rows[-1][0]


def newest_first(conn: sqlite3.Connection, task_ids: Sequence[str]) -> list[str]:
    """`task_ids` the newest first: a task's dependents always come after it in submission order,
    so that acting in this order, none is reached by what was done to one before it (a cancel's
    cascade). Ids of no task come last."""
    seqs: dict[str, int] = {}
    for start in range(0, len(task_ids), 500):
        part = list(task_ids[start : start + 500])
        marks = ", ".join("?" * len(part))
        seqs.update(conn.execute(f"SELECT id, seq FROM task WHERE id IN ({marks})", part).fetchall())
    return sorted(task_ids, key=lambda task_id: -seqs.get(task_id, -1))
