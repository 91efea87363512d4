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

import contextlib
import functools
import sqlite3
import threading
import time
from typing import Any, Callable, Protocol

import structlog

from daemon import faults, handoff, models, pipes, pool, processes, queues, templates
from daemon import leases, recovery
from daemon.engine import cleaning, event_loops, executor_processes
from daemon.engine.attempt import Attempt, Phase
from daemon.engine.database_faults import RidesOutDatabaseFaults
from daemon.engine.dispatching import Dispatches
from daemon.engine.other_hosts import FollowsOtherHosts
from daemon.engine.recording import RecordsAttempts
from daemon.engine.requests import TakesRequests
from daemon.engine.sending_ahead import SendsAhead
from daemon.engine.stopping import StopsAttempts
from daemon.engine.running import RunningAttempts
from daemon.config import Settings
from daemon.handoff import LoopHandoff
from daemon.notify import Notifier
from daemon.store import backend, db, tasks
from daemon.store import attempts as attempt_store
from daemon.store import queues as queue_store
from executors.registry import Registry

log = structlog.get_logger("fredica.supervisor")


class LoopIO(Protocol):
    """I/O the loop does beside its executors' pipes, on its own thread (the control socket,
    `ControlServer.serve(driven=True)`): waited on with them, stepped when ready."""

    def fileno(self) -> int: ...
    def next_step_in(self, now: float) -> float | None: ...
    def step(self) -> None: ...
    def flush(self) -> None: ...


class Supervisor(TakesRequests, Dispatches, RecordsAttempts, StopsAttempts, RidesOutDatabaseFaults, SendsAhead,
                 FollowsOtherHosts):
    """Owns the database connection and the executor subprocesses of one daemon. Its parts are
    mixins, each a module of daemon/engine/: this one holds its state and the loop."""

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
        self.conn = db.open_database(settings.database, synchronous=settings.synchronous,
                                     answer_timeout=settings.database_answer_timeout)
        processes.anchor_to(self.conn)  # before any process start is recorded or looked for
        self.registry = registry if registry is not None else Registry.from_config(settings.executors)
        templates.check_task_types(settings.templates, self.registry)
        queues.check_task_types(settings.all_queues, self.registry)
        self.queues = queues.Queues(settings.all_queues, paused=queue_store.paused(self.conn))
        executor_modules = [self.registry.ref(task_type).split(":")[0] for task_type in self.registry]
        self.context = executor_processes.make_context(settings.start_method, preload=executor_modules)
        self.running = RunningAttempts()  # with how many each queue runs, kept as they come and go
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
        self._woken_by_host = False  # the last wait drained a wake-up of another supervisor's
        # When the tick after the last whole one is due (time.monotonic: a step of the wall clock
        # must not put it off), and how many calls of the requests just run gave it nothing to do
        # (`_requests_were_all`).
        self._tick_due = 0.0
        self._calls_without_work = 0
        self._stop_requested = threading.Event()
        self._shutdown_deadline: float | None = None
        self._pending_grace = settings.shutdown_grace
        self._next_heartbeat = 0.0
        self.notifier = notifier if notifier is not None else Notifier({})
        self.finished_counts = {status: 0 for status in models.in_order(models.TERMINAL_STATUSES)}
        # SPEC §13: while the database cannot be written, what the loop still has to record waits
        # here: attempts that ended (their processes released) and, in `running`, their mirrors.
        self.fault: faults.WriteFault | None = None
        # Attempts of ticks whose COMMIT was in doubt, never given to a process (`_note_in_doubt`),
        # and whether this tick put back those whose rows that COMMIT made.
        self.in_doubt: list[models.Task] = []
        self._in_doubt_resolved = False
        self.endings_in_doubt: set[tuple[str, int]] = set()  # (task id, attempt) recorded in doubt
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
                self._wait_for_work(timeout)
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

    def _wait_for_work(self, timeout: float) -> None:
        """Wait up to `timeout` for something a tick must handle. A wake-up that only the control
        socket needed (a reply a handler thread made, a read request given to one, a connection
        accepted or closed) is served by `_wait`'s step and waited out again: a tick then would
        change nothing, since every change a tick acts on wakes the loop otherwise (requests and
        signals through the hand-off's pipe, executors through their pipes, another host through
        the listener) or is a deadline within `timeout`. Each such tick cost a transaction and a
        claim look: one per `wait` answered, the latency of the submit that follows it."""
        due = time.monotonic() + timeout
        while self._wait(timeout):
            timeout = due - time.monotonic()
            if timeout <= 0.0:
                return

    def _wait(self, timeout: float) -> bool:
        """Wait up to `timeout` for the handles a tick serves; whether only the control socket
        had anything (its step has served it). An early end with nothing ready is the socket's
        own deadline: the caller's timeout is not over."""
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
        woken_by_host = False
        if self.wakeups is not None:
            # Always: it also finds a dead listener and reconnects it (after its backoff). Every
            # tick claims what is claimable; what else another host's commit may have done is end
            # a task this loop runs (a cancel given there), looked at in the next tick.
            woken_by_host = self.wakeups.drain()
            if woken_by_host and (self.running or self.ahead):
                self._look_for_replaced = True
        self._woken_by_host = woken_by_host
        self._ready = set(ready)
        if not woken_by_host:
            self._ready.discard(self.wakeups)  # its own notifications only, or a reconnect's wait
        if self._handoff.wake_fd in ready:
            self._handoff.clear_wake_ups()
        if io is None:
            return False
        io.step()  # cheap when nothing is ready: one select with a zero timeout
        # Checked after the step: a request it read may have been handed over to this loop.
        return self._ready <= {io} and not woken_by_host and not self._handoff.pending()

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
                self._calls_without_work = 0
                with db.write(self.conn):
                    answers = self._handoff.run_calls(self.conn)
                self._handoff.answer(answers)
                if self.io is not None:
                    self.io.flush()  # answered before the tick's own work, not after it
                self._handoff.note_commit()
                calls, answers = len(answers), []
                self._stops = []  # committed: a rollback of what follows must not undo them
                queues_before = self.queues.state()  # nor the queues' pauses and sizes
                self._flush_outbox()  # the requests' commands to their processes
                if self._requests_were_all(calls):
                    return max(0.0, self._tick_due - time.monotonic())
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
            self._tick_due = 0.0  # rolled back: the next tick is a whole one
            self._in_doubt_resolved = False
            kind = faults.classify(exc)
            self._note_in_doubt(exc)
            self._roll_back_memory()
            self.queues.restore(queues_before)
            self.idle.resize(self.queues.total_workers)
            self._handoff.refuse(answers, faults.refusal(kind, exc) if kind is not None else exc)
            if kind is None:
                raise
            return self._on_database_fault(kind, exc, self.clock() if now is None else now)
        self._tick_due = time.monotonic() + timeout  # committed
        if self._in_doubt_resolved:
            self.in_doubt, self._in_doubt_resolved = [], False
        self._handoff.answer(answers)
        self._handoff.note_commit()
        if self.fault is not None:
            log.warning("database_fault_ended", seconds=round(now - self.fault.since, 3),
                        retries=self.fault.failed_retries + 1)
            self.fault = None
            db.set_busy_timeout(self.conn, db.BUSY_TIMEOUT)
        self._flush_outbox()
        return timeout

    def _requests_were_all(self, calls: int) -> bool:
        """Whether the `calls` just committed were all that woke the loop, and gave its tick
        nothing to do: submissions whose every new task waits for a dependency or is held, with
        no deadline of the last whole tick passed. Such a tick would only look for claims that
        cannot be there (BEGIN, one claim read, COMMIT), in front of the next request: a
        producer submitting a pipeline paid it once per call. Whatever else can change what a
        tick does wakes the loop through a handle of its own (an executor's pipe, another
        host's wake-up, a signal's request) or is one of those deadlines."""
        return (
            calls > 0 and self._calls_without_work == calls and self.fault is None and not self.in_doubt
            and self._ready is not None and self._ready <= {self._handoff.wake_fd, self.io}
            and not self._woken_by_host and not self._look_for_replaced
            and time.monotonic() < self._tick_due and not self._claims_left
            and not self._stop_requested.is_set() and not self._starts and not self.unrecorded
        )

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

    def _tick(self, now: float) -> float:
        if self.in_doubt:
            self._put_back_in_doubt(now)
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
        self._finish_all([rt for rt in self.running.values() if rt.is_over()], now)
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
            heartbeat_missed = attempt_store.heartbeat(self.conn, refs, now) < len(refs)
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

    def _guard(self, rt: Attempt, fn: Callable[..., Any], *args: Any, atomic: bool = False) -> bool:
        """Executor misbehaviour (and our own bugs around it) must never stop the loop. Whether
        `fn` ran to its end.

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
            return False
        return True

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

    # --- after the commit -----------------------------------------------------------------------

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        for action in outbox:
            try:
                action()
            except (Exception, SystemExit):  # each is independent: the rest must still be done
                log.exception("supervisor_error")
