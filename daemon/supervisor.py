"""The supervisor: claims ready tasks and runs each in its own executor subprocess (SPEC §6-§7).

The loop is `tick()`, one SQLite transaction: run the requests handed over by other threads, drain
the children's status channels, finish the attempts that ended, escalate cancels and timeouts,
flush coalesced progress, stamp heartbeats, then claim while a worker slot is free; after the
commit, answer the requests and hand the started tasks to their processes. `run()` is the thin
shell around it that sleeps in poll(2) on every child's channels and sentinel plus a wake-up pipe,
so a submission, a message or a child's exit wakes it at once; the timeout is only a fallback.

Only the loop thread touches the database connection: other threads call the public methods, which
hand the work to the loop (`daemon.handoff`) and wait for its answer.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import sqlite3
import threading
import time
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import structlog

from daemon import dispatch, faults, handoff, messages, models, outcomes, pipes, pool, processes, queues, templates
from daemon import leases, recovery
from daemon.engine import cleaning, event_loops, executor_processes
from daemon.engine.attempt import AHEAD, Attempt, Phase
from daemon.engine.other_hosts import FollowsOtherHosts
from daemon.engine.sending_ahead import SendsAhead
from daemon.config import Settings
from daemon.errors import InvalidTransition, StaleAttempt
from daemon.handoff import LoopHandoff
from daemon.models import Task
from daemon.notify import Notifier
from daemon.store import backend, db, runs, tasks
from daemon.store import ids as id_store
from daemon.store import queues as queue_store
from daemon.submission import TaskSpec, check_executors
from executors import assignment
from executors.registry import Registry

log = structlog.get_logger("fredica.supervisor")
T = TypeVar("T")

# Messages read from one child per tick: enough to keep up with any honest executor, small enough
# that a child flooding its channel cannot starve the others or the loop.
DRAIN_LIMIT = 2000
# Claims (and starts) of one tick at most, in each queue. Its attempts are handed to their processes only after
# its commit, and the control socket is served between ticks: a burst of 10,000 ready tasks in
# one tick would start none for seconds and leave every client waiting as long. The next tick
# follows at once while more are claimable.
CLAIMS_PER_TICK = 256
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


class LoopIO(Protocol):
    """I/O the loop does beside its executors' pipes, on its own thread (the control socket,
    `ControlServer.serve(driven=True)`): waited on with them, stepped when ready."""

    def fileno(self) -> int: ...
    def next_step_in(self, now: float) -> float | None: ...
    def step(self) -> None: ...
    def flush(self) -> None: ...


class Supervisor(SendsAhead, FollowsOtherHosts):
    """Owns the database connection and the executor subprocesses of one daemon."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: Registry | None = None,
        clock: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
        start_process: executor_processes.StartProcess = executor_processes.start_process,
    ) -> None:
        """`start_process`: how executor processes are started; a test gives fakes it scripts,
        and steps the loop with `tick(now)` (tests/fake_processes.py)."""
        self.settings = settings
        self.clock = clock
        self.conn = db.open_database(settings.database, synchronous=settings.synchronous)
        processes.anchor_to(self.conn)  # before any process start is recorded or looked for
        self.registry = registry if registry is not None else Registry.from_config(settings.executors)
        templates.check_task_types(settings.templates, self.registry)
        queues.check_task_types(settings.all_queues, self.registry)
        self.queues = queues.Queues(settings.all_queues, paused=queue_store.paused(self.conn))
        executor_modules = [self.registry.ref(task_type).split(":")[0] for task_type in self.registry]
        self.context = executor_processes.make_context(settings.start_method, preload=executor_modules)
        self.running: dict[str, Attempt] = {}
        self._init_sending_ahead(settings.all_queues)  # attempts sent ahead (a queue's prefetch)
        self.idle = pool.IdleProcesses(
            self.context, warm_spare=settings.warm_spare, spare_kind="fresh" if settings.tasks_per_process == 1 else "reused",
            settle_timeout=settings.cancel_grace, slots=self.queues.total_workers,
            idle_timeout=settings.idle_process_timeout, start_process=start_process,
        )
        # Each queue's own event-loop processes, started when an attempt first needs one.
        self.loops = {
            name: event_loops.EventLoops(self.context, queue=name, processes=queue.processes,
                                         block_limit=queue.loop_block_limit, start_process=start_process,
                                         idle_timeout=settings.idle_process_timeout)
            for name, queue in self.queues.configs.items()
        }
        self.started_at = clock()
        self._handoff = LoopHandoff()
        self._thread: threading.Thread | None = None
        self._outbox: list[Callable[[], None]] = []  # run after the tick's commit
        # The handles the last wait found ready; None: look at every child (no wait came first).
        self._ready: set[Any] | None = None
        self._stop_requested = threading.Event()
        self._shutdown_deadline: float | None = None
        self._pending_grace = settings.shutdown_grace
        self._next_heartbeat = 0.0
        self.notifier = notifier if notifier is not None else Notifier({})
        self.finished_counts = {status: 0 for status in models.in_order(models.TERMINAL_STATUSES)}
        # SPEC §13: while the database cannot be written, what the loop still has to record waits
        # here: attempts that ended (their processes released) and, in `running`, their mirrors.
        self.fault: faults.WriteFault | None = None
        self.unrecorded: list[Attempt] = []
        # What this tick did that its rollback must undo in memory: attempts it finished (back to
        # `unrecorded`) and attempts it dispatched (their processes back to the pool).
        self._finished: list[Attempt] = []
        self._dispatched: list[Attempt] = []
        self._stops: list[tuple[Attempt, Phase, str | None]] = []  # (attempt, as it was)
        self.exit_status = 0  # 1 once corruption ended the loop
        self.database_faults = 0  # write faults ridden out since start, each counted once
        self._corruption: BaseException | None = None
        # Whether a retry may be waiting out its backoff delay. Only this loop schedules retries
        # (the one writer), so once the database says none is, claims and timeouts skip looking
        # until one is scheduled again. True at first: recovery may have left some.
        self._delayed_possible = True
        self._loops_due: list[float] = []  # when to look at the event-loop processes' heartbeats
        # Told of each attempt whose outcome was committed (the HTTP server's metrics): keep them cheap.
        self.attempt_observers: list[Callable[[Attempt], None]] = []
        self.keep_finished = cleaning.KeepFinished(settings.keep_finished)
        self.io: LoopIO | None = None  # the control socket, when the loop drives it (`attach_io`)
        self._claims_left = False  # the last tick's claims stopped at CLAIMS_PER_TICK
        # On a shared PostgreSQL queue, this supervisor's lease, and the rescue of others' (SPEC §16).
        self.lease = leases.Lease(settings) if backend.is_postgres(settings.database) else None
        # There too, the others' commits that may have made a task claimable here wake this loop
        # (LISTEN/NOTIFY), rather than wait for its next poll; `[daemon] notify = false` polls only.
        self.wakeups: Any = None  # a wakeups.Listener
        self._init_other_hosts()
        if self.lease is not None:
            self.conn.notify_wakeups = settings.notify  # type: ignore[attr-defined]
            self.conn.notify_sender = settings.name  # type: ignore[attr-defined]
            if settings.notify:
                from daemon.store.postgres import wakeups

                self.wakeups = wakeups.Listener(str(settings.database), own_name=settings.name)

    # --- the API other threads use --------------------------------------------------------------

    def call(self, fn: Callable[[], T], timeout: float | None = CALL_TIMEOUT) -> T:
        """Run `fn` on the loop thread, in its transaction; its result once that is committed.
        While the database cannot be written, refused at once (every call writes)."""
        fault = self.fault
        if fault is not None:
            raise fault.refusal()
        return self._handoff.call(fn, timeout)

    def hand_over(self, fn: Callable[[], T], still_waiting: Callable[[], bool]) -> concurrent.futures.Future[T] | None:
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

    def commits(self) -> int:
        """How many transactions the loop has committed: see `wait_for_commit`."""
        return self._handoff.commits

    def wait_for_commit(self, seen: int, timeout: float) -> int:
        """Block (any thread but the loop's) until the loop commits after the `seen`-th commit."""
        return self._handoff.wait_for_commit(seen, timeout)

    def report_corruption(self, exc: BaseException) -> None:
        """A reader found the database corrupt: the loop ends the daemon (SPEC §13). Any thread."""
        if self._corruption is None:
            self._corruption = exc
        self.wake()

    def wake(self) -> None:
        """Make the loop tick now (safe from any thread and from signal handlers)."""
        self._handoff.wake()

    def submit(
        self, specs: Sequence[TaskSpec], *, template: str = "adhoc", material_id: str | None = None
    ) -> tasks.Submission:
        """Store a run with `specs` as its tasks, each in its queue (named, else routed by type);
        the loop claims them on its next tick. A queue that is not configured refuses it all."""
        check_executors(specs, self.registry)  # in the request's thread: the loop waits for none of it
        self.queues.check_specs(specs)
        return self.call(
            lambda: tasks.submit(self.conn, specs, now=self.clock(), template=template, material_id=material_id,
                                 routes=self.queues.routes)
        )

    def cancel(self, target_id: str) -> CancelReport:
        """Cancel a task, or every unfinished task of a run (SPEC §7)."""
        return self.call(lambda: self._cancel(target_id, self.clock()))

    def pause(self, task_id: str) -> Task:
        """Pause a running, pausable task: command its process to clear its resume Event, and
        record `is_paused`."""
        return self.call(lambda: self._set_paused(task_id, True, self.clock()))

    def resume(self, task_id: str) -> Task:
        """Resume a paused task: command its process to set its resume Event, and record
        `is_paused = 0`."""
        return self.call(lambda: self._set_paused(task_id, False, self.clock()))

    def set_queue_paused(self, name: str, paused: bool) -> bool:
        """Stop (or restart) claiming in a queue; its running tasks go on. Kept in the database,
        so it outlasts a restart. False if the queue already was so."""
        self.queues.require(name)
        return self.call(lambda: self._set_queue_paused(name, paused, self.clock()))

    def set_queue_workers(self, name: str, workers: int) -> None:
        """Resize a queue until the daemon stops (the config sets it at the next start). Fewer
        than it runs stops nothing: it claims again once fewer run than it may."""
        self.queues.require(name)
        queues.check_workers(f"queue {name}:", workers)
        queues.check_size(name, workers, self.queues.configs[name].types, self.registry)
        self.call(lambda: self._set_queue_workers(name, workers))

    def busy_by_queue(self) -> dict[str, int]:
        """How many attempts each queue runs now (any thread: a copy of the loop's view)."""
        return dict(collections.Counter(rt.task.queue for rt in list(self.running.values())))

    def reroute_waiting(self, now: float) -> None:
        """At start, after recovery: move waiting tasks to the queues this config routes them to
        (their type's route changed, or the queue they named is gone); one line says how many."""
        if self.lease is not None:
            # A shared queue: each supervisor serves the queues its own config lists (SPEC §16),
            # and the others' tasks are not this config's to move.
            return
        moved = queue_store.reroute(self.conn, self.queues.routes, self.queues.names, queues.DEFAULT)
        if moved:
            log.info("tasks_rerouted", tasks=sum(moved.values()), to_queues=moved)

    # --- lifecycle ------------------------------------------------------------------------------

    def attach_io(self, io: LoopIO) -> None:
        """Drive `io` from the loop thread: waited on beside the executors' pipes, stepped when it
        is ready, and flushed as soon as a commit has answered requests."""
        self.io = io

    def bind_loop_thread(self) -> None:
        """Say that this thread will call `run`: from now on a request from another thread waits
        for the loop, even before it starts (the daemon serves its socket first), rather than run
        at once on the caller's thread, beside the loop, on the loop's connection."""
        self._handoff.loop_ident = threading.get_ident()

    def start(self) -> None:
        """Run the loop in a background thread (tests and scripts; the daemon runs `run` itself)."""
        self._thread = threading.Thread(target=self.run, name="fredica-supervisor", daemon=True)
        self._thread.start()
        # Calls must not run on the caller's thread once the loop exists.
        while self._handoff.loop_ident is None and self._thread.is_alive():
            time.sleep(0.001)

    def request_stop(self, grace: float | None = None) -> None:
        """Stop claiming; let running tasks finish within `grace` seconds, then interrupt the rest
        and put them back to `pending`. Safe to call from a signal handler."""
        self._pending_grace = self.settings.shutdown_grace if grace is None else grace
        self._stop_requested.set()
        self.wake()

    def stop(self, grace: float | None = None, timeout: float | None = None) -> None:
        """request_stop and wait for the loop to end."""
        self.request_stop(grace)
        if self._thread is not None:
            self._thread.join(timeout)
        self._handoff.finished.wait(timeout)

    def run(self) -> None:
        """Tick until stopped; the shell around `tick`."""
        self.bind_loop_thread()
        try:
            while self.exit_status == 0:
                timeout = self.tick()
                if (self._shutdown_deadline is not None and not self.running and not self.ahead
                        and not self._record_at_exit()):
                    break
                self._wait(timeout)
        finally:
            # No step here may need the database (SPEC §13), and none may be skipped because
            # another failed: launchers left undismissed would keep this process from exiting.
            with contextlib.suppress(Exception):
                self._answer_the_last_calls()
            if self.io is not None:
                with contextlib.suppress(Exception):
                    self.io.flush()  # those answers: the loop waits no more to write them
            with contextlib.suppress(Exception):
                self.idle.dismiss_all()
            for loops in self.loops.values():
                with contextlib.suppress(Exception):
                    loops.dismiss_all()
            if self.lease is not None and self.exit_status == 0 and self.fault is None:
                with contextlib.suppress(Exception):
                    self.lease.release(self.conn)
            with contextlib.suppress(Exception):
                self.conn.close()
            if self.wakeups is not None:
                with contextlib.suppress(Exception):
                    self.wakeups.close()
            self._handoff.end()
            log.info("supervisor_stopped", exit_status=self.exit_status)

    def _record_at_exit(self) -> bool:
        """At shutdown, with attempts whose outcome a write fault kept from the database: whether
        to go on trying. Not past the shutdown deadline's second grace: recovery then reports
        them interrupted, each with a restart-log entry, rather than the daemon never exit."""
        if not self.unrecorded:
            return False
        assert self._shutdown_deadline is not None
        if self.clock() < self._shutdown_deadline + self.settings.cancel_grace:
            return True
        log.error("outcomes_not_recorded", tasks=[rt.task.id for rt in self.unrecorded],
                  reason="the database could not be written before the shutdown ended")
        return False

    def _answer_the_last_calls(self) -> None:
        """Answer whatever arrived during shutdown rather than leave it hanging."""
        if self.fault is not None or self.exit_status != 0:
            refusal = (self.fault.refusal() if self.fault is not None
                       else faults.refusal(faults.Kind.CORRUPT) if self.exit_status != 0  # 1: corruption ended it
                       else handoff.ShuttingDown("the daemon is stopping"))
            self._handoff.refuse_pending(refusal)
            return
        answers: list[handoff.Answer] = []
        try:
            with db.write(self.conn):
                answers = self._handoff.run_calls(self.conn)
        except sqlite3.Error as exc:
            refusal = faults.DatabaseFault(f"the database could not be written: {exc}")
            self._handoff.refuse(answers, refusal)
            self._handoff.refuse_pending(refusal)
            return
        self._handoff.answer(answers)

    def _wait(self, timeout: float) -> None:
        handles: list[Any] = [self._handoff.wake_fd]
        io = self.io
        if io is not None:
            io.flush()  # what this tick's commits (or refusals) answered
            if self._handoff.pending():
                # A connection whose reply just went out had its next request in already: handed
                # over from this thread, it woke nobody, and waits for the next tick.
                timeout = 0.0
            handles.append(io)
            io_due = io.next_step_in(time.monotonic())
            if io_due is not None:
                timeout = min(timeout, io_due)
        unsent: list[int] = []
        for process in {id(rt.process): rt.process for rt in self._attempts()}.values():
            handles += process.fds()
            fd = process.unsent()
            if fd is not None:
                unsent.append(fd)
        if self.wakeups is not None and self.wakeups.healthy:
            handles.append(self.wakeups)
        ready = pipes.ready(handles, max(0.0, timeout), writable=unsent)
        if self.wakeups is not None:
            # Always: it also finds a dead listener and reconnects it (after its backoff). Every
            # tick claims what is claimable; what else another host's commit may have done is end
            # a task this loop runs (a cancel given there), looked at in the next tick.
            if self.wakeups.drain() and self.running:
                self._look_for_replaced = True
        self._ready = set(ready)
        if self._handoff.wake_fd in ready:
            self._handoff.clear_wake_ups()
        if io is not None:
            io.step()  # cheap when nothing is ready: one select with a zero timeout

    # --- one tick -------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> float:
        """One pass of the loop; returns how long the loop may sleep before the next one.

        The requests handed over by other threads come first, in a short transaction of their own
        (one commit for all that arrived together), and are answered once it is committed, so
        that none waits behind claims and process starts. Everything else the tick writes is one
        more transaction (one commit, however many tasks it moves). What must not happen before
        a commit waits: a request is answered only once what it did is durable, and a task is
        sent to its executor process only once its `running` row, with that process's pid, is.
        """
        if self._corruption is not None:  # found by a reader of the database, on another thread
            self._end_on_corruption(self._corruption)
            return 0.0
        if self.fault is not None and (self.clock() if now is None else now) < self.fault.retry_at:
            return self._tick_without_writes(self.clock() if now is None else now)
        if self.fault is not None and db.is_lost(self.conn) and not self._reconnect(self.clock() if now is None else now):
            return self._tick_without_writes(self.clock() if now is None else now)
        answers: list[handoff.Answer] = []
        self._finished, self._dispatched, self._stops = [], [], []
        self._starts_recorded = []
        queues_before = self.queues.state()  # requests may change them: undone with the tick
        if self.conn.in_transaction:  # a ROLLBACK that failed: never build on a dead transaction
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
        try:
            if self._handoff.pending():
                with db.write(self.conn):
                    answers = self._handoff.run_calls(self.conn)
                self._handoff.answer(answers)
                if self.io is not None:
                    self.io.flush()  # answered before the tick's own work, not after it
                self._handoff.note_commit()
                answers = []
                self._stops = []  # committed: a rollback of what follows must not undo them
                queues_before = self.queues.state()  # nor the queues' pauses and sizes
                self._flush_outbox()  # the requests' commands to their processes
            with db.write(self.conn):
                # Requests that came since wait for the next tick's own transaction (the loop's
                # wake-up pipe says they are there): run here, their answer would wait behind this
                # tick's claims and process starts. The clock is read after the requests' commit:
                # a task submitted by a request is stamped before this tick's `now`, so
                # created_at <= claimed_at <= started_at always holds.
                now = self.clock() if now is None else now
                self._note_shutdown(now)
                timeout = self._tick(now)
        except BaseException as exc:
            kind = faults.classify(exc)
            self._roll_back_memory()
            self.queues.restore(queues_before)
            self.idle.resize(self.queues.total_workers)
            self._handoff.refuse(answers, faults.refusal(kind) if kind is not None else exc)
            if kind is None:
                raise
            return self._on_database_fault(kind, exc, self.clock() if now is None else now)
        self._handoff.answer(answers)
        self._handoff.note_commit()
        if self.fault is not None:
            log.warning("database_fault_ended", seconds=round(now - self.fault.since, 3),
                        retries=self.fault.failed_retries + 1)
            self.fault = None
            db.set_busy_timeout(self.conn, db.BUSY_TIMEOUT)
        self._flush_outbox()
        return timeout

    def _note_shutdown(self, now: float) -> None:
        if self._stop_requested.is_set() and self._shutdown_deadline is None:
            self._shutdown_deadline = now + self._pending_grace
            log.info("shutdown_started", running=len(self.running), grace=self._pending_grace)
            self.notifier.stopping(f"stopping: {len(self.running)} tasks still running")
            # A task its user paused cannot finish within the grace: put back (held) at once.
            for rt in list(self.running.values()):
                if rt.paused_since is not None and rt.paused_by == "user":
                    self._request_stop(rt.task.id, "shutdown", now)
            for rt in list(self.ahead.values()):  # sent ahead: none may start now
                self._revoke(rt, "shutdown", now)

    # --- database faults (SPEC §13) -------------------------------------------------------------

    def _roll_back_memory(self) -> None:
        """The tick's transaction was rolled back: undo in memory what it assumed committed."""
        self._outbox = []  # hand-overs, hooks, counts and requests' commands: none happened
        for rt in reversed(self._dispatched):  # never given their task
            if rt.phase is Phase.PREFETCHED:  # its process is its lane's, busy with another
                self._withdraw_ahead(rt)
                continue
            self.running.pop(rt.task.id, None)
            self._pool_of(rt.process).put_back(rt.process)
        self._undo_starts()
        # Attempts that ended stay ended (their processes are released): only the records are
        # lost, and made again once the database takes writes.
        self.unrecorded += [rt for rt in self._finished if rt not in self.unrecorded]
        for rt in [*self.running.values(), *self.unrecorded]:
            rt.mirror_lost()
        for rt, phase, reason in reversed(self._stops):  # users' cancels, refused
            rt.undo_revoke(phase, reason) if phase in AHEAD or not rt.ran else rt.undo_stop(phase, reason)
        self._finished, self._dispatched, self._stops = [], [], []
        # What the rolled-back reads let the loop conclude may be untrue: look again.
        self._delayed_possible = True
        self.keep_finished.undo()
        self._next_heartbeat = 0.0
        if self.lease is not None:
            self.lease.rolled_back()

    def _on_database_fault(self, kind: faults.Kind, exc: BaseException, now: float) -> float:
        if kind is faults.Kind.CORRUPT:
            self._end_on_corruption(exc)
            return 0.0
        if self.fault is None:
            self.fault = faults.WriteFault.start(kind, exc, now)
            self.database_faults += 1
            # A retry must not hold the loop for the whole busy timeout while another process
            # keeps the write lock: tasks still need watching between retries.
            db.set_busy_timeout(self.conn, faults.RETRY_BUSY_TIMEOUT)
            log.error("database_fault", kind=kind.value, error=str(exc), running=len(self.running))
        else:
            self.fault.retry_failed(kind, exc, now)
        if self.notifier.enabled:
            self.notifier.tick(now, self.summary())
        return self._timeout_without_writes(now)

    def _reconnect(self, now: float) -> bool:
        """A lost connection (PostgreSQL's server restarted): a new session before the retry;
        False, the retry counted as failed, while the server cannot be reached."""
        try:
            db.reconnect(self.conn)
        except Exception as exc:
            kind = faults.classify(exc)
            if kind is None:
                raise
            assert self.fault is not None
            self.fault.retry_failed(kind, exc, now)
            return False
        log.info("database_reconnected", after=round(now - self.fault.since, 3) if self.fault else None)
        if self.lease is not None:
            self.lease.reconnected(now)
        return True

    def _tick_without_writes(self, now: float) -> float:
        """A tick while the database cannot be written: requests refused, running tasks watched
        and steered, ended attempts kept in memory, nothing claimed."""
        assert self.fault is not None
        self._handoff.refuse_pending(self.fault.refusal())
        self._note_shutdown(now)
        self._finished = []
        self._drain_all(now)
        self._settle_ahead(now, self._conclude)
        for rt in list(self.running.values()):
            if rt.is_over():
                self._guard(rt, self._conclude, rt, now)
        self.unrecorded += self._finished
        self._finished = []
        self._ready = None
        for rt in list(self.running.values()):
            # Most attempts have no deadline to enforce (running, no timeout): not one guarded
            # call each per tick, which 10,000 attempts at once in event-loop processes pay.
            if rt.phase is not Phase.RUNNING or rt.task.timeout is not None:
                self._guard(rt, self._enforce_deadlines, rt, now)
        self._loops_due = [due for loops in self.loops.values() for due in loops.watch(now)]
        if self._shutdown_deadline is not None and now >= self._shutdown_deadline:
            self._interrupt_all(now)
        self._flush_outbox()  # stop commands: they wait for no commit
        if self.notifier.enabled:
            self.notifier.tick(now, self.summary())
        return self._timeout_without_writes(now)

    def _timeout_without_writes(self, now: float) -> float:
        assert self.fault is not None
        deadlines = [self.fault.retry_at, *self._loops_due]
        for rt in self._attempts():
            # Not progress: it is written only by a write that succeeds (the retry).
            rt_deadlines = rt.deadlines(now, self.settings.progress_interval, self.settings.cancel_grace)
            deadlines += rt_deadlines[1:] if rt.progress is not None else rt_deadlines
        if self._shutdown_deadline is not None and self._shutdown_deadline > now:
            deadlines.append(self._shutdown_deadline)
        return max(0.0, min(deadlines) - now)

    def _end_on_corruption(self, exc: BaseException) -> None:
        """Corruption: no more claims or writes; every attempt's process tree is ended, and the
        loop ends with exit status 1 within cancel_grace (SPEC §13)."""
        log.critical("database_corrupt", error=str(exc), database=str(self.settings.database),
                     running=len(self.running), action="ending every attempt and exiting")
        self.exit_status = 1
        roots = []
        for rt in self.running.values():
            if rt.task.executor_pid is not None and rt.task.executor_started_at is not None:
                found = processes.find_leftover(rt.task.executor_pid, rt.task.executor_started_at)
                if found is not None:
                    roots.append(found)
        # SIGTERM, then SIGKILL what is left half-way to the promised bound.
        processes.end_process_trees(roots, self.settings.cancel_grace / 2)
        for rt in list(self._attempts()):  # a launcher is no part of its attempt's tree
            with contextlib.suppress(Exception):
                rt.process.kill()
                rt.process.reap(1.0)
                rt.process.close()
        self.running.clear()
        self.ahead.clear()  # recovery fails them INTERRUPTED: their process may have started them

    def _tick(self, now: float) -> float:
        if self._starts:  # started while the database could not be written: recorded first
            self._record_starts(now)
        if self.unrecorded:  # ended while the database could not be written
            ended, self.unrecorded = self.unrecorded, []
            self._finished += ended  # all of them back to `unrecorded` if this tick is rolled back
            for rt in ended:
                self._record(rt)
        self._drain_all(now)
        if self.ahead:
            self._settle_ahead(now, self._finish)
            self._record_starts(now)
        for rt in list(self.running.values()):
            if rt.is_over():
                self._guard(rt, self._finish, rt, now)
        self._ready = None
        for rt in list(self.running.values()):
            # Most attempts have no deadline to enforce (running, no timeout): not one guarded
            # call each per tick, which 10,000 attempts at once in event-loop processes pay.
            if rt.phase is not Phase.RUNNING or rt.task.timeout is not None:
                self._guard(rt, self._enforce_deadlines, rt, now)
        self._loops_due = [due for loops in self.loops.values() for due in loops.watch(now)]
        self._write_mirrors(now)
        heartbeat_missed = False
        if now >= self._next_heartbeat and self.running:
            refs = [tasks.AttemptRef.of(rt.task) for rt in self.running.values()]
            heartbeat_missed = tasks.heartbeat(self.conn, refs, now) < len(refs)
            self._next_heartbeat = now + self.settings.heartbeat_interval
        self._follow_other_hosts(now, heartbeat_missed=heartbeat_missed)  # a read, not a heartbeat's write
        if self.lease is not None:
            for rescue in self.lease.tick(self.conn, now):
                self._outbox.append(functools.partial(recovery.undo_interrupted, self.registry, rescue.interrupted))
        if self._shutdown_deadline is None:
            self._claim(now)
            self.idle.tick(now)
            for loops in self.loops.values():
                loops.tick(now)
            self._remove_finished(now)
        else:
            self._claims_left = False  # nothing more is claimed: no reason to tick at once
            if now >= self._shutdown_deadline:
                self._interrupt_all(now)
        if self.notifier.enabled:
            # The time of the ping, not of the tick's start: a tick that started a fork server
            # took long, and the next ping must be spaced from when this one was sent.
            self.notifier.tick(self.clock(), self.summary())
        return self._next_timeout(now)

    def _remove_finished(self, now: float) -> None:
        """A chunk of `keep_finished`'s pass, when one is due; its logs go after the commit."""
        if not self.keep_finished.due(now):
            # Nothing to write: it only notes what a rolled-back tick goes back to. No savepoint,
            # whose two statements every tick would otherwise pay (one in ten of a W3 link's).
            self.keep_finished.tick(self.conn, now)
            return
        try:
            with db.savepoint(self.conn):
                removed = self.keep_finished.tick(self.conn, now)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            log.exception("finished_runs_not_removed")  # a bug of ours: try again at the next pass
            self.keep_finished.next_at = now + self.keep_finished.every
            return
        if removed is not None and removed.task_ids:
            self._outbox.append(functools.partial(cleaning.remove_logs, self.settings.task_log, removed.task_ids))

    def summary(self) -> str:
        """One line for systemd's STATUS: what the daemon is doing."""
        done = self.finished_counts
        state = "stopping" if self._shutdown_deadline is not None else "running"
        if self.fault is not None:
            state += "; " + self.fault.summary(self.clock())
        return (
            f"{state}: {len(self.running)}/{self.queues.total_workers} workers busy; since start "
            + ", ".join(f"{count} {status}" for status, count in done.items())
        )

    def _guard(self, rt: Attempt, fn: Callable[..., Any], *args: Any, atomic: bool = False) -> None:
        """Executor misbehaviour (and our own bugs around it) must never stop the loop.

        `atomic`: `fn` writes several statements, undone together if it fails (the others are
        single statements, atomic anyway).
        """
        try:
            with db.savepoint(self.conn) if atomic else contextlib.nullcontext():
                fn(*args)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise  # the database's fault, not the task's: the whole tick is rolled back
            rt.log.exception("supervisor_error")

    def _free(self, queue: str, busy: Mapping[str, int]) -> int:
        """How many more attempts `queue` may start now (none, or less than none, when shrunk),
        `busy` being `busy_by_queue()`: counted once per pass, not once per queue."""
        return self.queues.workers[queue] - busy.get(queue, 0)

    def _claim(self, now: float) -> None:
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

    def _dispatch_claimed(self, task: Task, now: float) -> None:
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

    def _next_timeout(self, now: float) -> float:
        """How long the loop may sleep. Reading the earliest delayed retry here is also what
        clears `_delayed_possible` when there is none."""
        s = self.settings
        if self._claims_left:
            return 0.0
        timeout = s.poll_interval if self.running else s.idle_poll_interval
        deadlines = []
        busy = self.busy_by_queue() if self._delayed_possible else {}
        if self._delayed_possible and any(self._free(name, busy) > 0 for name in self.queues.claimable()):
            # A delay matters with a free worker.
            ready_at = tasks.next_ready_at(self.conn)
            if ready_at is not None:
                deadlines.append(ready_at)
            else:
                self._delayed_possible = False
        for rt in self._attempts():
            deadlines += rt.deadlines(now, s.progress_interval, s.cancel_grace)
        deadlines += self._loops_due
        if self.keep_finished.next_at is not None and self._shutdown_deadline is None:
            deadlines.append(self.keep_finished.next_at)
        if self.lease is not None:
            deadlines.append(self.lease.next_at)
            if self.running or self.ahead:
                deadlines.append(self._next_look)  # what other hosts asked of our attempts
        if self._shutdown_deadline is not None and self._shutdown_deadline > now:
            deadlines.append(self._shutdown_deadline)
        ping_at = self.notifier.next_update()
        if ping_at is not None:
            deadlines.append(ping_at)
        if deadlines:
            timeout = min(timeout, max(0.0, min(deadlines) - now))
        return timeout

    # --- dispatch -------------------------------------------------------------------------------

    def _dispatch(self, task: Task, now: float) -> None:
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
        attempt = dataclasses.replace(started, payload=task.payload)
        self._outbox.append(lambda: self._hand_over(rt, attempt, upstream, last, now))

    def _hand_over(self, rt: Attempt, attempt: Task, upstream: dict[str, Any], last: bool, now: float) -> None:
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
        self, process: executor_processes.ExecutorProcess, attempt: Task, upstream: dict[str, Any], **options: Any
    ) -> str:
        """Send `attempt` to `process`, recorded as the one that runs it; its token."""
        return process.assign(
            attempt, self.registry.ref(attempt.type), upstream, self.settings.task_log(attempt.id),
            process=(attempt.executor_pid, attempt.executor_started_at),  # as recorded
            limits=assignment.Limits(self.settings.max_result_bytes, self.settings.max_task_log_bytes),
            cancel_grace=self.settings.cancel_grace, **options,
        )

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        for action in outbox:
            try:
                action()
            except (Exception, SystemExit):  # each is independent: the rest must still be done
                log.exception("supervisor_error")

    # --- messages from a child ------------------------------------------------------------------

    def _pool_of(self, process: executor_processes.ExecutorProcess) -> Any:
        """Where a process goes back once an attempt of it is over: the shared event-loop
        processes, or the idle pool."""
        if isinstance(process, executor_processes.EventLoopProcess):
            return self.loops[process.queue]
        return self.idle

    def _drain_all(self, now: float) -> None:
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
        self, process: executor_processes.ExecutorProcess, attempts: dict[str, Attempt], now: float,
        limit: int | None, *, check_exit: bool | None = None,
    ) -> None:
        """Apply what `process` said to the `attempts` it holds (by token), and its exit to all."""
        going = {token: rt for token, rt in attempts.items() if rt.phase not in (Phase.EXITED, Phase.ENDED)}
        if not going:
            return
        if check_exit is None:  # not when the last wait saw the process still running
            check_exit = self._ready is None or process.sentinel in self._ready
        drained = process.drain(limit, check_exit=check_exit)
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

    def _write_mirrors(self, now: float, only: Attempt | None = None) -> None:
        """Write what the task rows mirror of running attempts: pause states at once, progress at
        most every progress_interval per task (`only`: that attempt's, whatever its age)."""
        attempts = [only] if only else list(self.running.values())
        dirty = [rt for rt in attempts if rt.mirror_dirty]
        if dirty:
            written = tasks.record_pause_states(self.conn, [
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
            if rt.progress is not None and (only or now - rt.progress_written_at >= self.settings.progress_interval)
        ]
        if not due:
            return
        written = tasks.record_progress(
            self.conn, [(tasks.AttemptRef.of(rt.task), rt.progress[0], rt.shown_text(rt.progress[1])) for rt in due])
        _note_stale(written, due, "progress")
        for rt in due:
            rt.progress = None
            rt.progress_written_at = now

    # --- ending an attempt ----------------------------------------------------------------------

    def _finish(self, rt: Attempt, now: float) -> None:
        """The attempt is over: release its process, then record its outcome."""
        self._conclude(rt, now)
        self._record(rt)

    def _conclude(self, rt: Attempt, now: float) -> None:
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

    def _record(self, rt: Attempt) -> None:
        """Record an ended attempt's outcome (SPEC §6), as of when it ended."""
        assert rt.ended_at is not None
        if not rt.start_recorded and rt.ran:  # sent ahead, started while the database could not be written
            self._record_starts(rt.ended_at)
        try:
            with db.savepoint(self.conn):  # its statements are undone together if one fails
                if not rt.start_recorded:  # sent ahead, and never started
                    self._record_unstarted(rt)
                    return
                self._write_mirrors(rt.ended_at, only=rt)
                self._note(outcomes.record_attempt(self.conn, self.settings, rt, rt.ended_at))
                self._outbox.extend(functools.partial(observe, rt) for observe in self.attempt_observers)
        except InvalidTransition:
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

    def _count_finished(self, status: str) -> None:
        self.finished_counts[status] += 1

    def _note(self, recorded: outcomes.Recorded) -> None:
        """Count what `outcomes.record` did, and queue its hook, once that is committed."""
        if recorded.retried:
            self._delayed_possible = True
        if recorded.finished is not None:
            self._outbox.append(functools.partial(self._count_finished, recorded.finished))
        if recorded.hook is not None:
            self._outbox.append(recorded.hook)  # the hook sees the failure committed

    # --- cancel, pause, deadlines ---------------------------------------------------------------

    def _cancel(self, given_id: str, now: float) -> CancelReport:
        # Resolved here, in the loop's transaction: the prefix names what exists when it acts.
        named = id_store.resolve(self.conn, given_id)
        target_id = named.id
        if named.kind == "run":
            run = runs.get(self.conn, target_id)
            outcome = tasks.cancel_waiting_in_run(self.conn, target_id, now=now)
            for task_id in outcome.cancelled:  # those sent ahead are cancelled: their processes must know
                if task_id in self.ahead:
                    self._revoke(self.ahead[task_id], "cancelled", now, requested=True)
            stopping = [task_id for task_id in outcome.running
                        if self._request_stop(task_id, "cancel", now, requested=True)]
            if not outcome.cancelled and not stopping:
                raise InvalidTransition(target_id, run.status.value, models.TaskStatus.CANCELLED.value,
                                        f"workflow run {target_id} is {run.status.value}: nothing to cancel")
            log.info("run_cancelled", run_id=target_id, cancelled=len(outcome.cancelled), stopping=len(stopping))
            return CancelReport(outcome.cancelled, tuple(stopping), run=target_id)
        task = tasks.get(self.conn, target_id)
        dependents = tasks.active_downstream(self.conn, task.id)
        if self._request_stop(task.id, "cancel", now, requested=True):
            return CancelReport((), (task.id,), dependents)
        if any(rt.task.id == task.id for rt in self.unrecorded):
            raise InvalidTransition(task.id, task.status.value, models.TaskStatus.CANCELLED.value,
                                    f"task {task.id} has just ended: its outcome is being recorded")
        tasks.cancel(self.conn, task.id, now=now)
        log.info("task_cancelled", task_id=task.id, run_id=task.workflow_run_id, by="user", dependents=dependents)
        return CancelReport((task.id,), (), dependents)

    def _request_stop(self, task_id: str, reason: str, now: float, *, requested: bool = False) -> bool:
        """Ask a running task's executor to stop; False if no executor of ours runs it.

        `requested`: for a user's request, whose effects wait for its tick's commit (rolled back,
        it must have done nothing); a timeout or a shutdown acts at once.
        """
        rt = self.running.get(task_id)
        if rt is None:
            ahead = self.ahead.get(task_id) if self.ahead else None
            if ahead is not None and reason != "timeout":
                self._revoke(ahead, reason, now, requested=requested)
                return True
            return False
        before = (rt.phase, rt.stop_reason)
        if not rt.request_stop(reason, now):
            # Stopping already, or over: an attempt that has reported its result (or whose
            # process has exited) ended as it said, whatever comes now.
            return True
        if requested:
            # Decided now, so that an attempt ending in this same tick is recorded as stopped;
            # undone if the tick is rolled back, and the process told only once it is committed.
            self._stops.append((rt, *before))
        if requested:
            self._outbox.append(functools.partial(self._tell_to_stop, rt, reason, now))
        else:
            self._tell_to_stop(rt, reason, now)
        return True

    def _tell_to_stop(self, rt: Attempt, reason: str, now: float) -> None:
        if self.running.get(rt.task.id) is not rt:
            return  # ended meanwhile, in the tick of the request: nothing left to stop
        # Sets the resume Event too, so a paused executor wakes up to see the cancel.
        rt.process.request_cancel(reason, rt.token)
        rt.note_resumed(now)
        rt.log.info("task_stop_requested", reason=reason)

    def _enforce_deadlines(self, rt: Attempt, now: float) -> None:
        if rt.phase is Phase.RUNNING:
            if rt.task.timeout is not None and rt.active_seconds(now) >= rt.task.timeout:
                self._request_stop(rt.task.id, "timeout", now)
            return
        rt.escalate(now, self.settings.cancel_grace)

    def _set_paused(self, given_id: str, paused: bool, now: float) -> Task:
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

    def _set_queue_paused(self, name: str, paused: bool, now: float) -> bool:
        changed = queue_store.set_paused(self.conn, name, paused, now=now)
        (self.queues.paused.add if paused else self.queues.paused.discard)(name)
        if changed:
            self._outbox.append(lambda: log.info("queue_paused" if paused else "queue_resumed", queue=name))
        return changed

    def _set_queue_workers(self, name: str, workers: int) -> None:
        before = self.queues.workers[name]
        self.queues.workers[name] = workers
        self.idle.resize(self.queues.total_workers)
        self._outbox.append(lambda: log.info("queue_resized", queue=name, workers=workers, was=before))

    # --- shutdown -------------------------------------------------------------------------------

    def _interrupt_all(self, now: float) -> None:
        for task_id in list(self.running):
            self._request_stop(task_id, "shutdown", now)


def _note_stale(written: int, attempts: Sequence[Attempt], write: str) -> None:
    """Log the writes about attempts that are no longer their tasks' current ones (fenced out:
    rescued while this supervisor was taken for dead), which changed nothing."""
    if written < len(attempts):
        log.warning("stale_attempt_write_ignored", write=write, ignored=len(attempts) - written,
                    tasks=[rt.task.id for rt in attempts])
