"""What the supervisor sends an executor process for one attempt: the `Assignment`.

Shared by both sides of the assignment pipe (daemon.engine.executor_processes sends it pickled; the executor
process, whatever its kind, receives it), so neither spells the message out positionally.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

if TYPE_CHECKING:
    from daemon.models import Task


class Limits(NamedTuple):
    """What one attempt may leave (SPEC §13): its result, as JSON, and its log, on disk."""

    result_bytes: int = 1024 * 1024
    log_bytes: int = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One attempt of one task, as its executor process receives it."""

    task: Task  # its payload with references to upstream results filled in
    executor_ref: str  # "module:Class" of the executor to run it with
    upstream: Mapping[str, Any]  # the results of the tasks it depends on, by task id
    log_path: str  # the task's log file, which the attempt appends to
    attempt: str  # names this attempt in control commands and (event-loop processes) messages
    last: bool = False  # the process's last attempt: it exits once this one has reported
    limits: Limits = Limits()
    # Event-loop processes only: seconds from a cancel command to the CancelledError of an attempt
    # that has not ended by itself. The supervisor fills it from its `cancel_grace` setting.
    cancel_grace: float = 5.0
    # Prefetch (SPEC §15), in a process that runs attempts one at a time. `prefetched`: sent ahead,
    # while the one before it runs: the process starts it on its own, saying {"type": "started",
    # "attempt"} before any executor code runs, unless a "revoke" command came first.
    # `prefetching`: its queue sends tasks ahead, so the process reads its control pipe the whole
    # time this attempt runs, to answer a revoke of the next one at once.
    # `after` (event-loop processes): the attempt this one follows, sent ahead; it starts once
    # that one is over (or at once if it is already).
    prefetched: bool = False
    prefetching: bool = False
    after: str | None = None
