"""Submitting a workflow run with its tasks: validation against stored tasks, idempotency, edges.

Part of the task repository (`tasks` re-exports `submit`), kept apart because it is the one path
that inserts tasks; everything else there changes tasks that exist.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid
from typing import Mapping, Sequence

from daemon.errors import AmbiguousId, IdTooShort, SubmissionRefused, UnknownTask
from daemon.models import TaskStatus
from daemon.store import backend, runs, statuses
from daemon.store import ids as id_store
from daemon.store.db import write
from daemon.submission import TaskSpec, resolve_batch

# A dependency in one of these can never complete: a task depending on it is cancelled at once
# rather than refused, so what a script sees never depends on how fast its upstream failed.
DEAD = (TaskStatus.FAILED, TaskStatus.CANCELLED)
DEFAULT_QUEUE = "default"
# One text each, built once: SQLite's statement cache is keyed by the text, so every submission
# reuses the prepared statement.
INSERT_TASK = f"""
    INSERT INTO task (id, type, workflow_run_id, material_id, status, priority, depends_on,
        payload, payload_refs, idempotency_key, max_retries, timeout, unmet_deps, queue,
        queue_explicit, is_held, created_at)
    VALUES (?, ?, ?, ?, {statuses.PENDING}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ({statuses.ACTIVE}) DO NOTHING
    RETURNING seq
"""
INSERT_DEPENDENCY = "INSERT OR IGNORE INTO task_dependency (depends_on_seq, task_seq) VALUES (?, ?)"


@dataclasses.dataclass(frozen=True)
class SubmittedTask:
    """One spec's outcome: the id it resolved to, and whether a new task was stored for it."""

    id: str
    created: bool


@dataclasses.dataclass(frozen=True)
class Submission:
    """The outcome of a submission; `run_id` is None when every spec was a duplicate."""

    run_id: str | None
    tasks: tuple[SubmittedTask, ...]
    # How many of the new tasks a claim can take at once (no dependency left to end, not held):
    # with none, a submission gives the scheduler nothing to do until something else happens.
    startable: int = 0


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """What `insert_run` stored, and the new tasks that can never run: each with the dependency
    that had already failed or been cancelled, for the caller to cancel in the same transaction."""

    submission: Submission
    doomed: tuple[tuple[str, str], ...]


def insert_run(
    conn: sqlite3.Connection,
    specs: Sequence[TaskSpec],
    *,
    now: float,
    template: str = "adhoc",
    material_id: str | None = None,
    routes: Mapping[str, str] | None = None,
) -> StoredRun:
    """Insert a workflow run with `specs` as its tasks, all pending (SPEC §5, §10); the caller's
    transaction (`tasks.submit`) cancels the doomed ones.

    Each task's queue is the spec's own, else its type's in `routes` (task type → queue), else
    `default`: checking that a named queue exists is the caller's (the store knows no config).

    A spec whose idempotency key is held by an active task is not stored: it resolves to that task,
    and later specs depending on it depend on that task. Anything invalid refuses the whole batch.
    """
    resolved = resolve_batch(specs)
    with write(conn):
        full, external = _lookup_dependencies(conn, {d.task_id for deps in resolved for d in deps if d.task_id})
        if any(given != whole for given, whole in full.items()):  # a prefix: stored as the whole id
            resolved = [[dataclasses.replace(d, task_id=full[d.task_id]) if d.task_id else d for d in deps]
                        for deps in resolved]
        # Counted as if every spec made a task (the common case: no statement to count them after);
        # corrected below when some resolved to active tasks instead.
        run_id = runs.create(conn, template=template, material_id=material_id, now=now, tasks=len(specs))
        outcomes: list[SubmittedTask] = []
        doomed: list[tuple[str, str]] = []
        startable = 0
        # (seq, status) of each spec's task, for dependencies inside the batch.
        batch: list[tuple[int, TaskStatus]] = []
        for spec, deps in zip(specs, resolved):
            # Two references can name one task (an earlier line's key and its id, or a line that
            # resolved to an existing task and that task's id): it is one dependency.
            by_id: dict[str, tuple[int, TaskStatus]] = {}
            for d in deps:
                if d.task_id is None:
                    by_id.setdefault(outcomes[d.batch_index].id, batch[d.batch_index])
                else:
                    by_id.setdefault(d.task_id, external[d.task_id])
            # A payload that names dependencies by position ("{@1.output}") keeps them as listed,
            # repeats included (two template tasks merged into one by idempotency key), so that
            # no position shifts; any other task lists each once.
            listed = [outcomes[d.batch_index].id if d.task_id is None else d.task_id for d in deps]
            depends_on = listed if spec.payload_refs else list(by_id)
            queue = spec.queue or (routes or {}).get(spec.type, DEFAULT_QUEUE)
            inserted = _insert(conn, spec, run_id, list(by_id.values()), depends_on, material_id, queue, now)
            if inserted is None:
                existing = _active_with_key(conn, spec.idempotency_key)
                outcomes.append(SubmittedTask(existing["id"], created=False))
                batch.append((existing["seq"], TaskStatus(existing["status"])))
            else:
                outcomes.append(SubmittedTask(inserted[1], created=True))
                batch.append((inserted[0], TaskStatus.PENDING))
                startable += not spec.hold and all(status is TaskStatus.COMPLETED for _, status in by_id.values())
                dead = next((i for i, (_, status) in by_id.items() if status in DEAD), None)
                if dead is not None:
                    # Stored, then cancelled by the caller: its batch dependents go with it, by
                    # the cascade of that transition.
                    doomed.append((inserted[1], dead))
        created = sum(o.created for o in outcomes)
        if not created:
            runs.delete_empty(conn, run_id)
        elif created < len(specs):
            runs.add_tasks(conn, run_id, created - len(specs), now)
    return StoredRun(Submission(run_id if created else None, tuple(outcomes), startable), tuple(doomed))


def _lookup_dependencies(
    conn: sqlite3.Connection, given: set[str]
) -> tuple[dict[str, str], dict[str, tuple[int, TaskStatus]]]:
    """The stored tasks that dependencies name: each id as given → the task's full id (a unique
    prefix resolved, SPEC §14), and each full id → its (seq, status). Refused in one line when
    one names no task, or is an ambiguous prefix."""
    found = {row["id"]: (row["seq"], TaskStatus(row["status"])) for row in _rows_with_ids(conn, given)}
    full = {task_id: task_id for task_id in found}
    for task_id in sorted(given - set(found)):  # not a whole id: a prefix, or nothing
        try:
            full[task_id] = id_store.task_id(conn, task_id)
        except (UnknownTask, IdTooShort):
            raise SubmissionRefused(f"unknown dependency {task_id}: no task or earlier line has that id or key") from None
        except AmbiguousId as exc:
            raise SubmissionRefused(f"dependency {exc.message}") from None
    found.update((row["id"], (row["seq"], TaskStatus(row["status"])))
                 for row in _rows_with_ids(conn, set(full.values()) - set(found)))
    return full, found


def _rows_with_ids(conn: sqlite3.Connection, task_ids: set[str]) -> list[sqlite3.Row]:
    ids, rows = sorted(task_ids), []
    for start in range(0, len(ids), 500):  # stay below SQLite's bound-parameter limit
        chunk = ids[start : start + 500]
        # Locked on PostgreSQL: a dependency completing meanwhile would unblock its dependents
        # before this one's edge exists, and leave it waiting forever.
        sql = f"SELECT id, seq, status FROM task WHERE id IN ({', '.join('?' * len(chunk))}){backend.for_share(conn)}"
        rows += conn.execute(sql, chunk)
    return rows


def _insert(
    conn: sqlite3.Connection,
    spec: TaskSpec,
    run_id: str,
    upstream: list[tuple[int, TaskStatus]],
    upstream_ids: list[str],
    run_material_id: str | None,
    queue: str,
    now: float,
) -> tuple[int, str] | None:
    """Insert one task; None when an active task holds its idempotency key."""
    task_id = spec.id or str(uuid.uuid4())
    unmet = sum(status is not TaskStatus.COMPLETED for _, status in upstream)
    try:
        row = conn.execute(
            INSERT_TASK,
            (
                task_id,
                spec.type,
                run_id,
                spec.material_id or run_material_id,
                spec.priority,
                json.dumps(upstream_ids),
                json.dumps(spec.payload),
                int(spec.payload_refs),
                spec.idempotency_key,
                spec.max_retries,
                spec.timeout,
                unmet,
                queue,
                int(spec.queue is not None),
                int(spec.hold),
                now,
            ),
        ).fetchone()
    except sqlite3.IntegrityError as exc:
        raise SubmissionRefused(f"task id {task_id} is already taken") from exc
    if row is None:
        return None
    seq = row[0]
    if len(upstream) == 1:  # the common case, without executemany's own statement setup
        conn.execute(INSERT_DEPENDENCY, (upstream[0][0], seq))
    elif upstream:
        conn.executemany(INSERT_DEPENDENCY, [(up_seq, seq) for up_seq, _ in upstream])
    return seq, task_id


def _active_with_key(conn: sqlite3.Connection, key: str | None) -> sqlite3.Row:
    row = conn.execute(
        f"SELECT id, seq, status FROM task WHERE idempotency_key = ? AND status IN ({statuses.ACTIVE})",
        (key,),
    ).fetchone()
    assert row is not None, "the insert conflicted, so an active task holds the key"
    return row
