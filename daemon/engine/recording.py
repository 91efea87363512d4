"""What the supervisor records of its attempts: what their processes say (drained from their
status channels, mirrored into their rows), and each one's outcome once it has ended (SPEC §6).

Apart from the loop because it is the one way an attempt's writes reach the database: each is
fenced to its attempt (`tasks.AttemptRef`), so that one no longer current changes nothing, and
an attempt ended while the database could not be written is kept (`unrecorded`) and recorded once
it can be.

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Sequence

import structlog

from daemon import faults, messages, models, outcomes
from daemon.engine import executor_processes
from daemon.engine.attempt import Attempt, Phase
from daemon.errors import InvalidTransition
from daemon.models import TaskStatus
from daemon.store import db, tasks
from daemon.store import attempts as attempt_store

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")


# Messages read from one child per tick: enough to keep up with any honest executor, small enough
# that a child flooding its channel cannot starve the others or the loop.
DRAIN_LIMIT = 2000


class RecordsAttempts:
    """What attempts' processes say, and their outcomes (see the module docstring)."""

    # --- messages from a child ------------------------------------------------------------------

    def _pool_of(self: Supervisor, process: executor_processes.ExecutorProcess) -> Any:
        """Where a process goes back once an attempt of it is over: the shared event-loop
        processes, or the idle pool."""
        if isinstance(process, executor_processes.EventLoopProcess):
            return self.loops[process.queue]
        return self.idle

    def _drain_all(self: Supervisor, now: float) -> None:
        """Read what every attempt's process said, each process once (one may hold several), and
        write more of what it was assigned if some is waiting."""
        held: dict[int, dict[str, Attempt]] = {}
        for rt in self._attempts():
            held.setdefault(id(rt.process), {})[rt.token] = rt
        for attempts in held.values():
            first = next(iter(attempts.values()))
            first.process.send_more()
            self._guard(first, self._drain, first.process, attempts, now, DRAIN_LIMIT)

    def _drain(
        self: Supervisor, process: executor_processes.ExecutorProcess, attempts: dict[str, Attempt], now: float,
        limit: int | None, *, check_exit: bool | None = None,
    ) -> None:
        """Apply what `process` said to the `attempts` it holds (by token), and its exit to all."""
        gone = (Phase.EXITED, Phase.ENDED)
        if all(rt.phase in gone for rt in attempts.values()):
            return
        if check_exit is None:  # not when the last wait saw the process still running
            check_exit = self._ready is None or process.sentinel in self._ready
        drained = process.drain(limit, check_exit=check_exit)
        if not drained.messages and drained.exitcode is None and not process.status.broken:
            return  # the usual tick of an event-loop process holding thousands: nothing to apply
        going = {token: rt for token, rt in attempts.items() if rt.phase not in gone}
        for message in drained.messages:
            rt = process.route(message, going, now)
            if rt is not None:
                messages.apply(rt, message, now)
        if drained.exitcode is not None:
            for rt in going.values():
                rt.exited(drained.exitcode, now)
        elif process.status.broken and process.is_alive() and (
            process.holds_many or any(not rt.finishing for rt in going.values())
        ):
            # Garbled: the attempt can report nothing more, not even its result. End it, so that
            # it is recorded as CRASHED (a launcher then reports its fork's exit) and not left to
            # run with no one listening. A process that holds several is ended whole even if
            # each has reported: only its exit concludes them now (it takes no more).
            log.warning("executor_channel_broken", pid=process.pid, tasks=[rt.task.id for rt in going.values()],
                        reason=process.status.close_reason)
            process.kill() if process.holds_many else process.kill_attempt()

    def _write_mirrors(self: Supervisor, now: float, only: Sequence[Attempt] | None = None) -> None:
        """Write what the task rows mirror of running attempts: pause states at once, progress at
        most every progress_interval per task (`only`: those attempts' whatever its age, as they
        end: one statement for them all)."""
        attempts = only if only is not None else list(self.running.values())
        dirty = [rt for rt in attempts if rt.mirror_dirty]
        if dirty:
            written = attempt_store.record_pause_states(self.conn, [
                (tasks.AttemptRef.of(rt.task), rt.paused_since is not None, rt.pausable,
                 rt.shown_text(rt.last_progress[1] if rt.last_progress else None))
                for rt in dirty
            ])
            _note_stale(written, dirty, "pause_state")
            for rt in dirty:
                rt.mirror_dirty = False
        due = [
            rt
            for rt in attempts
            if rt.progress is not None and (only is not None or now - rt.progress_written_at >= self.settings.progress_interval)
        ]
        if not due:
            return
        written = attempt_store.record_progress(
            self.conn, [(tasks.AttemptRef.of(rt.task), rt.progress[0], rt.shown_text(rt.progress[1])) for rt in due])
        _note_stale(written, due, "progress")
        for rt in due:
            rt.progress = None
            rt.progress_written_at = now

    # --- ending an attempt ----------------------------------------------------------------------

    def _finish(self: Supervisor, rt: Attempt, now: float) -> None:
        """The attempt is over: release its process, then record its outcome."""
        self._conclude(rt, now)
        self._record(rt)

    def _finish_all(self: Supervisor, over: Sequence[Attempt], now: float) -> None:
        """`_finish` for every attempt in `over`: each released at once, and the outcomes recorded
        after, the successes together (`_record_completions`)."""
        concluded = [rt for rt in over if self._guard(rt, self._conclude, rt, now)]
        together = [rt for rt in concluded if outcomes.completes(rt)]
        recorded = {id(rt) for rt in self._record_completions(together, now)} if len(together) > 1 else set()
        for rt in concluded:
            if id(rt) not in recorded:
                self._guard(rt, self._record, rt)

    def _record_completions(self: Supervisor, ended: list[Attempt], now: float) -> list[Attempt]:
        """Record many attempts that completed at `now` in one write (`outcomes.record_completions`,
        one statement where `_record` costs a savepoint and a transition each); the attempts it
        recorded. Any it refused, or all if it fails, are left to `_record`, which says why."""
        try:
            with db.savepoint(self.conn):  # written together or not at all
                self._write_mirrors(now, only=ended)
                recorded = outcomes.record_completions(self.conn, self.settings, ended, now)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            # A row moved on (rescued by another host), or a bug of ours: each alone then, which
            # records what fails and why. Their mirrors were undone with the rest: written again.
            log.warning("completions_recorded_one_by_one", tasks=len(ended), error=f"{type(exc).__name__}: {exc}")
            for rt in ended:
                rt.mirror_lost()
            return []
        finished = outcomes.Recorded(TaskStatus.COMPLETED)
        for rt in recorded:
            self._outbox.extend(functools.partial(observe, rt) for observe in self.attempt_observers)
            self._note(finished)
        return recorded

    def _conclude(self: Supervisor, rt: Attempt, now: float) -> None:
        """End the attempt in memory: release its process (kept if it takes another task), and
        leave it to `_record`. Needs no database. An attempt that exited has been read to the end
        of its channel; one whose process goes on sent its result as its last message."""
        process = rt.process
        takes_another = process.takes_another(rt)
        rt.end(now)
        self.running.pop(rt.task.id, None)  # one sent ahead that never started was not there
        self._finished.append(rt)  # from here on, a rolled-back tick keeps it in `unrecorded`
        lane = rt.lane
        if lane is not None:  # a queue's prefetch: its worker may hold more of ours
            done = lane.over(rt, takes_another)
            if done:
                self.lanes.pop(id(lane), None)
            if not process.holds_many:
                if not done:
                    return  # its process runs the next of its lane, or still holds some sent ahead
                takes_another = lane.reusable and process.is_alive() and not process.status.closed
        try:
            if takes_another or process.holds_many:
                self._pool_of(process).put_back(process)
            elif process.is_alive():  # it may not run another attempt: it exits when dismissed
                process.dismiss()
            else:
                process.close()
        except Exception:
            rt.log.exception("executor_release_failed")
            with contextlib.suppress(Exception):
                process.kill()

    def _record(self: Supervisor, rt: Attempt) -> None:
        """Record an ended attempt's outcome (SPEC §6), as of when it ended."""
        assert rt.ended_at is not None
        if not rt.start_recorded and rt.ran:  # sent ahead, started while the database could not be written
            self._record_starts(rt.ended_at)
        try:
            with db.savepoint(self.conn):  # its statements are undone together if one fails
                if not rt.start_recorded:  # sent ahead, and never started
                    self._record_unstarted(rt)
                    return
                self._write_mirrors(rt.ended_at, only=[rt])
                self._note(outcomes.record_attempt(self.conn, self.settings, rt, rt.ended_at))
                self._outbox.extend(functools.partial(observe, rt) for observe in self.attempt_observers)
        except InvalidTransition:
            if self.endings_in_doubt and self._recorded_in_doubt(rt):
                return
            # The row is no longer `running` (a bug of ours let something else change it):
            # retrying would fail for ever; what the row says now stands.
            rt.log.exception("outcome_not_recorded", retried=False)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            # A bug of ours: tried again next tick rather than leave the row `running` with no
            # attempt behind it.
            rt.log.exception("outcome_not_recorded", retried=True)
            self.unrecorded.append(rt)

    def _recorded_in_doubt(self: Supervisor, rt: Attempt) -> bool:
        """Whether `rt`'s ending was recorded by a COMMIT that was in doubt and had been made (its
        row ended, at its attempt): then what was to follow that commit is done now, once (the
        finished count, the executor's on_task_failed, the observers), and nothing is written."""
        key = (rt.task.id, rt.task.attempt)
        if key not in self.endings_in_doubt:
            return False
        self.endings_in_doubt.discard(key)
        row = tasks.find(self.conn, rt.task.id)
        if (row is None or row.attempt != rt.task.attempt or row.supervisor != rt.task.supervisor
                or row.status in (TaskStatus.RUNNING, TaskStatus.CLAIMED)):
            return False
        rt.log.warning("outcome_found_recorded", status=row.status.value,
                       reason="the commit that recorded it was in doubt, and had been made")
        finished = row.status if row.status in models.TERMINAL_STATUSES else None  # None: retried
        failed = finished not in (None, TaskStatus.COMPLETED) and rt.executor is not None
        self._note(outcomes.Recorded(finished, outcomes.failure_hook(rt.executor, row) if failed else None,
                                     retried=finished is None))
        self._outbox.extend(functools.partial(observe, rt) for observe in self.attempt_observers)
        return True

    def _count_finished(self: Supervisor, status: str) -> None:
        self.finished_counts[status] += 1

    def _note(self: Supervisor, recorded: outcomes.Recorded) -> None:
        """Count what `outcomes.record` did, and queue its hook, once that is committed."""
        if recorded.retried:
            self._delayed_possible = True
        if recorded.finished is not None:
            self._outbox.append(functools.partial(self._count_finished, recorded.finished))
        if recorded.hook is not None:
            self._outbox.append(recorded.hook)  # the hook sees the failure committed


def _note_stale(written: int, attempts: Sequence[Attempt], write: str) -> None:
    """Log the writes about attempts that are no longer their tasks' current ones (fenced out:
    rescued while this supervisor was taken for dead), which changed nothing."""
    if written < len(attempts):
        log.warning("stale_attempt_write_ignored", write=write, ignored=len(attempts) - written,
                    tasks=[rt.task.id for rt in attempts])
