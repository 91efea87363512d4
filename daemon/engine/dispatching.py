"""The supervisor's claims and dispatch: each queue claims into its free workers, and each claimed
task is started in an executor process (SPEC §6).

Apart from the loop because it is the one way a task comes to run here: its process is recorded
in the `running` row before it is given the task, and given it only once that row is committed
(`_hand_over`, from the tick's outbox), so a task never runs unrecorded, and never twice. A
queue's prefetch claims through `SendsAhead` instead (daemon/engine/sending_ahead.py).

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

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


class _Chosen(NamedTuple):
    """A claimed task prepared to run, and the process given it (not yet told)."""

    task: Task  # the claim's snapshot
    prepared: dispatch.Prepared
    process: executor_processes.ExecutorProcess
    pid: int | None  # the process that runs the attempt, as recorded (a launcher's fork)
    pid_started: float | None
    last: bool  # its process's last attempt (tasks_per_process)

    @property
    def executor(self) -> Any:
        return self.prepared.executor


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
                self._dispatch_batch(batch, now)
                # A task that ended at once (skipped, no executor, failed dispatch) may have made
                # its dependents ready, in any queue: another pass claims them. They come after
                # the rest of this batch, whatever their priority: they were not ready when it
                # was claimed.
                if len(self.running) - running_before < len(batch):
                    again = True
                if budget[queue] <= 0:  # there may be more: the next tick, at once (`_next_timeout`)
                    self._claims_left = True

    def _dispatch_claimed(self: Supervisor, task: Task, now: float) -> None:
        self._dispatch_batch([task], now)

    def _dispatch_batch(self: Supervisor, batch: Sequence[Task], now: float) -> None:
        """Start each claimed task of `batch` in its executor process, in the claim's order.

        Each task is prepared and given its process, then all are started in one write: one
        guarded UPDATE per process (`tasks.start_many`). An event-loop process takes a whole
        claim of hundreds in a tick, which cost as many UPDATEs, each in a savepoint of its own.
        """
        chosen: list[_Chosen] = []
        try:
            for task in batch:
                pick = self._choose(task, now)
                if pick is not None:
                    chosen.append(pick)
            if not chosen:
                return
            try:
                with db.savepoint(self.conn):
                    started = tasks.start_many(self.conn, [
                        tasks.Start(pick.task, pick.pid, pick.pid_started, pick.executor.pausable) for pick in chosen
                    ], now=now)
            except Exception as exc:
                if faults.classify(exc) is not None:
                    raise
                log.exception("dispatch_failed", tasks=[pick.task.id for pick in chosen], batch=True)
                started = {}  # a bug of ours: each is started alone, which records what fails
            chosen.reverse()  # popped in the claim's order; those not reached are put back below
            while chosen:
                pick = chosen.pop()
                task = started.get(pick.task.id)
                if task is None:  # its row moved on since the claim: alone, which says why
                    self._start_alone(pick, now)
                else:
                    self._begin(pick, task, now)
        except BaseException:
            for pick in chosen:  # given nothing: the tick is rolled back
                self._pool_of(pick.process).put_back(pick.process)
            raise

    def _choose(self: Supervisor, task: Task, now: float) -> _Chosen | None:
        """The claimed `task` prepared (`dispatch.prepare`), with the process that is to run it;
        None if it ended at once, needing no process, or could not be dispatched (recorded)."""
        try:
            prepared = dispatch.prepare(self.conn, self.settings, self.registry, task, now)
            if isinstance(prepared, outcomes.Recorded):
                self._note(prepared)  # ended at once: it needs no process
                return None
            child, last = self._process_for(prepared.executor, task)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            self._dispatch_failed(task, now)
            return None
        # The process is recorded before it is given the task: if the daemon dies in between, the
        # process never runs it; once it does, recovery finds it by pid and start time. So a task
        # never runs unrecorded, and never twice.
        # For a launcher, its waiting fork: the process recovery must find is the one that runs it.
        try:
            pid, pid_started = child.next_attempt_process()
        except BaseException as exc:
            self._pool_of(child).put_back(child)  # it was given nothing
            if not isinstance(exc, Exception) or faults.classify(exc) is not None:
                raise
            self._dispatch_failed(task, now)
            return None
        return _Chosen(task, prepared, child, pid, pid_started, last)

    def _process_for(self: Supervisor, executor: Any, task: Task) -> tuple[executor_processes.ExecutorProcess, bool]:
        """The process to run an attempt of `task`, and whether it is that process's last."""
        # A fresh process for each attempt: a fork of an idle launcher. Otherwise (tasks_per_process
        # > 1) a process that runs attempts itself, until it has run that many.
        # An `async def` executor's attempt joins the others in an event-loop process.
        if executor.runs_in_event_loop():
            return self.loops[task.queue].take(), False
        fresh = executor.needs_fresh_process or self.settings.tasks_per_process == 1
        child = self.idle.take("fresh" if fresh else "reused")
        return child, not fresh and child.attempts + 1 >= self.settings.tasks_per_process

    def _start_alone(self: Supervisor, pick: _Chosen, now: float) -> None:
        """Start one chosen task by itself: what `start_many` left out, which this says why."""
        try:
            with db.savepoint(self.conn):
                started = tasks.start(
                    self.conn, pick.task.id, known=pick.task, now=now, executor_pid=pick.pid,
                    executor_started_at=pick.pid_started, is_pausable=pick.executor.pausable,
                )
        except BaseException as exc:
            self._pool_of(pick.process).put_back(pick.process)  # it was given nothing
            if not isinstance(exc, Exception) or faults.classify(exc) is not None:
                raise
            if isinstance(exc, StaleAttempt):  # claimed again elsewhere: neither ours to start nor to fail
                log.warning("stale_attempt_write_ignored", task_id=pick.task.id, write="start", error=exc.message)
                return
            self._dispatch_failed(pick.task, now)
            return
        self._begin(pick, started, now)

    def _begin(self: Supervisor, pick: _Chosen, started: Task, now: float) -> None:
        """`started` is recorded running: its attempt, handed to its process after the commit.
        If a bug of ours stops it, the process is put back and the task ends CRASHED, as any
        failed dispatch does; the rest of the claim goes on."""
        try:
            rt = Attempt(
                task=started, process=pick.process, executor=pick.executor, started_at=now,
                pausable=started.is_pausable,
            )
            # The executor gets the payload with its references to upstream results filled in.
            attempt = started.but(payload=pick.prepared.task.payload)
        except BaseException as exc:
            self._pool_of(pick.process).put_back(pick.process)  # it was given nothing
            if not isinstance(exc, Exception) or faults.classify(exc) is not None:
                raise
            self._dispatch_failed(started, now)
            return
        # Nothing below raises: the attempt is either wholly begun or not at all.
        upstream, last = pick.prepared.upstream, pick.last
        self.running[started.id] = rt
        self._dispatched.append(rt)
        self._outbox.append(lambda: self._hand_over(rt, attempt, upstream, last, now))

    def _dispatch_failed(self: Supervisor, task: Task, now: float) -> None:
        """A bug of ours stopped `task`'s dispatch (logged with its traceback): it ends CRASHED."""
        log.exception("dispatch_failed", task_id=task.id, run_id=task.workflow_run_id)
        self.running.pop(task.id, None)
        error = "the supervisor could not dispatch the task"
        self._note(outcomes.record(self.conn, self.settings, task, None, error, models.CRASHED, now))

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
