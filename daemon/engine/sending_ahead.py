"""The supervisor's part in a queue's prefetch (SPEC §15): claiming into its lanes, sending tasks
ahead, recording their start, and taking them back.

Never run twice: a task sent ahead stays `claimed`, with the process it was sent to recorded
(`tasks.record_sent_ahead`) and committed before it is sent. Its process starts it on its own,
and says "started" before any executor code runs; only that makes it `running` here (the one
guarded transition, `tasks.start`). It is taken back with a "revoke" command, which its process
answers "revoked" (it never started it, and never will) or not at all (its "started" is on the
way): so a task is handed to another worker, cancelled or put back only once its process has
said it never ran it, or died before saying it started it. Recovery counts a `claimed` task with
a recorded process as one that may have run (daemon/recovery.py).

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import structlog

from daemon import dispatch, faults, models, outcomes
from daemon.engine import prefetch
from daemon.engine.attempt import Attempt, Phase
from daemon.errors import InvalidTransition
from daemon.models import Task
from daemon.store import cancels, db, tasks

if TYPE_CHECKING:
    from daemon.queues import QueueConfig
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")


class SendsAhead:
    """Tasks sent ahead to the workers of queues with a prefetch (see the module docstring)."""

    def _init_sending_ahead(self, configs: Mapping[str, QueueConfig]) -> None:
        self.ahead: dict[str, Attempt] = {}  # by task id: sent ahead, not started
        self.lanes: dict[int, prefetch.Lane] = {}  # by id(): those holding some (each attempt's `lane`)
        self.prefetching = {name: queue.prefetch for name, queue in configs.items() if queue.prefetch}
        self._starts: list[Attempt] = []  # started, not yet recorded `running`
        self._starts_recorded: list[tuple[Attempt, Task]] = []  # this tick's (and the task as it was)
        self._ahead_refused: set[str] = set()  # queues a task of this tick could not wait in

    def _attempts(self: Supervisor) -> Iterable[Attempt]:
        """Every attempt of ours in a process: those running, and those sent ahead."""
        if not self.ahead:
            return self.running.values()
        return itertools.chain(self.running.values(), self.ahead.values())

    # --- claiming -------------------------------------------------------------------------------

    def _claim_prefetching(
        self: Supervisor, queue: str, busy: Mapping[str, int], budget: int, now: float, promote: bool
    ) -> tuple[int, bool, bool]:
        """One claim pass of a queue with a prefetch: into its free workers, then ahead into its
        lanes. A worker that is free while tasks wait behind others takes the oldest of them over
        (revoked, then dispatched to it) before anything new is claimed for it. Returns how many
        were claimed, whether another pass may claim more, and whether the claim was made
        (`promote` then used)."""
        depth = self.prefetching[queue]
        lanes = self._lanes_of(queue)
        free = self.queues.workers[queue] - busy.get(queue, 0) - prefetch.occupied(lanes)
        if free > 0:
            for rt in prefetch.waiting_behind(lanes)[:free]:
                self._revoke(rt, "handoff", now)
                free -= 1
        free = max(0, min(free, budget))
        room = [] if queue in self._ahead_refused else [
            lane for lane in lanes if lane.takes_ahead(depth, self.settings.tasks_per_process)
        ]
        wanted = min(budget, free + sum(depth - len(lane.ahead) for lane in room))
        if wanted <= 0:
            return 0, False, False
        # Named as every claim of ours: a claim that names no supervisor is any starting one's to
        # recover (SPEC §16), and no rescue would find it.
        batch = tasks.claim_ready(self.conn, now, wanted, queue=queue, promote_delayed=promote,
                                  supervisor=self.settings.name)
        into_free, behind = batch[:free], batch[free:]
        running_before = len(self.running)
        for task in into_free:
            self._dispatch_claimed(task, now)
        again = len(self.running) - running_before < len(into_free)  # one ended at once
        for task in behind:
            if queue in self._ahead_refused:  # a task of its batch found no lane to wait in
                tasks.requeue(self.conn, task.id, now=now, known=task)
                continue
            again = not self._dispatch_ahead_claimed(task, room, depth, now) or again
        # The workers just filled take tasks ahead too: another pass, if there may be more.
        again = again or (bool(into_free) and len(batch) == wanted and queue not in self._ahead_refused)
        return len(batch), again, True

    def _lanes_of(self: Supervisor, queue: str) -> list[prefetch.Lane]:
        """The queue's lanes: those holding tasks sent ahead, and every other attempt it runs in a
        process that takes tasks ahead (a lane once something is sent ahead behind it)."""
        lanes = [lane for lane in self.lanes.values() if lane.queue == queue]
        for rt in self.running.values():
            if rt.lane is None and rt.task.queue == queue and rt.process.kind in prefetch.KINDS:
                lanes.append(prefetch.Lane(queue, rt.process, rt))
        return lanes

    def _dispatch_ahead_claimed(self: Supervisor, task: Task, room: list[prefetch.Lane], depth: int, now: float) -> bool:
        """Send a claimed task ahead into the lane of `room` with fewest that fits it; False if it
        did not go (ended at once, or put back)."""
        try:
            with db.savepoint(self.conn):  # a dispatch that fails half-way is undone whole
                return self._dispatch_ahead(task, room, depth, now)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            log.exception("dispatch_failed", task_id=task.id, run_id=task.workflow_run_id)
            error = "the supervisor could not dispatch the task"
            self._note(outcomes.record(self.conn, self.settings, task, None, error, models.CRASHED, now))
            return False

    def _dispatch_ahead(self: Supervisor, task: Task, room: list[prefetch.Lane], depth: int, now: float) -> bool:
        prepared = dispatch.prepare(self.conn, self.settings, self.registry, task, now)
        if isinstance(prepared, outcomes.Recorded):
            self._note(prepared)  # ended at once: it needs no process
            return False
        executor = prepared.executor
        fitting = [lane for lane in room if lane.fits(executor)
                   and lane.takes_ahead(depth, self.settings.tasks_per_process)]
        if not fitting:
            # No lane of the kind of process it runs in has room (it needs a fresh process, or is
            # of the other kind): back to the queue, to be claimed into a free worker; nothing
            # more of this queue is sent ahead this tick.
            self._ahead_refused.add(task.queue)
            tasks.requeue(self.conn, task.id, now=now, known=task)
            return False
        lane = min(fitting, key=lambda lane: len(lane.ahead))
        process = lane.process
        pid, pid_started = process.next_attempt_process()
        # Recorded before it is sent: from the commit on, recovery counts it as one that may
        # have run. It stays `claimed`: its process starts it on its own.
        sent = tasks.record_sent_ahead(self.conn, task, executor_pid=pid, executor_started_at=pid_started)
        rt = Attempt.sent_ahead(sent, process, executor, now)
        follows = lane.tail()
        if id(lane) not in self.lanes:
            self.lanes[id(lane)] = lane
            if lane.head is not None:
                lane.head.lane = lane
        rt.lane = lane
        lane.ahead.append(rt)
        self.ahead[task.id] = rt
        if process.holds_many:
            process.holding += 1  # as `EventLoops.take` counts it: released when it is over
        self._dispatched.append(rt)
        attempt = sent.but(payload=prepared.task.payload)
        self._outbox.append(functools.partial(self._hand_over_ahead, rt, attempt, prepared.upstream, follows, now))
        return True

    def _hand_over_ahead(
        self: Supervisor, rt: Attempt, attempt: Task, upstream: dict[str, Any], follows: Attempt | None, now: float
    ) -> None:
        """Send an attempt ahead (after the commit that recorded its process), to follow `follows`."""
        process = rt.process
        try:
            rt.token = self._assign(process, attempt, upstream, last=False, prefetched=True, prefetching=True,
                                    after=follows.token if follows is not None else None)
        except Exception as exc:
            # Its process is gone, or goes on with what it runs: either way this one never ran.
            error = f"{type(exc).__name__}: {exc}"
            rt.log.warning("executor_lost", pid=process.pid, error=error)
            rt.not_sent(error, now)
            return
        rt.log.info("task_sent_ahead", pid=attempt.executor_pid, process_attempt=process.attempts)

    def _withdraw_ahead(self: Supervisor, rt: Attempt) -> None:
        """Its dispatch was rolled back: it was never sent, and its lane forgets it."""
        self.ahead.pop(rt.task.id, None)
        if rt.process.holds_many:
            rt.process.holding -= 1
        lane = rt.lane
        if lane is not None:
            lane.withdraw(rt)
            if not lane.ahead and lane.head is not None:
                lane.head.lane = None
                self.lanes.pop(id(lane), None)

    # --- what their processes say ---------------------------------------------------------------

    def _settle_ahead(self: Supervisor, now: float, conclude: Callable[[Attempt, float], None]) -> None:
        """After a drain: those that started are running now (to be recorded so); those revoked,
        or whose process died or could not be sent them, are over without having run. A revoke
        left unanswered for cancel_grace ends the process (it would hold the task for ever)."""
        for rt in list(self.ahead.values()):
            if rt.ran:
                del self.ahead[rt.task.id]
                self.running[rt.task.id] = rt
                if rt.lane is not None:
                    rt.lane.started(rt)
                self._starts.append(rt)
            elif rt.phase is Phase.EXITED:
                del self.ahead[rt.task.id]
                self._guard(rt, conclude, rt, now)
            elif rt.phase is Phase.REVOKING and now >= rt.entered[Phase.REVOKING] + self.settings.cancel_grace:
                rt.log.warning("executor_revoke_unanswered", pid=rt.process.pid, after=self.settings.cancel_grace)
                rt.process.kill()  # its exit ends what it holds; this one never started

    def _record_starts(self: Supervisor, now: float) -> None:
        """Record `running` the attempts sent ahead that their processes have started."""
        while self._starts:
            rt = self._starts[0]
            before = rt.task
            try:
                with db.savepoint(self.conn):
                    rt.task = tasks.start(
                        self.conn, before.id, known=before, now=rt.entered[Phase.RUNNING],
                        executor_pid=before.executor_pid, executor_started_at=before.executor_started_at,
                        is_pausable=rt.pausable,
                    )
            except InvalidTransition:
                row = tasks.get(self.conn, before.id)
                if _started_already(row, before):
                    # Recorded by a COMMIT that was in doubt and had been made (`_note_in_doubt`):
                    # the same attempt of ours, in the same process. It runs on.
                    rt.task = row
                else:
                    # Its row changed meanwhile (its run was cancelled): it must not run on.
                    rt.log.warning("started_task_not_claimed", status=row.status.value)
                    self._starts.pop(0)
                    rt.start_recorded = True
                    self._request_stop(before.id, "cancel", now)
                    continue
            self._starts.pop(0)
            rt.start_recorded = True
            self._starts_recorded.append((rt, before))
            rt.log.info("task_started", pid=before.executor_pid, attempt=before.retry_count + 1, sent_ahead=True)
            if rt.revoke_reason in ("cancel", "cancelled"):  # it started before the revoke arrived
                self._request_stop(before.id, "cancel", now)

    def _undo_starts(self: Supervisor) -> None:
        """This tick's records of starts were rolled back: made again at the next tick."""
        for rt, before in reversed(self._starts_recorded):
            rt.task, rt.start_recorded = before, False
            self._starts.insert(0, rt)
        self._starts_recorded = []

    def _record_unstarted(self: Supervisor, rt: Attempt) -> None:
        """An attempt sent ahead is over without having run: its task, still `claimed`, is
        cancelled, handed to the worker that freed, or put back to pending, as its revoke said.
        In `_record`'s savepoint, which deals with what fails."""
        assert rt.ended_at is not None
        now, task, reason = rt.ended_at, rt.task, rt.revoke_reason
        if reason == "cancelled":
            # Its run's cancel wrote it, or another host's: its process said it never started it.
            rt.log.info("task_taken_back", reason="cancelled", pid=task.executor_pid)
            return
        if reason == "cancel":
            cancels.cancel(self.conn, task.id, now=now, known=task)
            self._outbox.append(functools.partial(self._count_finished, models.TaskStatus.CANCELLED.value))
            rt.log.info("task_cancelled", by="user", sent_ahead=True)
        elif reason == "handoff" and self._hands_over(task.queue):
            rt.log.info("task_handed_over", from_pid=task.executor_pid)
            self._dispatch_claimed(task, now)
        else:
            tasks.requeue(self.conn, task.id, now=now, known=task)
            rt.log.info("task_put_back", reason=reason or "its executor process ended before starting it",
                        pid=task.executor_pid, error=rt.send_error)

    def _hands_over(self: Supervisor, queue: str) -> bool:
        """Whether a task taken back for a worker of `queue` that freed goes there now: the queue
        claims, and a worker is still free."""
        if self._shutdown_deadline is not None or queue not in self.queues.claimable():
            return False
        busy = sum(1 for rt in self.running.values() if rt.task.queue == queue)
        return self.queues.workers[queue] - busy - prefetch.occupied(self._lanes_of(queue)) > 0

    # --- taking back ----------------------------------------------------------------------------

    def _revoke(self: Supervisor, rt: Attempt, reason: str, now: float, *, requested: bool = False) -> None:
        """Ask for an attempt sent ahead back, for `reason` (a stop's, or "handoff", "cancelled").
        `requested`: for a user's request, told to the process once its tick is committed."""
        before = (rt.phase, rt.revoke_reason)
        send = rt.revoke(reason if reason != "timeout" else "cancel", now)
        if requested:
            self._stops.append((rt, *before))
            if send:
                self._outbox.append(functools.partial(self._send_revoke, rt))
        elif send:
            self._send_revoke(rt)

    def _send_revoke(self: Supervisor, rt: Attempt) -> None:
        if rt.phase is Phase.REVOKING and rt.token:
            rt.process.revoke(rt.token)
            rt.log.info("task_revoke_requested", reason=rt.revoke_reason)


def _started_already(row: Task, claimed: Task) -> bool:
    """Whether `row` is the start of the attempt `claimed` names, in the process it was sent to."""
    return (row.status is models.TaskStatus.RUNNING and row.attempt == claimed.attempt
            and row.supervisor == claimed.supervisor and row.executor_pid == claimed.executor_pid
            and row.executor_started_at == claimed.executor_started_at)
