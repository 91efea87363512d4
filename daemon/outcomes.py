"""Recording how an attempt ended (SPEC §6): completed, retried, failed or cancelled.

An attempt's log ends with its own line on how it ended (executors.endpoint), unless it died or
was killed first, or its result is refused here: the supervisor then adds one (`note_ending`).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Callable, Sequence

import structlog

from daemon import models, scheduler
from daemon.config import Settings
from daemon.models import Task, TaskStatus
from daemon.engine.attempt import Attempt, Phase
from daemon.engine.executor_processes import describe_exit
from daemon.scheduler import Action
from daemon.store import cancels, tasks
from executors.base import BadResult, ExecuteResult, TaskExecutor, stored_result
from executors import tasklog
from executors.output import AttemptOutput

log = structlog.get_logger("fredica.supervisor")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What `record` wrote: the terminal status reached (None: retried), and the executor's
    `on_task_failed` hook to call once that is committed (None: nothing to undo)."""

    finished: TaskStatus | None
    hook: Callable[[], None] | None = None
    retried: bool = False  # put back to pending, not before its backoff delay


def record_attempt(conn: sqlite3.Connection, settings: Settings, at: Attempt, now: float) -> Recorded:
    """SPEC §6 for an attempt that is over; at shutdown, an unfinished attempt's task is put back."""
    result = at.result
    succeeded = result is not None and result.ok
    if at.stop_reason == "shutdown" and not succeeded:
        # A task its user had paused is not to run again unasked: it comes back held (SPEC §14).
        # One that paused itself (its executor asked) runs again, and asks again if it must.
        held = at.paused_by_user_at_stop
        tasks.requeue(conn, at.task.id, now=now, known=at.task, hold=held)
        at.log.info("task_interrupted", by="shutdown", held=held)
        outcome = "put back held (paused by user): `fredica release` runs it" if held else (
            "put back, it runs again after the next start")
        note_ending(settings, at, None, outcome)
        return Recorded(None)
    if at.stop_reason == "timeout" and not succeeded:
        error, error_type = f"timed out after {at.task.timeout:g} s", models.TIMEOUT
    elif at.stop_reason == "cancel" and not succeeded:
        error, error_type = "cancelled by user", models.CANCELLED
    elif result is None and at.send_error is not None:
        error, error_type = f"the task could not be sent to its executor process: {at.send_error}", models.CRASHED
    elif result is None and at.process.status.oversized is not None:
        # Refused at its header (the channel is then closed, and the attempt ended).
        error = (f"the executor sent a message of {at.process.status.oversized} bytes, more than a result "
                 f"may take (max_result_bytes: {settings.max_result_bytes})")
        error_type = models.BAD_RESULT
    elif result is None:
        error = f"executor process died without a result ({describe_exit(at.exitcode)})"
        # The task's own log: the process may have died before it was even given the task.
        last_lines = tasklog.tail(settings.task_log(at.task.id), 20)
        if last_lines:
            error += "\n" + last_lines
        error_type = models.CRASHED
    elif succeeded:
        # Checked here too: the executor process checks its own result, but anything may arrive.
        try:
            result = ExecuteResult(result=stored_result(result.result, settings.max_result_bytes))
            error, error_type = None, None
        except BadResult as exc:
            error, error_type = str(exc), models.BAD_RESULT
    else:
        error, error_type = result.error or result.error_type, result.error_type or models.EXCEPTION
    recorded = record(conn, settings, at.task, at.executor, error, error_type, now, result)
    refused = error if error_type == models.BAD_RESULT and succeeded else None
    if recorded.retried:
        outcome = f"{error_type}: retried"
    else:
        outcome = f"{error_type}: {recorded.finished}" if error_type else str(recorded.finished)
    note_ending(settings, at, refused, outcome)
    return recorded


def completes(at: Attempt) -> bool:
    """Whether the attempt is one `record_completions` records: started, and its result a success
    (which stands whatever stop was asked: `record_attempt` completes it too)."""
    return at.start_recorded and at.result is not None and at.result.ok


def record_completions(
    conn: sqlite3.Connection, settings: Settings, ended: Sequence[Attempt], now: float
) -> list[Attempt]:
    """SPEC §6 for many attempts that ended at `now` with a success (`completes`), in one write:
    those whose results are refused here are left, with nothing written, for `record_attempt`.
    The attempts recorded completed. InvalidTransition, with nothing written, if a row moved on."""
    kept: list[tuple[Attempt, Any]] = []
    for at in ended:
        assert at.result is not None and at.ended_at == now
        try:
            kept.append((at, stored_result(at.result.result, settings.max_result_bytes)))
        except BadResult:
            continue  # failed by `record_attempt`, which says why in the attempt's log
    tasks.complete_many(conn, [(at.task, result) for at, result in kept], now=now)
    for at, _ in kept:
        log.info("task_completed", task_id=at.task.id, run_id=at.task.workflow_run_id, type=at.task.type)
    return [at for at, _ in kept]


def note_ending(settings: Settings, at: Attempt, refused: str | None, outcome: str) -> None:
    """Add the supervisor's line to the attempt's log if the attempt could not write its own last
    line (it ended without a result: killed, crashed) or its result was `refused` here; once."""
    if at.ending_noted or (at.result is not None and refused is None):
        return
    at.ending_noted = True
    if refused is not None:
        what = f"the result was refused ({refused})"
    elif at.send_error is not None:
        what = f"the task could not be sent to its executor process ({at.send_error})"
    else:
        exit = describe_exit(at.exitcode)
        timeout = f" ({at.task.timeout:g} s)" if at.task.timeout is not None else ""
        causes = {"cancel": "the user's cancel", "timeout": f"its timeout{timeout}", "shutdown": "the daemon's shutdown"}
        cause = causes.get(at.stop_reason) if at.stop_reason is not None else None
        if at.process.status.oversized is not None:
            what = f"the attempt was ended: it sent a message of {at.process.status.oversized} bytes ({exit})"
        elif cause is None:
            what = f"the attempt's process died without a result ({exit})"
        elif at.reached(Phase.KILLED):
            what = f"the attempt was killed after {cause}, which neither the cancel nor SIGTERM ended ({exit})"
        elif at.reached(Phase.TERMINATED):
            what = f"the attempt was ended with SIGTERM after {cause} ({exit})"
        else:
            what = f"the attempt ended without a result after {cause} ({exit})"
    AttemptOutput.append_line(settings.task_log(at.task.id), "WARNING", f"supervisor: {what}; {outcome}")


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
            return Recorded(TaskStatus.COMPLETED)
        except (TypeError, ValueError) as exc:
            outcome = scheduler.Outcome(Action.FAIL, f"the result cannot be stored as JSON: {exc}", models.BAD_RESULT)
    if outcome.action is Action.RETRY:
        tasks.retry(
            conn, task.id, error=outcome.error or "", error_type=outcome.error_type or models.EXCEPTION,
            not_before=now + outcome.retry_delay, now=now, known=task,
        )
        bound.info("task_retrying", error_type=outcome.error_type, delay=outcome.retry_delay,
                   retry=task.retry_count + 1, max_retries=task.max_retries)
        return Recorded(None, retried=True)
    if outcome.action is Action.CANCEL:
        ended = cancels.cancel(conn, task.id, now=now, reason=outcome.error or "cancelled", known=task)
        finished = TaskStatus.CANCELLED
        bound.info("task_cancelled")
    else:
        ended = tasks.fail(
            conn, task.id, error=outcome.error or "", error_type=outcome.error_type or models.EXCEPTION,
            now=now, known=task,
        )
        finished = TaskStatus.FAILED
        bound.warning("task_failed", error_type=outcome.error_type, error=outcome.error)
    if executor is None:
        return Recorded(finished)
    return Recorded(finished, failure_hook(executor, ended))


def failure_hook(executor: TaskExecutor, ended: Task) -> Callable[[], None]:
    """The executor's `on_task_failed` for `ended` (failed or cancelled for good), to call once
    that is committed; what it raises, even SystemExit, is logged."""
    result = ExecuteResult(error=ended.error, error_type=ended.error_type)

    def hook() -> None:
        try:
            executor.on_task_failed(ended, result)
        except (Exception, SystemExit):  # executor code: even sys.exit() must not end the loop
            log.exception("on_task_failed_failed", task_id=ended.id, run_id=ended.workflow_run_id, type=ended.type)

    return hook
