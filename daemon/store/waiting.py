"""Changes to waiting tasks that leave their status as it is: hold, release, priority (SPEC §14).

Held is a flag of a pending task (`is_held`), as paused is of a running one, not a status of its
own: SPEC §3's states and transitions, the run's status and its counters all stay as they are, and
a run whose tasks are held is simply not finished. A held task is out of the ready index (migration
8), so a claim, a lookup in that index, never sees it; its dependents wait as they would for any
pending task.

Each change is one guarded UPDATE per chunk of tasks, `WHERE id IN (...) AND status = 'pending'
AND <its own condition>`: what the guard did not let through is refused, each task with the reason
read back from its row. A refusal is a message, not an exception, so that a bulk request reports
every task on its own.
"""

from __future__ import annotations

import sqlite3
from typing import Sequence

from daemon.models import TaskStatus, display_status
from daemon.store import statuses
from daemon.store.db import write

CHUNK = 500  # ids per statement: well under SQLite's limit of bound parameters


def hold(conn: sqlite3.Connection, task_ids: Sequence[str]) -> dict[str, str | None]:
    """Hold each pending task that is not held: never claimed until released. For each id, None
    if it was held now, else why not (running, finished, already held, unknown)."""
    return _guarded(conn, task_ids, "is_held = 1", "is_held = 0", "held")


def release(conn: sqlite3.Connection, task_ids: Sequence[str]) -> dict[str, str | None]:
    """Release each held task: claimable again as any pending task. For each id, None if it was
    released now, else why not (it is not held)."""
    return _guarded(conn, task_ids, "is_held = 0", "is_held = 1", "released")


def set_priority(conn: sqlite3.Connection, task_ids: Sequence[str], priority: int) -> dict[str, str | None]:
    """Give each pending task (held or not) `priority`, which the next claim honours. For each
    id, None if it was changed (or had that priority already), else why not."""
    # "1 = 1", not "1": PostgreSQL takes only a boolean after AND.
    return _guarded(conn, task_ids, "priority = ?", "1 = 1", "given a priority", (priority,))


def _guarded(
    conn: sqlite3.Connection,
    task_ids: Sequence[str],
    assignment: str,
    condition: str,
    verb: str,
    params: tuple[int, ...] = (),
) -> dict[str, str | None]:
    outcome: dict[str, str | None] = {}
    with write(conn):
        for start in range(0, len(task_ids), CHUNK):
            chunk = list(dict.fromkeys(task_ids[start : start + CHUNK]))
            marks = ", ".join("?" * len(chunk))
            changed = {
                row[0]
                for row in conn.execute(
                    # `+status`: by the ids' index. Left to itself, SQLite reads every pending task
                    # through the status index, for each chunk: 60 ms a chunk at 50,000.
                    f"UPDATE task SET {assignment} WHERE id IN ({marks}) AND +status = {statuses.PENDING}"
                    f" AND {condition} RETURNING id",
                    (*params, *chunk),
                )
            }
            refused = [task_id for task_id in chunk if task_id not in changed]
            reasons = _reasons(conn, refused, verb) if refused else {}
            for task_id in chunk:
                outcome[task_id] = None if task_id in changed else reasons[task_id]
    return outcome


def _reasons(conn: sqlite3.Connection, task_ids: list[str], verb: str) -> dict[str, str]:
    """Why each of `task_ids` was not `verb` (it was read just after the guarded UPDATE, in its
    transaction: what the guard saw)."""
    marks = ", ".join("?" * len(task_ids))
    rows = {
        row["id"]: row
        for row in conn.execute(f"SELECT id, status, is_paused, is_held FROM task WHERE id IN ({marks})", task_ids)
    }
    reasons = {}
    for task_id in task_ids:
        row = rows.get(task_id)
        if row is None:
            reasons[task_id] = f"no task has id {task_id}"
            continue
        shown = display_status(row["status"], bool(row["is_paused"]), bool(row["is_held"]))
        if row["status"] != TaskStatus.PENDING.value:
            starting = " (it is starting)" if row["status"] == TaskStatus.CLAIMED.value else ""
            reasons[task_id] = f"task {task_id} is {shown}{starting}: only a waiting task can be {verb}"
        elif row["is_held"]:
            reasons[task_id] = f"task {task_id} is already held"
        else:
            reasons[task_id] = f"task {task_id} is not held"
    return reasons
