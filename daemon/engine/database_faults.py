"""The supervisor while its database cannot be written (SPEC §13): a tick rolled back is undone
in memory, running tasks are watched and steered without writes, the write is retried (after a
reconnect, on PostgreSQL), and corruption ends every attempt and the daemon.

Apart from the loop because it is the one place that decides what a failed tick leaves behind:
the loop's own tick assumes its writes succeed.

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import structlog

from daemon import faults, processes
from daemon.engine.attempt import AHEAD, Phase
from daemon.errors import InvalidTransition
from daemon.store import db, tasks

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")


class RidesOutDatabaseFaults:
    """The loop while the database cannot be written (see the module docstring)."""

    # --- database faults (SPEC §13) -------------------------------------------------------------

    def _roll_back_memory(self: Supervisor) -> None:
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

    def _on_database_fault(self: Supervisor, kind: faults.Kind, exc: BaseException, now: float) -> float:
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

    def _reconnect(self: Supervisor, now: float) -> bool:
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

    def _note_in_doubt(self: Supervisor, exc: BaseException) -> None:
        """Before a tick whose COMMIT is in doubt (`faults.IN_DOUBT`) is undone in memory: the
        attempts it started or sent ahead, which no process was given (if the COMMIT was made,
        their rows are in flight under this supervisor with nothing behind them), and those whose
        endings it recorded (if it was made, recording them again finds their rows ended already,
        and what was to follow the commit, their hooks, must happen then)."""
        if getattr(exc, "in_doubt", False):
            self.in_doubt += [rt.task for rt in self._dispatched]
            self.endings_in_doubt |= {(rt.task.id, rt.task.attempt) for rt in self._finished}

    def _put_back_in_doubt(self: Supervisor, now: float) -> None:
        """Put back to pending the rows of the attempts noted in doubt that the COMMIT did make:
        each fenced to its own attempt, so that a row the COMMIT never made, or that moved on since
        (another host's cancel, a rescue, a later attempt), is left as it is. Only once the
        sessions lost are gone from the server: a session frozen with the COMMIT in its buffer
        could still make it after this look."""
        if not db.lost_sessions_ended(self.conn):
            return  # looked at again in the next tick
        for task in self.in_doubt:
            try:
                with db.savepoint(self.conn):
                    tasks.requeue(self.conn, task.id, now=now, known=task)
            except InvalidTransition:  # never made, or moved on (StaleAttempt too): as it is
                continue
            log.warning("attempt_in_doubt_put_back", task_id=task.id, attempt=task.attempt,
                        reason="its start was committed as the connection was lost; it was never given to a process")
        self._in_doubt_resolved = True

    def _tick_without_writes(self: Supervisor, now: float) -> float:
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

    def _timeout_without_writes(self: Supervisor, now: float) -> float:
        assert self.fault is not None
        deadlines = [self.fault.retry_at, *self._loops_due]
        for rt in self._attempts():
            # Not progress: it is written only by a write that succeeds (the retry).
            rt_deadlines = rt.deadlines(now, self.settings.progress_interval, self.settings.cancel_grace)
            deadlines += rt_deadlines[1:] if rt.progress is not None else rt_deadlines
        if self._shutdown_deadline is not None and self._shutdown_deadline > now:
            deadlines.append(self._shutdown_deadline)
        return max(0.0, min(deadlines) - now)

    def _end_on_corruption(self: Supervisor, exc: BaseException) -> None:
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
