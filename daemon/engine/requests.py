"""The supervisor's requests: what other threads ask of its loop (the control socket, the HTTP
API, signal handlers, tests), and the loop's side of those that act on attempts and queues.

Apart from the loop because it is the one boundary between threads: each public method here runs
on its caller's thread, checks what needs no database there, and hands the rest to the loop
(`daemon.handoff`), which runs it in its own transaction and answers once that is committed.

A mixin of `daemon.supervisor.Supervisor`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import structlog

from daemon import messages, models, queues
from daemon.errors import InvalidTransition
from daemon.models import Task
from daemon.store import ids as id_store
from daemon.store import queues as queue_store
from daemon.store import cancels, db, runs, tasks
from daemon.submission import TaskSpec, check_executors

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")
T = TypeVar("T")


# How long a request waits for the loop before it is withdrawn: shorter than a client waits for
# its answer (daemon.client), so that the client hears "nothing was done" rather than time out.
CALL_TIMEOUT = 20.0


@dataclasses.dataclass(frozen=True)
class CancelReport:
    """What a cancel did: tasks cancelled at once, and running tasks asked to stop."""

    cancelled: tuple[str, ...]
    stopping: tuple[str, ...]
    # A task's cancel: the tasks that depend on it, not ended, which its cancel cancels with it
    # (at once for a waiting task, once a running one has stopped). A run's: counted in `cancelled`.
    dependents: int = 0
    run: str | None = None  # the run's id, when a run was cancelled


class TakesRequests:
    """Requests from other threads, handed to the loop (see the module docstring)."""

    # --- the API other threads use --------------------------------------------------------------

    def call(self: Supervisor, fn: Callable[[], T], timeout: float | None = CALL_TIMEOUT) -> T:
        """Run `fn` on the loop thread, in its transaction; its result once that is committed.
        While the database cannot be written, refused at once (every call writes)."""
        fault = self.fault
        if fault is not None:
            raise fault.refusal()
        return self._handoff.call(fn, timeout)

    def hand_over(self: Supervisor, fn: Callable[[], T], still_waiting: Callable[[], bool]) -> concurrent.futures.Future[T] | None:
        """`call` without waiting, for the control socket's I/O thread: the future is answered once
        `fn`'s transaction is committed. None before the loop runs (the caller then uses `call`
        from a thread that may wait); a future refused at once while the database cannot be written."""
        fault = self.fault
        if fault is not None:
            refused: concurrent.futures.Future[T] = concurrent.futures.Future()
            refused.set_running_or_notify_cancel()
            refused.set_exception(fault.refusal())
            return refused
        if self._handoff.loop_ident is None:
            return None
        return self._handoff.submit(fn, still_waiting)

    def commits(self: Supervisor) -> int:
        """How many transactions the loop has committed: see `wait_for_commit`."""
        return self._handoff.commits

    def wait_for_commit(self: Supervisor, seen: int, timeout: float) -> int:
        """Block (any thread but the loop's) until the loop commits after the `seen`-th commit."""
        return self._handoff.wait_for_commit(seen, timeout)

    def report_corruption(self: Supervisor, exc: BaseException) -> None:
        """A reader found the database corrupt: the loop ends the daemon (SPEC §13). Any thread."""
        if self._corruption is None:
            self._corruption = exc
        self.wake()

    def wake(self: Supervisor) -> None:
        """Make the loop tick now (safe from any thread and from signal handlers)."""
        self._handoff.wake()

    def submit(
        self: Supervisor, specs: Sequence[TaskSpec], *, template: str = "adhoc", material_id: str | None = None
    ) -> tasks.Submission:
        """Store a run with `specs` as its tasks, each in its queue (named, else routed by type);
        the loop claims them on its next tick. A queue that is not configured refuses it all."""
        check_executors(specs, self.registry)  # in the request's thread: the loop waits for none of it
        self.queues.check_specs(specs)
        return self.call(lambda: self._submit_in_loop(specs, template, material_id))

    def _submit_in_loop(
        self: Supervisor, specs: Sequence[TaskSpec], template: str, material_id: str | None
    ) -> tasks.Submission:
        submission = tasks.submit(self.conn, specs, now=self.clock(), template=template, material_id=material_id,
                                  routes=self.queues.routes)
        if not submission.startable:
            self._calls_without_work += 1  # nothing for a claim: see Supervisor.tick
        return submission

    def cancel(self: Supervisor, target_id: str) -> CancelReport:
        """Cancel a task, or every unfinished task of a run (SPEC §7)."""
        return self.call(lambda: self._cancel(target_id, self.clock()))

    def pause(self: Supervisor, task_id: str) -> Task:
        """Pause a running, pausable task: command its process to clear its resume Event, and
        record `is_paused`."""
        return self.call(lambda: self._set_paused(task_id, True, self.clock()))

    def resume(self: Supervisor, task_id: str) -> Task:
        """Resume a paused task: command its process to set its resume Event, and record
        `is_paused = 0`."""
        return self.call(lambda: self._set_paused(task_id, False, self.clock()))

    def set_queue_paused(self: Supervisor, name: str, paused: bool) -> bool:
        """Stop (or restart) claiming in a queue; its running tasks go on. Kept in the database,
        so it outlasts a restart. False if the queue already was so."""
        self.queues.require(name)
        return self.call(lambda: self._set_queue_paused(name, paused, self.clock()))

    def set_queue_workers(self: Supervisor, name: str, workers: int) -> None:
        """Resize a queue until the daemon stops (the config sets it at the next start). Fewer
        than it runs stops nothing: it claims again once fewer run than it may."""
        self.queues.require(name)
        queues.check_workers(f"queue {name}:", workers)
        queues.check_size(name, workers, self.queues.configs[name].types, self.registry)
        self.call(lambda: self._set_queue_workers(name, workers))

    def busy_by_queue(self: Supervisor) -> dict[str, int]:
        """How many attempts each queue runs now (any thread: a copy of the loop's view)."""
        return dict(self.running.by_queue)  # one C-level copy: safe while the loop changes it

    def reroute_waiting(self: Supervisor, now: float) -> None:
        """At start, after recovery: move waiting tasks to the queues this config routes them to
        (their type's route changed, or the queue they named is gone); one line says how many."""
        if self.lease is not None:
            # A shared queue: each supervisor serves the queues its own config lists (SPEC §16),
            # and the others' tasks are not this config's to move.
            return
        moved = queue_store.reroute(self.conn, self.queues.routes, self.queues.names, queues.DEFAULT)
        if moved:
            log.info("tasks_rerouted", tasks=sum(moved.values()), to_queues=moved)

    # --- cancel, pause (the loop's side) --------------------------------------------------------

    def _cancel_run_elsewhere(self: Supervisor, running: list[str], now: float) -> tuple[str, ...]:
        """Cancel the row of each of a run's running tasks that no attempt of ours runs: on a shared
        queue, those another supervisor runs, which finds its attempt's row moved on and stops it
        (SPEC §16), as for a single task's cancel. One that ends meanwhile is left as it ended."""
        if self.lease is None:
            return ()  # one supervisor: a running task not ours has just ended here, being recorded
        ended_here = {rt.task.id for rt in self.unrecorded}
        cancelled = []
        for task_id in running:
            if task_id in ended_here:
                continue
            try:
                with db.savepoint(self.conn):
                    cancels.cancel(self.conn, task_id, now=now, reason="run cancelled by user")
            except InvalidTransition:
                continue
            cancelled.append(task_id)
        return tuple(cancelled)

    def _cancel(self: Supervisor, given_id: str, now: float) -> CancelReport:
        # Resolved here, in the loop's transaction: the prefix names what exists when it acts.
        named = id_store.resolve(self.conn, given_id)
        target_id = named.id
        if named.kind == "run":
            run = runs.get(self.conn, target_id)
            outcome = cancels.cancel_waiting_in_run(self.conn, target_id, now=now)
            for task_id in outcome.cancelled:  # those sent ahead are cancelled: their processes must know
                if task_id in self.ahead:
                    self._revoke(self.ahead[task_id], "cancelled", now, requested=True)
            stopping = [task_id for task_id in outcome.running
                        if self._request_stop(task_id, "cancel", now, requested=True)]
            cancelled = outcome.cancelled + self._cancel_run_elsewhere(
                [task_id for task_id in outcome.running if task_id not in stopping], now)
            if not cancelled and not stopping:
                raise InvalidTransition(target_id, run.status.value, models.TaskStatus.CANCELLED.value,
                                        f"workflow run {target_id} is {run.status.value}: nothing to cancel")
            log.info("run_cancelled", run_id=target_id, cancelled=len(cancelled), stopping=len(stopping))
            return CancelReport(cancelled, tuple(stopping), run=target_id)
        task = tasks.get(self.conn, target_id)
        dependents = tasks.active_downstream(self.conn, task.id)
        if self._request_stop(task.id, "cancel", now, requested=True):
            return CancelReport((), (task.id,), dependents)
        if any(rt.task.id == task.id for rt in self.unrecorded):
            raise InvalidTransition(task.id, task.status.value, models.TaskStatus.CANCELLED.value,
                                    f"task {task.id} has just ended: its outcome is being recorded")
        cancels.cancel(self.conn, task.id, now=now)
        log.info("task_cancelled", task_id=task.id, run_id=task.workflow_run_id, by="user", dependents=dependents)
        return CancelReport((task.id,), (), dependents)

    def _set_paused(self: Supervisor, given_id: str, paused: bool, now: float) -> Task:
        task_id = id_store.task_id(self.conn, given_id)
        rt, task = self.running.get(task_id), tasks.get(self.conn, task_id)
        owner = self.owner_elsewhere(task)
        if owner is not None:
            return self._ask_owner(task, owner, paused)
        task, command = messages.pause_by_user(self.conn, task, rt, paused, now)
        assert rt is not None  # pause_by_user refuses a task that no attempt of ours runs
        self._steer_once_committed(rt, command)
        return task

    # --- queues ---------------------------------------------------------------------------------

    def _set_queue_paused(self: Supervisor, name: str, paused: bool, now: float) -> bool:
        changed = queue_store.set_paused(self.conn, name, paused, now=now)
        (self.queues.paused.add if paused else self.queues.paused.discard)(name)
        if changed:
            self._outbox.append(lambda: log.info("queue_paused" if paused else "queue_resumed", queue=name))
        return changed

    def _set_queue_workers(self: Supervisor, name: str, workers: int) -> None:
        before = self.queues.workers[name]
        self.queues.workers[name] = workers
        self.idle.resize(self.queues.total_workers)
        self._outbox.append(lambda: log.info("queue_resized", queue=name, workers=workers, was=before))
