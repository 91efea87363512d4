"""The supervisor's claims and dispatch: each queue claims into its free workers, and each claimed
task is started in an executor process (SPEC §6).

Apart from the loop because it is the one way a task comes to run here: its process is recorded
in the `running` row before it is given the task, and given it only once that row is committed
(`_hand_over`, from the tick's outbox), so a task never runs unrecorded, and never twice. A
queue's prefetch claims through `SendsAhead` instead (daemon/engine/sending_ahead.py).

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import structlog

from daemon import dispatch, faults, models, outcomes
from daemon.engine import executor_processes
from daemon.engine.attempt import Attempt
from daemon.errors import StaleAttempt
from daemon.models import Task
from daemon.store import db, tasks
from executors import assignment

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")


# Claims (and starts) of one tick at most, in each queue. Its attempts are handed to their processes only after
# its commit, and the control socket is served between ticks: a burst of 10,000 ready tasks in
# one tick would start none for seconds and leave every client waiting as long. The next tick
# follows at once while more are claimable.
CLAIMS_PER_TICK = 256


class Dispatches:
    """Claims into free workers, and the start of each claimed task (see the module docstring)."""

    # --- claiming -------------------------------------------------------------------------------

    def _free(self: Supervisor, queue: str, busy: Mapping[str, int]) -> int:
        """How many more attempts `queue` may start now (none, or less than none, when shrunk),
        `busy` being `busy_by_queue()`: counted once per pass, not once per queue."""
        return self.queues.workers[queue] - busy.get(queue, 0)

    def _claim(self: Supervisor, now: float) -> None:
        """Each queue that is not paused claims into its own free workers, by priority, then
        submission order, among its own tasks: a full queue holds no other back."""
        promote = self._delayed_possible  # once a tick: claim_ready makes due retries ready
        # The bound is each queue's: one with a backlog and many free workers must not take
        # every claim of every tick from the others (a full queue never holds another back).
        budget = dict.fromkeys(self.queues.claimable(), CLAIMS_PER_TICK)
        self._claims_left = False
        if self.prefetching:
            self._ahead_refused = set()
        again = True
        while again:
            again = False
            busy = self.busy_by_queue()  # a dispatch adds to its own queue only
            for queue in self.queues.claimable():
                if queue in self.prefetching:
                    claimed, more, asked = self._claim_prefetching(queue, busy, budget[queue], now, promote)
                    budget[queue] -= claimed
                    promote = promote and not asked
                    again = again or more
                    if budget[queue] <= 0:
                        self._claims_left = True
                    continue
                free = min(self._free(queue, busy), budget.get(queue, 0))
                if free <= 0:
                    continue
                batch = tasks.claim_ready(self.conn, now, free, queue=queue, promote_delayed=promote,
                                          supervisor=self.settings.name)
                budget[queue] -= len(batch)
                promote = False
                running_before = len(self.running)
                for task in batch:
                    self._dispatch_claimed(task, now)
                # A task that ended at once (skipped, no executor, failed dispatch) may have made
                # its dependents ready, in any queue: another pass claims them. They come after
                # the rest of this batch, whatever their priority: they were not ready when it
                # was claimed.
                if len(self.running) - running_before < len(batch):
                    again = True
                if budget[queue] <= 0:  # there may be more: the next tick, at once (`_next_timeout`)
                    self._claims_left = True

    def _dispatch_claimed(self: Supervisor, task: Task, now: float) -> None:
        try:
            with db.savepoint(self.conn):  # a dispatch that fails half-way is undone whole
                self._dispatch(task, now)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            if isinstance(exc, StaleAttempt):  # claimed again elsewhere: neither ours to start nor to fail
                log.warning("stale_attempt_write_ignored", task_id=task.id, write="start", error=exc.message)
                return
            log.exception("dispatch_failed", task_id=task.id, run_id=task.workflow_run_id)
            self.running.pop(task.id, None)
            error = "the supervisor could not dispatch the task"
            self._note(outcomes.record(self.conn, self.settings, task, None, error, models.CRASHED, now))

    # --- dispatch -------------------------------------------------------------------------------

    def _dispatch(self: Supervisor, task: Task, now: float) -> None:
        prepared = dispatch.prepare(self.conn, self.settings, self.registry, task, now)
        if isinstance(prepared, outcomes.Recorded):
            self._note(prepared)  # ended at once: it needs no process
            return
        task, executor, upstream = prepared.task, prepared.executor, prepared.upstream
        # A fresh process for each attempt: a fork of an idle launcher. Otherwise (tasks_per_process
        # > 1) a process that runs attempts itself, until it has run that many.
        # An `async def` executor's attempt joins the others in an event-loop process.
        if executor.runs_in_event_loop():
            child, last = self.loops[task.queue].take(), False
        else:
            fresh = executor.needs_fresh_process or self.settings.tasks_per_process == 1
            child = self.idle.take("fresh" if fresh else "reused")
            last = not fresh and child.attempts + 1 >= self.settings.tasks_per_process
        # The process is recorded before it is given the task: if the daemon dies in between, the
        # process never runs it; once it does, recovery finds it by pid and start time. So a task
        # never runs unrecorded, and never twice.
        # For a launcher, its waiting fork: the process recovery must find is the one that runs it.
        try:
            pid, pid_started = child.next_attempt_process()
            started = tasks.start(
                self.conn,
                task.id,
                known=task,
                now=now,
                executor_pid=pid,
                executor_started_at=pid_started,
                is_pausable=executor.pausable,
            )
        except BaseException:
            self._pool_of(child).put_back(child)  # it was given nothing
            raise
        self.running[task.id] = rt = Attempt(
            task=started, process=child, executor=executor, started_at=now, pausable=started.is_pausable
        )
        self._dispatched.append(rt)
        # The executor gets the payload with its references to upstream results filled in.
        attempt = started.but(payload=task.payload)
        self._outbox.append(lambda: self._hand_over(rt, attempt, upstream, last, now))

    def _hand_over(self: Supervisor, rt: Attempt, attempt: Task, upstream: dict[str, Any], last: bool, now: float) -> None:
        """Send a started attempt to its process (after the commit that recorded it)."""
        child = rt.process
        try:
            rt.token = self._assign(child, attempt, upstream, last=last, prefetching=attempt.queue in self.prefetching)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            rt.log.warning("executor_lost", pid=child.pid, error=error)
            if child.holds_many:
                # The other attempts of a shared process are not to pay for this one: nothing of
                # it was sent, so it ends here (CRASHED), and the process goes on.
                rt.not_sent(error, now)
                return
            # Died just now, or the task could not be sent: end the process, so that the loop
            # finds it gone and records the attempt as CRASHED rather than wait for it forever.
            child.kill()
            return
        rt.handed_over(now)
        rt.log.info(
            "task_started", pid=rt.task.executor_pid, attempt=attempt.retry_count + 1, process_attempt=child.attempts
        )

    def _assign(
        self: Supervisor, process: executor_processes.ExecutorProcess, attempt: Task, upstream: dict[str, Any], **options: Any
    ) -> str:
        """Send `attempt` to `process`, recorded as the one that runs it; its token."""
        return process.assign(
            attempt, self.registry.ref(attempt.type), upstream, self.settings.task_log(attempt.id),
            process=(attempt.executor_pid, attempt.executor_started_at),  # as recorded
            limits=assignment.Limits(self.settings.max_result_bytes, self.settings.max_task_log_bytes),
            cancel_grace=self.settings.cancel_grace, **options,
        )
