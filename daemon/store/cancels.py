"""Cancels: of one task (SPEC §7), of a run's tasks that have not started, and of the waiting
tasks a bulk cancel names (SPEC §14). Each takes the tasks' pending dependents with it.

Apart from the transitions the supervisor makes on its attempts (`tasks`) because these are a
user's requests, and most move many tasks at once: each is one guarded transition
(`tasks._transition`) over the rows it read. A running task is only reported here; its
supervisor stops its attempt, whose end is recorded as cancelled.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Sequence

from daemon import models
from daemon.errors import UnknownRun
from daemon.models import Task, TaskStatus
from daemon.store import runs, statuses
from daemon.store.db import write
from daemon.store.postgres import wakeups
from daemon.store.tasks import _transition, active_downstream, transition


def cancel(
    conn: sqlite3.Connection, task_id: str, *, now: float, reason: str = "cancelled by user", known: Task | None = None
) -> Task:
    """Any active status → cancelled; pending dependents are cancelled too. On a PostgreSQL queue
    the supervisors are woken at the commit: one that runs the task stops its attempt then."""
    cancelled = transition(
        conn, task_id, TaskStatus.CANCELLED, now=now, known=known, error=reason, error_type=models.CANCELLED
    )
    wakeups.notify(conn)
    return cancelled


@dataclasses.dataclass(frozen=True)
class RunCancellation:
    """What cancelling a run did: tasks cancelled outright, and running ones left to stop."""

    cancelled: tuple[str, ...]
    running: tuple[str, ...]


def cancel_waiting_in_run(
    conn: sqlite3.Connection, run_id: str, *, now: float, reason: str = "run cancelled by user"
) -> RunCancellation:
    """Cancel every pending and claimed task of a run; report the running ones (the supervisor
    stops those through their executors)."""
    with write(conn):
        if runs.find(conn, run_id) is None:
            raise UnknownRun(f"no workflow run has id {run_id}")
        rows = conn.execute(
            f"""SELECT seq, id, status, workflow_run_id FROM task
                WHERE workflow_run_id = ? AND status IN ({statuses.ACTIVE}) ORDER BY seq""",
            (run_id,),
        ).fetchall()
        waiting = [r for r in rows if r["status"] != TaskStatus.RUNNING.value]
        running = tuple(r["id"] for r in rows if r["status"] == TaskStatus.RUNNING.value)
        _transition(
            conn,
            waiting,
            TaskStatus.CANCELLED,
            now=now,
            fields={"error": reason, "error_type": models.CANCELLED},
        )
    return RunCancellation(tuple(r["id"] for r in waiting), running)


def cancel_waiting(
    conn: sqlite3.Connection, task_ids: Sequence[str], *, now: float, reason: str = "cancelled by user"
) -> dict[str, int]:
    """Cancel those of `task_ids` that are pending or claimed, in one guarded transition (a bulk
    cancel: SPEC §14), their pending dependents with them. For each one cancelled, how many tasks
    not yet ended depended on it, counted before; the others (running, finished, unknown) are
    left alone for the caller."""
    found: list[sqlite3.Row] = []
    for start in range(0, len(task_ids), 500):
        part = list(task_ids[start : start + 500])
        found += conn.execute(
            # `+status`: by the ids' index, not every waiting task's entry in the status index.
            f"SELECT seq, id, status, workflow_run_id FROM task WHERE id IN ({', '.join('?' * len(part))})"
            f" AND +status IN ({statuses.WAITING})", part,
        ).fetchall()
    if not found:
        return {}
    with write(conn):
        seqs = [row["seq"] for row in found]
        with_dependents: set[int] = set()
        for start in range(0, len(seqs), 500):
            part = seqs[start : start + 500]
            with_dependents.update(row[0] for row in conn.execute(
                f"SELECT DISTINCT depends_on_seq FROM task_dependency WHERE depends_on_seq IN ({', '.join('?' * len(part))})",
                part))
        # Only a task that has dependents needs its own count (a recursive query each).
        dependents = {row["id"]: active_downstream(conn, row["id"]) if row["seq"] in with_dependents else 0
                      for row in found}
        _transition(conn, found, TaskStatus.CANCELLED, now=now, snapshots=False,
                    fields={"error": reason, "error_type": models.CANCELLED})
    return dependents
