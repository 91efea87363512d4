"""One attempt of one task, as the supervisor sees it: its phases, its process, its timers.

An attempt moves through phases written down as data (`ADVANCES`), and only `Attempt._advance`
moves it, so an impossible combination (a result and a stop escalation going on, an attempt
ended twice) cannot be written down:

    ASSIGNED ─► RUNNING ─► STOPPING ─► TERMINATED ─► KILLED
                   │           │            │            │
                   └───────────┴─────┬──────┴────────────┘
                                     ▼
                        REPORTED ─► EXITED ─► ENDED
                            └──────────────────┘

An attempt sent ahead (a queue's prefetch, SPEC §15) begins before that, its task still `claimed`:

    PREFETCHED ─► REVOKING ─► EXITED (revoked, or its process died: it never ran)
        │  └────────┴──────► RUNNING (its process said "started")
        └──────────────────► EXITED

STOPPING, TERMINATED and KILLED are the stop's escalation (a cancel, a timeout or the shutdown,
then SIGTERM and SIGKILL of the attempt's process tree, each `cancel_grace` later). REPORTED: its
result came. EXITED: its process (a launcher's fork) exited, so nothing more can come. ENDED: the
loop concluded it and released its process; its outcome is recorded, or waits to be
(`Supervisor.unrecorded`). Pausing is not a phase: a running attempt is paused or not
(`paused_since`), and the task row mirrors that.

No database here: the supervisor records what these objects decide.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any

import structlog

from daemon.models import Task
from executors.base import ExecuteResult, TaskExecutor

if TYPE_CHECKING:
    from daemon.engine.processes.base import ExecutorProcess

log = structlog.get_logger("fredica.supervisor")


class Phase(enum.Enum):
    """Where an attempt is (see the module docstring)."""

    PREFETCHED = "prefetched"  # `claimed`, sent ahead once its process was recorded: it starts it
    REVOKING = "revoking"  # asked back (`Attempt.revoke_reason`): "revoked" or "started" answers
    ASSIGNED = "assigned"  # recorded `running`; sent to its process once that is committed
    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop, for `Attempt.stop_reason`
    TERMINATED = "terminated"  # its process tree got SIGTERM
    KILLED = "killed"  # and SIGKILL
    REPORTED = "reported"  # its result came
    EXITED = "exited"  # its process exited: its outcome is known
    ENDED = "ended"  # concluded, its process released


STOPS = (Phase.STOPPING, Phase.TERMINATED, Phase.KILLED)
AHEAD = (Phase.PREFETCHED, Phase.REVOKING)  # sent ahead, not started
_GOING = (Phase.RUNNING, *STOPS)
# Every move an attempt may make. A move not listed is a bug of ours: `_advance` refuses it.
ADVANCES: dict[Phase, frozenset[Phase]] = {
    # Its process says "started" or "revoked", or dies, or its assignment could not be sent.
    Phase.PREFETCHED: frozenset({Phase.REVOKING, Phase.RUNNING, Phase.EXITED}),
    Phase.REVOKING: frozenset({Phase.RUNNING, Phase.EXITED}),
    # A hand-over that fails ends the process: the attempt then exits without running.
    Phase.ASSIGNED: frozenset({Phase.RUNNING, Phase.STOPPING, Phase.EXITED}),
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.REPORTED, Phase.EXITED}),
    Phase.STOPPING: frozenset({Phase.TERMINATED, Phase.REPORTED, Phase.EXITED}),
    Phase.TERMINATED: frozenset({Phase.KILLED, Phase.REPORTED, Phase.EXITED}),
    Phase.KILLED: frozenset({Phase.REPORTED, Phase.EXITED}),
    # A process that takes another attempt ends this one at its result; others exit first.
    Phase.REPORTED: frozenset({Phase.EXITED, Phase.ENDED}),
    Phase.EXITED: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}
STOP_REASONS = ("cancel", "timeout", "shutdown")
# Why an attempt sent ahead is asked back: a worker of its queue freed first ("handoff": it goes
# there), a user's cancel, the shutdown. A later reason outranks an earlier one of lower rank.
# "cancelled": its run's cancel has cancelled its row already.
REVOKE_REASONS = ("handoff", "shutdown", "cancel", "cancelled")


class ImpossibleMove(AssertionError):
    """An attempt was asked to make a move `ADVANCES` does not allow: a bug of the supervisor."""


@dataclasses.dataclass(eq=False)
class Attempt:
    """A task's attempt from its dispatch until its outcome is recorded."""

    task: Task
    process: ExecutorProcess
    executor: TaskExecutor
    started_at: float
    token: str = ""  # names the attempt in its process's control commands (and messages)
    phase: Phase = Phase.ASSIGNED
    # When each phase was entered (the loop's `now`): escalation's timers and the outcome's words.
    entered: dict[Phase, float] = dataclasses.field(default_factory=dict)
    stop_reason: str | None = None  # one of STOP_REASONS once a stop came before its result
    result: ExecuteResult | None = None  # set on REPORTED
    exitcode: int | None = None  # set on EXITED: how its process (a launcher's fork) ended
    # Pause, and the task row's mirror of it. The loop writes is_paused, is_pausable and progress
    # when `mirror_dirty` (at once for a pause, every progress_interval for progress), and all of
    # them again after a tick whose writes were rolled back.
    paused_since: float | None = None
    paused_by: str | None = None  # "user" or "executor" (its own request_pause)
    # Whether a user had paused it when its stop came (a stop wakes it: `paused_by` is cleared).
    # Put back by a shutdown, it then comes back held (SPEC §14).
    paused_by_user_at_stop: bool = False
    pause_text: str | None = None  # while paused: what its status text says instead of its own
    paused_seconds: float = 0.0
    pausable: bool = False
    mirror_dirty: bool = False
    progress: tuple[int, str | None] | None = None  # latest value not yet written
    last_progress: tuple[int, str | None] | None = None  # latest value, written or not
    progress_written_at: float = 0.0
    ending_noted: bool = False  # the supervisor's line on how it ended is in the task's log
    send_error: str | None = None  # why its assignment never reached its process (`not_sent`)
    revoke_reason: str | None = None  # one of REVOKE_REASONS once it was asked back
    revoked: bool = False  # its process said it never started it and never will
    start_recorded: bool = True  # `running` in the database (for one sent ahead: once started)
    lane: Any = None  # its `daemon.engine.prefetch.Lane`, in a queue that sends tasks ahead

    def __post_init__(self) -> None:
        self.entered.setdefault(self.phase, self.started_at)

    @property
    def log(self) -> Any:
        return log.bind(task_id=self.task.id, run_id=self.task.workflow_run_id, type=self.task.type)

    # --- the one place phases move --------------------------------------------------------------

    def _advance(self, to: Phase, now: float) -> None:
        if to not in ADVANCES[self.phase]:
            raise ImpossibleMove(f"attempt of task {self.task.id}: {self.phase.value} -> {to.value}")
        self.phase = to
        self.entered[to] = now

    def handed_over(self, now: float) -> None:
        """Its process has the assignment."""
        if self.phase is Phase.ASSIGNED:
            self._advance(Phase.RUNNING, now)

    @classmethod
    def sent_ahead(cls, task: Task, process: ExecutorProcess, executor: TaskExecutor, now: float) -> Attempt:
        """An attempt sent ahead to `process`, behind the one it runs (its task stays `claimed`)."""
        return cls(task=task, process=process, executor=executor, started_at=now, phase=Phase.PREFETCHED,
                   pausable=executor.pausable, start_recorded=False)

    @property
    def ahead(self) -> bool:
        """Sent ahead and not started."""
        return self.phase in AHEAD

    @property
    def ran(self) -> bool:
        """It was given to its process to run, or started there: not one that never left the queue."""
        return Phase.RUNNING in self.entered or Phase.ASSIGNED in self.entered

    def started(self, now: float) -> bool:
        """Its process said "started" (sent ahead): running from `now`; False if it is not one
        waiting to start (a confused process)."""
        if self.phase not in AHEAD:
            return False
        self.started_at = now  # its timeout runs from here
        self._advance(Phase.RUNNING, now)
        return True

    def revoke(self, reason: str, now: float) -> bool:
        """Ask for it back for `reason` (REVOKE_REASONS); False if no command need be sent: it is
        asked back already, or over without having run (the reason is raised if it ranks higher,
        for what its task becomes), or it has started."""
        if reason not in REVOKE_REASONS:
            raise ValueError(f"unknown revoke reason {reason!r}")
        if self.phase is Phase.PREFETCHED:
            self.revoke_reason = reason
            self._advance(Phase.REVOKING, now)
            return True
        waiting = self.phase is Phase.REVOKING or (self.phase is Phase.EXITED and not self.ran)
        if waiting and REVOKE_REASONS.index(reason) > REVOKE_REASONS.index(self.revoke_reason or "handoff"):
            self.revoke_reason = reason
        return False

    def undo_revoke(self, phase: Phase, reason: str | None) -> None:
        """A user's cancel of an attempt sent ahead, whose tick was rolled back (as `undo_stop`)."""
        self.revoke_reason = reason
        if self.phase is Phase.REVOKING and phase is Phase.PREFETCHED:
            self.entered.pop(Phase.REVOKING, None)
            self.phase = phase

    def was_revoked(self, now: float) -> None:
        """Its process said "revoked": it never started it, and never will."""
        if self.phase in AHEAD:
            self.revoked = True
            self._advance(Phase.EXITED, now)

    def request_stop(self, reason: str, now: float) -> bool:
        """Begin stopping for `reason`; False (nothing changes) if a stop is under way or the
        attempt is over already (its result, or its process's exit, stands as what happened)."""
        if reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {reason!r}")
        if self.phase not in (Phase.ASSIGNED, Phase.RUNNING):
            return False
        self.stop_reason = reason
        self.paused_by_user_at_stop = self.paused_since is not None and self.paused_by == "user"
        self._advance(Phase.STOPPING, now)
        return True

    def undo_stop(self, phase: Phase, reason: str | None) -> None:
        """A user's stop whose tick was rolled back: it never happened (`phase`, `reason`: as the
        attempt was before it). An attempt that reported or exited in that same tick keeps its
        phase (its outcome is real), but not the stop's reason, which would relabel it."""
        self.stop_reason = reason
        self.paused_by_user_at_stop = False
        self.entered.pop(Phase.STOPPING, None)
        if self.phase is Phase.STOPPING:
            self.phase = phase

    def report(self, result: ExecuteResult, now: float) -> None:
        """Its result came; a second one (a confused executor) is ignored."""
        if self.phase in _GOING:
            self.result = result
            self._advance(Phase.REPORTED, now)
        else:
            self.log.warning("executor_result_ignored", phase=self.phase.value)

    def exited(self, exitcode: int | None, now: float) -> None:
        """Its process (a launcher's fork) exited with `exitcode` (None: not known)."""
        if self.phase in (Phase.EXITED, Phase.ENDED):
            return
        self.exitcode = exitcode
        self._advance(Phase.EXITED, now)

    def not_sent(self, error: str, now: float) -> None:
        """Its assignment could not be sent (`error`), and its process goes on without it: over,
        with nothing run."""
        self.send_error = error
        self._advance(Phase.EXITED, now)

    def end(self, now: float) -> None:
        """Concluded: its process is released, its outcome is the loop's to record."""
        self._advance(Phase.ENDED, now)

    def escalate(self, now: float, grace: float) -> None:
        """After a stop request: SIGTERM the attempt's process tree `grace` seconds later, SIGKILL
        as long after. A process that reported its last result and lingers is killed after `grace`."""
        since = self.entered[self.phase]
        if now < since + grace:
            return
        if self.phase is Phase.STOPPING:
            self.log.warning("executor_terminated", after=grace)
            self.process.terminate_attempt()
            self._advance(Phase.TERMINATED, now)
        elif self.phase is Phase.TERMINATED:
            self.log.warning("executor_killed", after=grace)
            self.process.kill_attempt()
            self._advance(Phase.KILLED, now)
        elif self.phase is Phase.REPORTED and not self.process.takes_another(self):
            self.log.warning("executor_stuck_after_result", after=grace)
            # A process that holds several has no tree of this attempt's own: it is ended whole
            # (it takes no more attempts, and only its exit now concludes this one).
            self.process.kill() if self.process.holds_many else self.process.kill_attempt()

    # --- what the phases say ---------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """A stop is under way (asked, or escalated) and the attempt has not yet reported or exited."""
        return self.phase in STOPS

    @property
    def finishing(self) -> bool:
        """Its result came or its process exited: how it ended is known."""
        return self.phase in (Phase.REPORTED, Phase.EXITED, Phase.ENDED)

    @property
    def ended_at(self) -> float | None:
        return self.entered.get(Phase.ENDED)

    def is_over(self) -> bool:
        """Ready to be concluded: exited, or reported to a process that takes another attempt."""
        if self.phase is Phase.EXITED:
            return True
        return self.phase is Phase.REPORTED and self.process.takes_another(self)

    def reached(self, phase: Phase) -> bool:
        return phase in self.entered

    # --- pause, progress and the row's mirror -----------------------------------------------------

    def active_seconds(self, now: float) -> float:
        """Seconds the task has run, not counting time spent paused (timeouts use this)."""
        paused = self.paused_seconds + (now - self.paused_since if self.paused_since is not None else 0.0)
        return now - self.started_at - paused

    def note_paused(self, now: float, by: str, reason: str | None = None) -> None:
        """Paused by "user" or by the "executor" (its own request_pause, for `reason`)."""
        if self.paused_since is None:
            self.paused_since, self.paused_by = now, by
            self.pause_text = "paused by user" if by == "user" else (reason or "paused by the executor")
            self.mirror_dirty = True

    def note_resumed(self, now: float) -> None:
        if self.paused_since is not None:
            self.paused_seconds += now - self.paused_since
            self.paused_since = self.paused_by = self.pause_text = None
            self.mirror_dirty = True

    def shown_text(self, progress_text: str | None) -> str | None:
        """The status text the row shows: why it is paused while it is (SPEC §14), else the
        executor's own text."""
        return self.pause_text if self.paused_since is not None else progress_text

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

    def deadlines(self, now: float, progress_interval: float, grace: float) -> list[float]:
        """When the loop must look at this attempt again (progress flush, escalation, timeout)."""
        if self.phase is Phase.RUNNING and self.progress is None and self.task.timeout is None:
            return []  # most of 10,000 attempts at once, asked at every sleep
        due = []
        if self.progress is not None:
            due.append(self.progress_written_at + progress_interval)
        if self.phase is Phase.REVOKING:
            due.append(self.entered[self.phase] + grace)
        if self.phase in (Phase.STOPPING, Phase.TERMINATED) or (
            self.phase is Phase.REPORTED and not self.process.takes_another(self)
        ):
            due.append(self.entered[self.phase] + grace)
        elif self.phase in (Phase.ASSIGNED, Phase.RUNNING) and self.task.timeout is not None and self.paused_since is None:
            due.append(now + self.task.timeout - self.active_seconds(now))
        return due
