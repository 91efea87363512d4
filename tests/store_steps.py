"""Store steps that only tests take: one claim at a time, and a run recounted from scratch.

The supervisor claims in batches (`tasks.claim_ready`) and keeps each run's counters as its
tasks move (`runs.reconcile_non_terminal` recounts the unfinished ones at start-up); tests also
want one claim, and any one run recounted, to check those against.
"""

from __future__ import annotations

import sqlite3

from daemon.models import Task, WorkflowRun
from daemon.store import runs, tasks
from daemon.store.db import write


def claim_next(conn: sqlite3.Connection, now: float, queue: str = "default") -> Task | None:
    """Claim the ready task of `queue` that comes first (priority, then submission order), or None."""
    claimed = tasks.claim_ready(conn, now, 1, queue=queue)
    return claimed[0] if claimed else None


def recompute(conn: sqlite3.Connection, run_id: str, now: float) -> WorkflowRun:
    """Rebuild the run's counters and status from its tasks, as start-up reconciliation does for
    an unfinished run (written only where the row was wrong)."""
    with write(conn):
        return runs._apply_counts(conn, runs.get(conn, run_id), runs.counts_from_tasks(conn, run_id), now)
