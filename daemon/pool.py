"""The executor processes waiting for an attempt: the warm spare kept among them, the bound on how
many processes there are (SPEC §13: the worker slots plus the spare), and the trimming of those
idle for longer than `idle_process_timeout`."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import structlog

from daemon import pipes
from daemon.engine import executor_processes
from daemon.engine.executor_processes import ExecutorContext, ExecutorProcess

log = structlog.get_logger("fredica.supervisor")
# How long a dispatch may wait for a launcher to report its last fork's exit (normally about a
# millisecond) before it starts a new process instead (which takes some 60 ms).
SETTLE_WAIT = 0.05
# At the bound no process may be started beside the ones there are, so a dispatch waits longer
# for one of them to report before it ends the slowest to make room (starting its replacement
# costs about as long again): far less than a stuck fork's settle_timeout.
BOUND_WAIT = 0.5
# A spare that fails to start (a fork server that cannot import an executor's module, no memory,
# no pids left) is tried again after a delay that doubles up to the maximum, not at every tick:
# under a stream of tasks that would be a failed fork and a traceback in the log each millisecond.
SPARE_RETRY_FIRST = 1.0
SPARE_RETRY_MAX = 60.0


class IdleProcesses:
    """Executor processes waiting for work: the warm spare, launchers between attempts, and (with
    tasks_per_process > 1) processes whose last attempt has reported.

    It also counts the processes it has handed out and not yet got back, so that those and the
    idle ones together never outnumber `slots` (the worker slots) plus the warm spare. Used by
    the supervisor's loop thread only.
    """

    def __init__(
        self,
        context: ExecutorContext,
        *,
        warm_spare: bool,
        spare_kind: str,
        settle_timeout: float,
        slots: int,
        idle_timeout: float,
        monotonic: Callable[[], float] = time.monotonic,
        start_process: executor_processes.StartProcess = executor_processes.start_process,
    ) -> None:
        self._context = context
        self._start_process = start_process  # a test's fake processes (tests/fake_processes.py)
        self._warm_spare = warm_spare
        self._spare_kind = spare_kind  # what most tasks will need
        self._settle_timeout = settle_timeout
        self._limit = slots + (1 if warm_spare else 0)
        self._idle_timeout = idle_timeout
        # Settling is a matter of real milliseconds, waited for in poll(2): it has a clock of its
        # own (a test's to step); idleness is measured in the loop's `now`, as its other timers are.
        self._monotonic = monotonic
        self._processes: list[ExecutorProcess] = []  # oldest first
        self._returned_at: dict[int, float] = {}  # pid -> when put back (self._monotonic())
        self._idle_since: dict[int, float] = {}  # pid -> the first `tick`'s `now` that saw it idle
        self._lent: list[ExecutorProcess] = []  # handed out by `take`, not put back
        self._spare_failures = 0  # spare starts failed in a row
        self._spare_retry_at = 0.0  # the loop's `now` before which no spare is started again

    def __iter__(self) -> Iterator[ExecutorProcess]:
        return iter(list(self._processes))

    # --- the supervisor's calls -----------------------------------------------------------------

    def take(self, kind: str) -> ExecutorProcess:
        """An idle process of `kind` ("fresh": a launcher; "reused"); started if none waits.

        A launcher whose last attempt has sent its result may not have reported that fork's exit
        yet (the fork is tearing down, then the next is forked): it is taken once it has. If none
        is ready, one put back a moment ago is waited for briefly, which is cheaper than starting
        a process; at the bound, any unsettled one is waited for, and the slowest ended if none
        reports (`_make_room`).
        """
        process = self._settled(kind)
        if process is None and self._unsettled(kind, recent=True):
            self._wait_for_reports(kind, SETTLE_WAIT)
            process = self._settled(kind)
        if process is None and not self._has_room():
            process = self._make_room(kind)
        if process is None:
            process = self._start_process(self._context, kind)
        self._lent.append(process)
        return process

    def put_back(self, process: ExecutorProcess) -> None:
        """A process whose attempt is over and that takes another (or that was given nothing)."""
        self._processes.append(process)
        self._returned_at[process.pid] = self._monotonic()
        if process in self._lent:
            self._lent.remove(process)

    def resize(self, slots: int) -> None:
        """Change the number of worker slots (`fredica queue workers`): idle processes over the
        new bound end now; busy ones are counted against it as they come back (`_trim`)."""
        self._limit = slots + (1 if self._warm_spare else 0)
        self._shed_excess()

    def tick(self, now: float) -> None:
        """Run every tick of the loop: read the reports idle launchers sent, end the processes
        idle for longer than the timeout, and start the spare if none waits.

        Costs a poll of each idle process's sentinel, plus a read of the report pipe of those
        put back since their report came, unless one must be ended or started.
        """
        self._end_stuck_forks()
        for process in list(self._processes):
            # The report is read here, not left for `take`: unread, a launcher that reported
            # long ago would look stuck in its fork's exit, and a spare would be started beside
            # it at every tick past SETTLE_WAIT (34 launchers for 2 slots, never trimmed).
            process.settled()
            if process.ending or not process.is_alive():
                self._drop_dead(process)  # newer ones are taken first: it would stay forever
            else:
                self._idle_since.setdefault(process.pid, now)
        self._trim(now)
        self._keep_a_spare(now)

    def dismiss_all(self) -> None:
        """End every idle process (they exit when their assignment pipe closes)."""
        processes, self._processes = self._processes, []
        self._returned_at.clear()
        self._idle_since.clear()
        for process in processes:
            process.dismiss()

    # --- choosing and waiting -------------------------------------------------------------------

    def _settled(self, kind: str) -> ExecutorProcess | None:
        """The newest idle process of the kind that is ready for an attempt, removed from the
        pool; dead ones met on the way are dropped."""
        # Newest first: a process that has just finished an attempt is reused before the spare,
        # and the ones left unused grow old and are trimmed.
        for process in reversed([p for p in self._processes if p.kind == kind]):
            if not process.settled():
                continue
            if process.usable():
                self._remove(process)
                return process
            self._drop_dead(process)
        return None

    def _unsettled(self, kind: str, *, recent: bool = False) -> list[ExecutorProcess]:
        """Idle launchers of the kind still to report their last fork's exit (only those put back
        less than SETTLE_WAIT ago if `recent`), oldest first."""
        return [
            p for p in self._processes
            if p.kind == kind and p.awaiting_report and (not recent or self._age(p) < SETTLE_WAIT)
        ]

    def _wait_for_reports(self, kind: str, timeout: float) -> None:
        waiting = [p.reports for p in self._unsettled(kind) if p.reports is not None and not p.reports.closed]
        if waiting:
            pipes.ready(waiting, timeout)

    def _has_room(self) -> bool:
        """Whether one more process may be started without passing the bound."""
        self._lent = [p for p in self._lent if p.is_alive()]  # those the supervisor ended
        return len(self._processes) + len(self._lent) < self._limit

    def _make_room(self, kind: str) -> ExecutorProcess | None:
        """At the bound, with no idle process of the kind ready: an idle one of the other kind is
        ended; else the launchers still to report are waited for (BOUND_WAIT), and, if none has
        reported by then, the oldest is ended. A process that has reported is returned."""
        others = [p for p in self._processes if p.kind != kind]
        if others:
            self._end(others[0], "other_kind")
            return None
        # One wait, which ends at the first report: any that came then is taken.
        self._wait_for_reports(kind, BOUND_WAIT)
        process = self._settled(kind)
        if process is not None:
            return process
        if self._processes:
            self._end(self._processes[0], "no_report")
        return None

    def _keep_a_spare(self, now: float) -> None:
        """Start the next task's process now, while nothing waits for it."""
        if not self._warm_spare:
            return
        for process in self._processes:
            if process.kind != self._spare_kind:
                continue  # of the other kind (a launcher a fresh-process task left): no spare
            if not process.awaiting_report or self._age(process) < SETTLE_WAIT:
                return  # ready, or about to be
        if not self._has_room():
            return  # every slot busy and an idle one slow to report: it is the spare
        if now < self._spare_retry_at:
            return
        try:
            spare = self._start_process(self._context, self._spare_kind)
        except Exception:
            self._spare_failures += 1
            delay = min(SPARE_RETRY_MAX, SPARE_RETRY_FIRST * 2 ** (self._spare_failures - 1))
            self._spare_retry_at = now + delay
            log.exception("spare_executor_failed", failures=self._spare_failures, retry_in=delay)
            return
        self._spare_failures, self._spare_retry_at = 0, 0.0
        self._processes.append(spare)
        self._idle_since[spare.pid] = now

    # --- ending ---------------------------------------------------------------------------------

    def _trim(self, now: float) -> None:
        """End the processes idle for longer than the timeout (the spare too: `_keep_a_spare` then
        starts a fresh one, so nothing an idle process holds lasts for ever)."""
        for process in list(self._processes):
            if now - self._idle_since.get(process.pid, now) > self._idle_timeout:
                self._end(process, "idle_timeout")
        if len(self._processes) + len(self._lent) > self._limit:  # cheap: no process is asked
            self._shed_excess()

    def _shed_excess(self) -> None:
        """After the slots were cut: end the oldest idle processes while there are more processes
        than the bound."""
        self._lent = [p for p in self._lent if p.is_alive()]
        while self._processes and len(self._processes) + len(self._lent) > self._limit:
            self._end(self._processes[0], "over_bound")

    def _end_stuck_forks(self) -> None:
        """A launcher whose fork sent its result long ago but has not exited (stuck in its own
        shutdown): end that fork, so that the launcher reports and can be used again."""
        for process in self._processes:
            if process.awaiting_report and self._age(process) > self._settle_timeout and not process.settled():
                log.warning("executor_stuck_after_result", pid=process.attempt_process[0] if process.attempt_process else None, task_id=process.task_id)
                process.kill_attempt()
                self._returned_at[process.pid] = self._monotonic()

    def _end(self, process: ExecutorProcess, reason: str) -> None:
        """Dismiss an idle process (a launcher exits within milliseconds; one whose fork is still
        exiting is killed, which its attempt, over, no longer minds)."""
        self._remove(process)
        log.debug("idle_executor_ended", pid=process.pid, reason=reason)
        if process.awaiting_report:
            process.kill()
        process.dismiss()

    def _drop_dead(self, process: ExecutorProcess) -> None:
        """Forget a process that died or is ending, reaping it if it has ended."""
        self._remove(process)
        log.warning("idle_executor_lost", pid=process.pid, exit=executor_processes.describe_exit(process.exitcode))
        if process.is_alive():
            process.dismiss()  # an ending launcher: exits at once
        else:
            process.close()

    def _age(self, process: ExecutorProcess) -> float:
        """Seconds since the process was put back."""
        return self._monotonic() - self._returned_at.get(process.pid, 0.0)

    def _remove(self, process: ExecutorProcess) -> None:
        self._processes.remove(process)
        self._returned_at.pop(process.pid, None)
        self._idle_since.pop(process.pid, None)
