"""What happens to a claimed task before it is given a process (SPEC §6, §10): a type with no
executor fails, a payload whose references to upstream results cannot be filled in fails, and a
task its executor says it can skip completes at once. Only the tasks left get a process."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

import structlog

from daemon import models, outcomes, templates
from daemon.config import Settings
from daemon.models import Task
from daemon.outcomes import Recorded
from daemon.store import db, task_reads, tasks
from daemon.submission import SubmissionRefused
from executors.base import TaskExecutor
from executors.registry import Registry

log = structlog.get_logger("fredica.supervisor")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A claimed task that is to run: the payload its executor gets has its references to upstream
    results filled in."""

    task: Task
    executor: TaskExecutor
    upstream: dict[str, Any]


def prepare(
    conn: sqlite3.Connection, settings: Settings, registry: Registry, task: Task, now: float
) -> Prepared | Recorded:
    """The claimed `task`, ready to run, or how it ended at once (recorded as any outcome is:
    these errors are never retried, and the executor's on_task_failed runs after the commit).
    Only reads, but where it ends the task: each such write is undone whole if it fails."""
    bound = log.bind(task_id=task.id, run_id=task.workflow_run_id, type=task.type)
    executor = registry.get(task.type)
    if executor is None:
        error = f"no executor is registered for type {task.type}"
        with db.savepoint(conn):
            return outcomes.record(conn, settings, task, None, error, models.NO_EXECUTOR, now)
    upstream = task_reads.results_of(conn, task.depends_on)
    try:
        resolved = task
        if task.payload_refs:  # a template's task: only there is "{@0.output}" a placeholder
            resolved = task.but(payload=templates.resolve_results(task.payload, task.depends_on, upstream))
    except SubmissionRefused as exc:
        with db.savepoint(conn):
            return outcomes.record(conn, settings, task, executor, exc.message, models.PAYLOAD_ERROR, now)
    try:
        skip = bool(executor.can_skip(resolved))
    except (Exception, SystemExit):  # executor code: even sys.exit() must not end the loop
        bound.exception("can_skip_failed")  # then it runs: the executor itself reports what is wrong
        skip = False
    if skip:
        result = {**_skipped_fields(executor, resolved, bound), "skipped": True}
        with db.savepoint(conn):  # the line too: whatever raises after the write undoes it
            tasks.complete(conn, task.id, result, now=now, known=task)
            bound.info("task_skipped")
        return Recorded(models.TaskStatus.COMPLETED)
    return Prepared(resolved, executor, upstream)


def _skipped_fields(executor: TaskExecutor, task: Task, bound: Any) -> dict[str, Any]:
    """What the executor says a skipped task's result holds, if it is a JSON object; else nothing
    (the task is skipped all the same, with the bare `{"skipped": true}` of SPEC §6)."""
    try:
        fields = executor.skipped_result(task)
        if not isinstance(fields, dict):
            raise TypeError(f"skipped_result returned {type(fields).__name__}, not a dict")
        json.dumps(fields, allow_nan=False)  # it must be storable as the task's result
        return fields
    except (Exception, SystemExit):  # executor code: even sys.exit() must not end the loop
        bound.exception("skipped_result_failed")
        return {}
