"""Claiming on PostgreSQL: what differs from SQLite's claim (`tasks.claim_ready`, which reads the
ready tasks `FOR UPDATE SKIP LOCKED` there and moves them through the one guarded transition).

Due retries are promoted with their rows locked the same way: a retry that another claimer is
promoting at this moment is promoted either way, and this one need not wait for it.
"""

from __future__ import annotations

import sqlite3

from daemon.store import statuses

PROMOTE = f"""
    WITH due AS MATERIALIZED (
        SELECT seq FROM task WHERE status = {statuses.PENDING} AND not_before > 0 AND not_before <= ?
        FOR UPDATE SKIP LOCKED
    )
    UPDATE task SET not_before = 0 FROM due WHERE task.seq = due.seq
"""


def promote_delayed(conn: sqlite3.Connection, now: float) -> None:
    """Retries whose delay has passed join the ready tasks (inside the claim's transaction)."""
    conn.execute(PROMOTE, (now,))
