"""Recording how an attempt ended (SPEC §6): completed, retried, failed or cancelled."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Callable

import structlog

from daemon import models, scheduler
from daemon.config import Settings
from daemon.models import Task
from daemon.scheduler import Action
from daemon.store import tasks
from executors.base import ExecuteResult, TaskExecutor

log = structlog.get_logger("fredica.supervisor")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What `record` wrote: the terminal status reached (None: retried), and the executor's
    `on_task_failed` hook to call once that is committed (None: nothing to undo)."""

    finished: str | None
    hook: Callable[[], None] | None = None
    retried: bool = False  # put back to pending, not before its backoff delay


def record(
    conn: sqlite3.Connection,
    settings: Settings,
    task: Task,
    executor: TaskExecutor | None,
    error: str | None,
    error_type: str | None,
    now: float,
    result: ExecuteResult | None = None,
) -> Recorded:
    """Apply SPEC §6 to an attempt of `task` (the supervisor's snapshot of it, running) that ended
    with `error`/`error_type` (None: success, with `result`)."""
    bound = log.bind(task_id=task.id, run_id=task.workflow_run_id, type=task.type)
    outcome = scheduler.decide_outcome(
        error,
        error_type,
        retry_count=task.retry_count,
        max_retries=task.max_retries,
        backoff_base=settings.backoff_base,
        backoff_max=settings.backoff_max,
    )
    if outcome.action is Action.COMPLETE:
        try:
            tasks.complete(conn, task.id, result.result if result else None, now=now, known=task)
            bound.info("task_completed")
            return Recorded("completed")
        except (TypeError, ValueError) as exc:
            outcome = scheduler.Outcome(Action.FAIL, f"the result cannot be stored as JSON: {exc}", models.EXCEPTION)
    if outcome.action is Action.RETRY:
        tasks.retry(
            conn, task.id, error=outcome.error or "", error_type=outcome.error_type or models.EXCEPTION,
            not_before=now + outcome.retry_delay, now=now, known=task,
        )
        bound.info("task_retrying", error_type=outcome.error_type, delay=outcome.retry_delay,
                   retry=task.retry_count + 1, max_retries=task.max_retries)
        return Recorded(None, retried=True)
    if outcome.action is Action.CANCEL:
        ended = tasks.cancel(conn, task.id, now=now, reason=outcome.error or "cancelled")
        finished = "cancelled"
        bound.info("task_cancelled")
    else:
        ended = tasks.fail(
            conn, task.id, error=outcome.error or "", error_type=outcome.error_type or models.EXCEPTION,
            now=now, known=task,
        )
        finished = "failed"
        bound.warning("task_failed", error_type=outcome.error_type, error=outcome.error)
    if executor is None:
        return Recorded(finished)
    hook_result = ExecuteResult(error=outcome.error, error_type=outcome.error_type)

    def hook() -> None:
        try:
            executor.on_task_failed(ended, hook_result)
        except Exception:
            bound.exception("on_task_failed_failed")

    return Recorded(finished, hook)
