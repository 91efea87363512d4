"""Running ended tasks again: a copy of each in a new workflow run, with the tasks its failure
cancelled (SPEC §14). `fredica retry` and `restarts recreate` both copy through `rerun`.

What is copied: each task given (a *root*), and every task downstream of it that was cancelled
because an upstream task failed (`DEPENDENCY_FAILED`, transitively). The roots of one original run
and their cascades become one new run (their union: no task is copied twice), wired as before:

- a dependency on a task that is copied too points at its copy;
- a dependency on a task outside the copy that completed (or has not ended yet) is kept: the copy
  depends on that very task, which the scheduler already sees as done (its result still reaches
  the copy's `ctx.upstream`, and a template's `{@N.output}` keeps its position);
- a dependency outside the copy that failed or was cancelled could never complete: a cascaded task
  with one is left out (another failure cancelled it too), a root with one is refused (`blocked`),
  since its copy would only be cancelled at once.

Copies keep type, payload, priority, max_retries, timeout, material, idempotency key, a queue their
submitter named (if it still exists; else they are routed by type), and the run's template and
material. The originals are terminal, so their idempotency keys are free again (SPEC §10); a copy
whose key an active task holds is not stored, and that task stands for it (`created=False`): also
when two copies of one request carry the same key.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Collection, Mapping, Sequence

from daemon import models
from daemon.models import Task, TaskStatus
from daemon.store import runs, tasks
from daemon.store.db import write
from daemon.store.submissions import SubmittedTask
from daemon.submission import TaskSpec

# Where no original task can be found any more (removed by a clean): it cannot be depended on.
GONE = "gone"


@dataclasses.dataclass(frozen=True)
class Rerun:
    """What `rerun` did, keyed by original task id."""

    copies: Mapping[str, SubmittedTask]  # every original copied → its copy (or the active task with its key)
    runs: Mapping[str, str | None]  # every original copied → the new run (None: no task of it was stored)
    cascaded: Mapping[str, tuple[str, ...]]  # each root copied → the originals its failure cancelled, copied too
    # Each root refused → (the task upstream of it whose end cancelled it, that task's status).
    blocked: Mapping[str, tuple[str, str]]


def cancelled_by_failure(task: Task) -> bool:
    """Whether `task` was cancelled because a task upstream of it failed or was cancelled."""
    return task.status is TaskStatus.CANCELLED and task.error_type == models.DEPENDENCY_FAILED


def rerun(
    conn: sqlite3.Connection,
    roots: Sequence[Task],
    *,
    now: float,
    routes: Mapping[str, str] | None = None,
    queue_names: Collection[str] = ("default",),
) -> Rerun:
    """Copy `roots` (ended tasks; the caller checks that they are) and the tasks their failure
    cancelled into new runs, one per original run, in the caller's transaction (see the module)."""
    copies: dict[str, SubmittedTask] = {}
    new_runs: dict[str, str | None] = {}
    cascaded: dict[str, tuple[str, ...]] = {}
    blocked: dict[str, tuple[str, str]] = {}
    by_run: dict[str, dict[str, Task]] = {}
    for root in roots:
        by_run.setdefault(root.workflow_run_id, {})[root.id] = root
    with write(conn):
        for run_id, group in by_run.items():
            below = {
                root_id: [t for t in tasks.downstream(conn, root_id) if cancelled_by_failure(t)] for root_id in group
            }
            candidates = dict(group)
            for found in below.values():
                candidates.update((t.id, t) for t in found)
            # In submission order, so that every dependency of a task is decided before the task.
            included: dict[str, Task] = {}
            for task in sorted(candidates.values(), key=lambda t: t.seq):
                if task.id in copies:
                    continue  # copied already, with the roots of another run
                dead = next(
                    (d for d in task.depends_on if d not in included and d not in copies and _dead(conn, d)), None
                )
                if dead is None:
                    included[task.id] = task
                elif task.id in group:
                    blocked[task.id] = _origin(conn, dead)
            if included:
                submission = _submit_copies(conn, list(included.values()), copies, run_id, now, routes, queue_names)
                for original, copy in zip(included, submission.tasks):
                    copies[original] = copy
                    new_runs[original] = submission.run_id
            for root_id, found in below.items():
                if root_id in copies:
                    cascaded[root_id] = tuple(t.id for t in found if t.id in included)
    # A root refused in its own run's turn may have come along with the roots of a later one.
    blocked = {root_id: dead for root_id, dead in blocked.items() if root_id not in copies}
    return Rerun(copies, new_runs, cascaded, blocked)


def _submit_copies(
    conn: sqlite3.Connection,
    originals: Sequence[Task],
    copied_before: Mapping[str, SubmittedTask],
    run_id: str,
    now: float,
    routes: Mapping[str, str] | None,
    queue_names: Collection[str],
) -> tasks.Submission:
    """Store copies of `originals` as one new run like the original `run_id`."""

    def upstream(dependency: str) -> str:
        # A task of another run copied by this same request: its copy, found by its id.
        copied = copied_before.get(dependency)
        return dependency if copied is None else copied.id

    specs = [
        TaskSpec(
            type=t.type,
            payload=t.payload,
            priority=t.priority,
            # Each copy's key is its original's id, so that a dependency on a copied task
            # resolves to its copy inside the batch; any other stays on the task it named.
            depends_on=tuple(upstream(d) for d in t.depends_on),
            max_retries=t.max_retries,
            idempotency_key=t.idempotency_key,
            material_id=t.material_id,
            timeout=t.timeout,
            key=t.id,
            payload_refs=t.payload_refs,
            queue=t.queue if t.queue_explicit and t.queue in queue_names else None,
        )
        for t in originals
    ]
    run = runs.find(conn, run_id)
    return tasks.submit(
        conn,
        specs,
        now=now,
        template=run.template if run else "adhoc",
        material_id=run.material_id if run else originals[0].material_id,
        routes=routes,
    )


def _origin(conn: sqlite3.Connection, task_id: str) -> tuple[str, str]:
    """(id, status) of the task whose failure (or cancel) reached `task_id`, a dependency that can
    never complete: itself, or, if a failure upstream cancelled it too, where that came from."""
    while True:
        task = tasks.find(conn, task_id)
        if task is None or not cancelled_by_failure(task):
            return task_id, GONE if task is None else task.status.value
        upstream = next((d for d in task.depends_on if _dead(conn, d)), None)
        if upstream is None:
            return task_id, task.status.value
        task_id = upstream


def _dead(conn: sqlite3.Connection, task_id: str) -> bool:
    """Whether a task can no longer complete: it failed, was cancelled, or is gone."""
    return _status(conn, task_id) in (TaskStatus.FAILED.value, TaskStatus.CANCELLED.value, GONE)


def _status(conn: sqlite3.Connection, task_id: str) -> str:
    task = tasks.find(conn, task_id)
    return GONE if task is None else task.status.value
