"""Startup recovery (SPEC §9), and recreating what a restart interrupted.

Rules, in order, before the daemon answers any request or claims anything:

1. Snapshot the tasks a previous supervisor left in flight (`running` and `claimed`).
2. Find their executor processes by recorded pid *and* process start time (a reused pid of an
   unrelated process never matches) and end them with their whole process tree: a leftover
   executor must not keep writing outputs the new session will produce again.
3. `running` → failed (INTERRUPTED): whether it finished its side effects is unknown, so it is
   not silently re-run. `claimed` → pending: it never started, so it simply runs again.
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
from typing import Collection, Mapping, Sequence

import structlog

from daemon import models, outcomes, processes
from daemon.errors import FredicaError
from daemon.models import Task, TaskStatus
from daemon.store import db, restarts, runs, tasks
from daemon.submission import TaskSpec
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


def recover(conn: sqlite3.Connection, *, now: float, kill_grace: float = 5.0) -> RecoveryReport:
    """Bring the database and the process table back to a clean state after a previous session."""
    session_id = str(uuid.uuid4())
    in_flight = tasks.list_tasks(conn, status=[TaskStatus.RUNNING.value, TaskStatus.CLAIMED.value])
    leftovers = []
    for task in in_flight:
        if task.executor_pid is not None and task.executor_started_at is not None:
            process = processes.find_leftover(task.executor_pid, task.executor_started_at)
            if process is not None:
                leftovers.append(process)
                log.warning("leftover_executor", task_id=task.id, run_id=task.workflow_run_id, pid=process.pid)
    killed = processes.end_process_trees(leftovers, kill_grace)
    with db.write(conn):
        interrupted = tasks.fail_interrupted(conn, now=now)
        requeued = tasks.requeue_claimed(conn, now=now)
        restarts.record(conn, session_id, in_flight, now=now)
        orphaned = tasks.fail_orphans(conn, now=now)
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


def recreate(
    conn: sqlite3.Connection,
    entry_id: int,
    *,
    now: float,
    routes: Mapping[str, str] | None = None,
    queue_names: Collection[str] = ("default",),
) -> tasks.Submission:
    """A new workflow run with a copy of an interrupted task and of the tasks its failure cancelled.

    The copies keep type, payload, priority, retries, timeout, idempotency key and a queue their
    submitter named, if it is still in `queue_names` (else they go by `routes`); dependencies on
    tasks outside the copy stay as they were (they had completed, or the task could not have run),
    dependencies among the copies point at the copies. The log entry becomes `recreated`.
    """
    with db.write(conn):
        entry = restarts.get(conn, entry_id)
        if entry.disposition != restarts.PENDING_REVIEW:
            raise FredicaError(f"restart-log entry {entry_id} is already {entry.disposition}")
        original = tasks.get(conn, entry.task_id)
        if not original.status.is_terminal:
            raise FredicaError(
                f"task {original.id} is {original.display_status} again and will run: nothing to recreate"
            )
        copies = [original] + [
            t for t in tasks.downstream(conn, original.id)
            if t.status is TaskStatus.CANCELLED and t.error_type == models.DEPENDENCY_FAILED
        ]
        included: list[Task] = []
        included_ids: set[str] = set()
        for t in copies:  # in submission order, so a task's upstream copies are decided first
            if t is original or all(dep in included_ids or _usable(conn, dep) for dep in t.depends_on):
                included.append(t)
                included_ids.add(t.id)
        specs = [
            TaskSpec(
                type=t.type,
                payload=t.payload,
                priority=t.priority,
                # The copies' keys are the originals' ids, so a dependency on a copied task
                # resolves to its copy inside the batch.
                depends_on=t.depends_on,
                max_retries=t.max_retries,
                idempotency_key=t.idempotency_key,
                material_id=t.material_id,
                timeout=t.timeout,
                key=t.id,
                payload_refs=t.payload_refs,
                queue=t.queue if t.queue_explicit and t.queue in queue_names else None,
            )
            for t in included
        ]
        run = runs.find(conn, original.workflow_run_id)
        submission = tasks.submit(
            conn,
            specs,
            now=now,
            template=run.template if run else "adhoc",
            material_id=run.material_id if run else original.material_id,
            routes=routes,
        )
        restarts.resolve(conn, entry_id, "recreated", now=now, new_run_id=submission.run_id)
    log.info("restart_entry_recreated", entry_id=entry_id, task_id=original.id, run_id=submission.run_id,
             tasks=len(specs))
    return submission


def _usable(conn: sqlite3.Connection, task_id: str) -> bool:
    """Whether a task outside the copy can still be depended on (it did not fail or get cancelled)."""
    task = tasks.find(conn, task_id)
    return task is not None and task.status not in (TaskStatus.FAILED, TaskStatus.CANCELLED)
