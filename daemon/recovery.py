"""Startup recovery (SPEC §9); recreating what a restart interrupted is `daemon.retry`'s.

Rules, in order, before the daemon answers any request or claims anything:

1. Snapshot the tasks a previous supervisor left in flight (`running` and `claimed`).
2. Find their executor processes by recorded pid *and* process start time (a reused pid of an
   unrelated process never matches) and end them with their whole process tree: a leftover
   executor must not keep writing outputs the new session will produce again.
3. `running` → failed (INTERRUPTED): whether it finished its side effects is unknown, so it is
   not silently re-run. `claimed` → pending: it never started, so it simply runs again; unless
   it has a recorded executor process: then it was sent ahead (a queue's prefetch, SPEC §15) to
   a process that may have started it, and it is failed (INTERRUPTED) as a running one is.
4. One restart-log row per task of the snapshot under a new session id. A row of an earlier
   session stays awaiting review until a user acts on it, unless this session logs its task again
   (it is then `superseded`). Pending tasks are not logged: a restart does not touch them, so
   there is nothing to review.
5. Active tasks whose workflow run does not exist → failed (ORPHANED).
6. Every non-terminal run is recomputed from its tasks.
7. Once that is committed, the executors' `on_task_failed` runs for the tasks failed in step 3
   (`undo_interrupted`): a permanent failure like any other, whose side effects are theirs to undo.

Steps 3 to 6 are one transaction: a crash during recovery leaves the database as it was.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from typing import Sequence

import structlog

from daemon import outcomes, processes
from daemon.models import Task
from daemon.store import db, restarts, runs
from daemon.store import recovery as recovery_store
from executors.registry import Registry

log = structlog.get_logger("fredica.recovery")


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    session_id: str
    interrupted_tasks: tuple[Task, ...]  # failed as INTERRUPTED, for their executors' on_task_failed
    requeued: int
    orphaned: int
    leftover_processes: int
    runs_reconciled: int

    @property
    def interrupted(self) -> int:
        return len(self.interrupted_tasks)


def recover(
    conn: sqlite3.Connection, *, now: float, kill_grace: float = 5.0, supervisor: str | None = None
) -> RecoveryReport:
    """Bring the database and the process table back to a clean state after a previous session.
    `supervisor`: only the tasks this supervisor left (a shared PostgreSQL queue, SPEC §16, whose
    other supervisors run theirs); None, every task (the one daemon of a SQLite file)."""
    session_id = str(uuid.uuid4())
    in_flight = recovery_store.in_flight(conn, supervisor=supervisor, unnamed=True)
    leftovers = []
    for task in in_flight:
        if task.executor_pid is not None and task.executor_started_at is not None:
            process = processes.find_leftover(task.executor_pid, task.executor_started_at)
            if process is not None:
                leftovers.append(process)
                log.warning("leftover_executor", task_id=task.id, run_id=task.workflow_run_id, pid=process.pid)
    killed = processes.end_process_trees(leftovers, kill_grace)
    with db.write(conn):
        runs.lock_counters(conn)
        interrupted = recovery_store.fail_interrupted(conn, now=now, supervisor=supervisor, unnamed=True)
        requeued = recovery_store.requeue_claimed(conn, now=now, supervisor=supervisor, unnamed=True)
        restarts.record(conn, session_id, in_flight, now=now)
        orphaned = recovery_store.fail_orphans(conn, now=now)
        reconciled = runs.reconcile_non_terminal(conn, now=now)
    report = RecoveryReport(
        session_id=session_id,
        interrupted_tasks=tuple(interrupted),
        requeued=len(requeued),
        orphaned=len(orphaned),
        leftover_processes=killed,
        runs_reconciled=len(reconciled),
    )
    log.info("recovery_finished", session_id=session_id, interrupted=report.interrupted, requeued=report.requeued,
             orphaned=report.orphaned, leftover_processes=killed, runs_reconciled=report.runs_reconciled)
    return report


def undo_interrupted(registry: Registry, interrupted: Sequence[Task]) -> None:
    """Call the executors' on_task_failed for the tasks recovery failed as INTERRUPTED: a
    permanent failure like any other (SPEC §8), whose side effects (a partial file) are theirs to
    undo. Once recovery is committed, before the loop runs."""
    for task in interrupted:
        executor = registry.get(task.type)
        if executor is not None:
            outcomes.failure_hook(executor, task)()

