"""Claiming on PostgreSQL: several supervisors (or connections) take ready tasks at once.

SQLite serializes writers (`BEGIN IMMEDIATE`), so `tasks.claim_ready` may read the ready tasks and
then move them. On PostgreSQL two claimers would read the same rows, and the second one's guarded
UPDATE would find them claimed and refuse its whole claim. Here one statement locks what it takes
with `FOR UPDATE SKIP LOCKED` and moves it: a claimer passes over the rows another is taking
instead of waiting for them or failing, and a row that another claimer committed meanwhile is
re-checked under its lock and skipped. The CTE is `MATERIALIZED` so that the planner cannot fold
it into the UPDATE and lock (or update) more rows than the LIMIT, as Oban found.

It is the transition pending → claimed of SPEC §3 (the only source of `claimed`), guarded by the
same `status = 'pending'` term, setting what `tasks._transition` sets for it (`claimed_at`), with
the run counters moved in the same transaction.
"""

from __future__ import annotations

import sqlite3

from daemon.models import Task, TaskStatus
from daemon.store import runs, statuses
from daemon.store.db import write

CLAIM = f"""
    WITH ready AS MATERIALIZED (
        SELECT seq FROM task
        WHERE queue = ? AND status = {statuses.PENDING} AND unmet_deps = 0 AND not_before = 0 AND is_held = 0
        ORDER BY priority DESC, seq
        LIMIT ?
        FOR UPDATE SKIP LOCKED
    )
    UPDATE task SET status = {statuses.CLAIMED}, claimed_at = ?
    FROM ready WHERE task.seq = ready.seq AND task.status = {statuses.PENDING}
    RETURNING task.*
"""
PROMOTE = f"""
    WITH due AS MATERIALIZED (
        SELECT seq FROM task WHERE status = {statuses.PENDING} AND not_before > 0 AND not_before <= ?
        FOR UPDATE SKIP LOCKED
    )
    UPDATE task SET not_before = 0 FROM due WHERE task.seq = due.seq
"""


def claim_ready(
    conn: sqlite3.Connection, now: float, limit: int, *, queue: str = "default", promote_delayed: bool = True
) -> list[Task]:
    """`tasks.claim_ready` on PostgreSQL: up to `limit` ready tasks of `queue`, in claim order
    (priority, then submission order), none of them claimed by anyone else."""
    if limit <= 0:
        return []
    with write(conn):
        if promote_delayed:
            # SKIP LOCKED here too: a retry another claimer is promoting is promoted either way.
            conn.execute(PROMOTE, (now,))
        claimed = [Task.from_row(row) for row in conn.execute(CLAIM, (queue, limit, now))]
        runs.shift_counts(
            conn, [(task.workflow_run_id, TaskStatus.PENDING, TaskStatus.CLAIMED) for task in claimed], now
        )
    return sorted(claimed, key=lambda task: (-task.priority, task.seq))  # RETURNING gives no order
