"""The supervisor's view of one running attempt: its process, its timers and its stop escalation.

No database here: the supervisor records what these objects decide.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import structlog

from daemon import children
from daemon.models import Task
from executors import channel
from executors.base import ExecuteResult, TaskExecutor

log = structlog.get_logger("fredica.supervisor")


@dataclasses.dataclass
class RunningTask:
    """A task whose executor process is alive (or has just ended and is being finished)."""

    task: Task
    child: children.ExecutorProcess
    executor: TaskExecutor
    started_at: float
    result: ExecuteResult | None = None
    attempt_exitcode: int | None = None  # a launcher's attempt: its fork's exit status, once exited
    progress: tuple[int, str | None] | None = None  # latest value not yet written
    progress_written_at: float = 0.0
    stop_reason: str | None = None  # "cancel", "timeout" or "shutdown"
    stop_requested_at: float | None = None
    terminated_at: float | None = None
    killed: bool = False
    paused_since: float | None = None
    paused_by: str | None = None  # "user" or "executor" (its own request_pause)
    paused_seconds: float = 0.0
    ending_noted: bool = False  # the supervisor's line on how it ended is in the task's log
    # The task row's is_paused, is_pausable and progress mirror this memory: the loop writes them
    # when `mirror_dirty` (at once for a pause, every progress_interval for progress), and all of
    # them again after a tick whose writes were rolled back.
    pausable: bool = False
    mirror_dirty: bool = False
    last_progress: tuple[int, str | None] | None = None  # latest value, written or not
    ended_at: float | None = None  # when the loop found the attempt over (its outcome's time)

    @property
    def log(self) -> Any:
        return log.bind(task_id=self.task.id, run_id=self.task.workflow_run_id, type=self.task.type)

    def active_seconds(self, now: float) -> float:
        """Seconds the task has run, not counting time spent paused (timeouts use this)."""
        paused = self.paused_seconds + (now - self.paused_since if self.paused_since is not None else 0.0)
        return now - self.started_at - paused

    def note_paused(self, now: float, by: str) -> None:
        if self.paused_since is None:
            self.paused_since, self.paused_by = now, by
            self.mirror_dirty = True

    def note_resumed(self, now: float) -> None:
        if self.paused_since is not None:
            self.paused_seconds += now - self.paused_since
            self.paused_since = self.paused_by = None
            self.mirror_dirty = True

    def set_pausable(self, pausable: bool) -> None:
        if pausable != self.pausable:
            self.pausable, self.mirror_dirty = pausable, True

    def note_progress(self, percent: int, text: str | None) -> None:
        self.progress = self.last_progress = (percent, text)

    def mirror_lost(self) -> None:
        """The tick that wrote this attempt's mirror was rolled back: write all of it again."""
        self.mirror_dirty = True
        if self.progress is None:
            self.progress = self.last_progress

    @property
    def channel_open(self) -> bool:
        """More may still be read from the attempt's status channel."""
        return not self.child.status.closed

    def reusable(self) -> bool:
        """The attempt is over and its process takes another: a launcher whose fork has sent its
        result or exited, or (tasks_per_process > 1) a process that reported a result and was
        not told it was its last attempt."""
        if self.child.fork_each:
            # Over once the fork has sent its result (its exit then follows, reported later) or
            # has exited. Stop escalation signals the fork's tree, never the launcher: it stays
            # usable, and takes its next task once it has reported that exit (`settled`).
            over = self.finishing()
        else:
            # A SIGTERMed process may be on its way out.
            over = self.result is not None and not self.child.last and self.terminated_at is None
        return over and self.channel_open and not self.child.ending and self.child.is_alive()

    def finishing(self) -> bool:
        """The attempt has reported its result or its process has exited: it is being finished."""
        return self.result is not None or self.attempt_exitcode is not None

    def exit_status(self) -> int | None:
        """How the attempt's process ended: the launcher's fork, else the executor process."""
        return self.attempt_exitcode if self.attempt_exitcode is not None else self.child.exitcode

    def attempt_over(self) -> bool:
        """True once the attempt's outcome is known: its result has come or its process has exited
        (a launcher's fork, or the executor process)."""
        if self.child.fork_each and self.attempt_exitcode is not None:
            return True
        return self.reusable() or self.has_exited()

    def has_exited(self) -> bool:
        """True once the executor process has ended and been reaped."""
        if not self.child.is_alive():
            return True
        if not self.child.sentinel_exact and channel.poll_now(self.child.sentinel):
            # A spawned child's sentinel fires a moment before it can be reaped (it is still in its
            # exit path): wait for it here rather than spin the loop until then. A fork-server
            # child's fires only once it has been reaped, which is_alive has just said it has not.
            self.child.reap(0.1)
            return not self.child.is_alive()
        return False

    def escalate(self, now: float, grace: float) -> None:
        """After a stop request: SIGTERM the process tree `grace` seconds later, SIGKILL as long after."""
        if self.stop_requested_at is None:
            return
        if self.terminated_at is None and now >= self.stop_requested_at + grace:
            self.log.warning("executor_terminated", after=grace)
            self.child.terminate_tree()
            self.terminated_at = now
        elif self.terminated_at is not None and not self.killed and now >= self.terminated_at + grace:
            self.log.warning("executor_killed", after=grace)
            self.child.kill_tree()
            self.killed = True

    def deadlines(self, now: float, progress_interval: float, grace: float) -> list[float]:
        """When the loop must look at this task again (progress flush, escalation, timeout)."""
        due = []
        if self.progress is not None:
            due.append(self.progress_written_at + progress_interval)
        if self.stop_requested_at is not None and not self.killed:
            base = self.terminated_at if self.terminated_at is not None else self.stop_requested_at
            due.append(base + grace)
        elif self.task.timeout is not None and self.paused_since is None:
            due.append(now + self.task.timeout - self.active_seconds(now))
        return due


def log_level(name: Any) -> int:
    """The logging level an executor's forwarded log line names (INFO if it names none)."""
    level = logging.getLevelName(str(name).upper()) if name is not None else logging.INFO
    return level if isinstance(level, int) else logging.INFO
