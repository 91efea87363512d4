"""The restart log: one row per task a restart interrupted, for people to review (SPEC §9)."""

from __future__ import annotations

import json
import sqlite3
from typing import Mapping, Sequence

from daemon.errors import FredicaError, UnknownRestartEntry  # noqa: F401 (re-exported: this module's errors live in the catalogue)
from daemon.models import RestartEntry, Task
from daemon.store.db import write



PENDING_REVIEW = "pending_review"


def record(conn: sqlite3.Connection, session_id: str, interrupted: Sequence[Task], *, now: float) -> int:
    """Log `interrupted` under a new session. An older entry stays awaiting review until a user
    acts on it, whatever restarts come later, unless this one names its task again (SPEC §9)."""
    with write(conn):
        conn.executemany(
            "UPDATE restart_task_log SET disposition = 'superseded', resolved_at = ?"
            " WHERE task_id = ? AND disposition = ?",
            [(now, task.id, PENDING_REVIEW) for task in interrupted],
        )
        conn.executemany(
            """
            INSERT INTO restart_task_log (session_id, task_id, task_type, workflow_run_id, material_id,
                status_at_restart, payload, progress, disposition, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                (
                    session_id,
                    task.id,
                    task.type,
                    task.workflow_run_id,
                    task.material_id,
                    task.status.value,
                    json.dumps(task.payload),
                    task.progress,
                    PENDING_REVIEW,
                    now,
                )
                for task in interrupted
            ],
        )
    return len(interrupted)


def list_entries(conn: sqlite3.Connection, *, include_resolved: bool = False) -> list[RestartEntry]:
    sql = "SELECT * FROM restart_task_log"
    params: tuple[str, ...] = ()
    if not include_resolved:
        sql += " WHERE disposition = ?"
        params = (PENDING_REVIEW,)
    return [RestartEntry.from_row(row) for row in conn.execute(sql + " ORDER BY id", params)]


def entry_ids(conn: sqlite3.Connection, *, run_id: str | None = None) -> list[int]:
    """The ids of the entries awaiting review (of one workflow run's tasks, given `run_id`)."""
    sql, params = "SELECT id FROM restart_task_log WHERE disposition = ?", [PENDING_REVIEW]
    if run_id is not None:
        sql += " AND workflow_run_id = ?"
        params.append(run_id)
    return [row[0] for row in conn.execute(sql + " ORDER BY id", params)]


def get(conn: sqlite3.Connection, entry_id: int) -> RestartEntry:
    row = conn.execute("SELECT * FROM restart_task_log WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        raise UnknownRestartEntry(f"no restart-log entry has id {entry_id}")
    return RestartEntry.from_row(row)


def resolve(
    conn: sqlite3.Connection, entry_id: int, disposition: str, *, now: float, new_run_id: str | None = None
) -> RestartEntry:
    """Move an entry awaiting review to `dismissed` or `recreated`; refused for any other entry."""
    with write(conn):
        entry = get(conn, entry_id)
        if entry.disposition != PENDING_REVIEW:
            raise FredicaError(f"restart-log entry {entry_id} is already {entry.disposition}")
        conn.execute(
            "UPDATE restart_task_log SET disposition = ?, new_workflow_run_id = ?, resolved_at = ? WHERE id = ?",
            (disposition, new_run_id, now, entry_id),
        )
        return get(conn, entry_id)


def mark_recreated(conn: sqlite3.Connection, new_runs: Mapping[str, str | None], *, now: float) -> int:
    """The entries awaiting review of tasks that were just copied into a new run (task id → that
    run) become `recreated`, however the copy was asked for (`restarts recreate`, `retry`); how many."""
    with write(conn):
        return conn.executemany(
            "UPDATE restart_task_log SET disposition = 'recreated', new_workflow_run_id = ?, resolved_at = ?"
            " WHERE task_id = ? AND disposition = ?",
            [(run_id, now, task_id, PENDING_REVIEW) for task_id, run_id in new_runs.items()],
        ).rowcount
