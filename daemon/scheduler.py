"""Pure scheduling decisions: no I/O, no clock reads. The store and the supervisor apply them."""

from __future__ import annotations

import dataclasses
import enum

from daemon import models
from daemon.models import RunCounts, RunStatus


def run_status(counts: RunCounts) -> RunStatus:
    """A run's status from its tasks' statuses, in SPEC §4's order of precedence."""
    if counts.total == 0 or counts.failed:
        # A run without tasks can never finish; SPEC §4 fails it rather than leave it waiting forever.
        return RunStatus.FAILED
    if counts.completed == counts.total:
        return RunStatus.COMPLETED
    finished = counts.completed + counts.cancelled
    if counts.claimed or counts.running or (counts.pending and finished):
        return RunStatus.RUNNING
    if counts.pending == counts.total:
        return RunStatus.PENDING
    return RunStatus.CANCELLED


def is_retryable(error_type: str | None, retry_count: int, max_retries: int) -> bool:
    """Whether a failed attempt goes back to `pending` rather than ending the task (SPEC §6)."""
    return error_type not in models.NEVER_RETRIED and retry_count < max_retries


def retry_delay(retry_count: int, base: float, maximum: float) -> float:
    """Exponential backoff: `base` before the first retry, doubling each time, capped at `maximum`."""
    if base <= 0:
        return 0.0
    # Cap the exponent so a task with a huge max_retries cannot overflow the float.
    return min(maximum, base * 2.0 ** min(retry_count, 64))


class Action(enum.StrEnum):
    COMPLETE = "complete"
    CANCEL = "cancel"
    RETRY = "retry"
    FAIL = "fail"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What to do with a task whose attempt ended (SPEC §6)."""

    action: Action
    error: str | None = None
    error_type: str | None = None
    retry_delay: float = 0.0


def decide_outcome(
    error: str | None,
    error_type: str | None,
    *,
    retry_count: int,
    max_retries: int,
    backoff_base: float,
    backoff_max: float,
) -> Outcome:
    """The next step for an attempt that ended with `error`/`error_type` (both None: success)."""
    if error is None and error_type is None:
        return Outcome(Action.COMPLETE)
    error_type = error_type or models.EXCEPTION
    error = error or error_type
    if error_type == models.CANCELLED:
        return Outcome(Action.CANCEL, error, error_type)
    if is_retryable(error_type, retry_count, max_retries):
        delay = retry_delay(retry_count, backoff_base, backoff_max)
        return Outcome(Action.RETRY, error, error_type, delay)
    return Outcome(Action.FAIL, error, error_type)
