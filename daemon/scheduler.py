"""Pure scheduling decisions: no I/O, no clock reads. The store and the supervisor apply them."""

from __future__ import annotations

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
