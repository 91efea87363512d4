"""The executor processes waiting for an attempt, and the warm spare kept among them."""

from __future__ import annotations

import time
from typing import Iterator

import structlog

from daemon import children, pipes

log = structlog.get_logger("fredica.supervisor")
# How long a dispatch may wait for a launcher to report its last fork's exit (normally about a
# millisecond) before it starts a new process instead.
SETTLE_WAIT = 0.05


class IdleProcesses:
    """Executor processes waiting for work: the warm spare, launchers between attempts, and (with
    tasks_per_process > 1) processes whose last attempt has reported.

    Used by the supervisor's loop thread only.
    """

    def __init__(
        self, context: children.ExecutorContext, *, warm_spare: bool, launchers: bool, settle_timeout: float
    ) -> None:
        self._context = context
        self._warm_spare = warm_spare
        self._spare_is_launcher = launchers  # what most tasks will need
        self._settle_timeout = settle_timeout
        self._processes: list[children.ExecutorProcess] = []
        self._returned_at: dict[int, float] = {}  # pid -> when put back (time.monotonic())

    def __iter__(self) -> Iterator[children.ExecutorProcess]:
        return iter(list(self._processes))

    def take(self, *, launcher: bool) -> children.ExecutorProcess:
        """An idle launcher, or an idle process that runs attempts itself; started if none waits.

        A launcher whose last attempt has sent its result may not have reported that fork's exit
        yet (the fork is tearing down, then the next is forked): it is taken once it has. If none
        is ready, one put back a moment ago is waited for briefly, which is cheaper than starting
        a process.
        """
        for waited in (False, True):
            # Newest first: a process that has just finished an attempt is reused before the spare.
            for process in reversed([p for p in self._processes if p.fork_each == launcher]):
                if not process.settled():
                    continue
                if process.usable():
                    self._remove(process)
                    return process
                self._drop_dead(process)
            recent = [p for p in self._processes if p.fork_each == launcher and self._age(p) < SETTLE_WAIT]
            if waited or not recent:
                break
            pipes.ready([p.reports for p in recent if p.reports is not None], SETTLE_WAIT)
        return children.start_process(self._context, fork_each=launcher)

    def put_back(self, process: children.ExecutorProcess) -> None:
        """A process whose attempt is over and that takes another."""
        self._processes.append(process)
        self._returned_at[process.pid] = time.monotonic()

    def keep_a_spare(self) -> None:
        """Start the next task's process now, while nothing waits for it (run every tick: a poll
        of an idle process's sentinel, no more, unless one must be started or a stuck fork ended)."""
        self._end_stuck_forks()
        if not self._warm_spare:
            return
        ready = False
        for process in list(self._processes):
            # One poll per idle process and tick; `take` also reads an idle launcher's report
            # of its end, which is followed by its exit within milliseconds.
            if process.ending or not process.is_alive():
                self._drop_dead(process)  # newer ones are taken first: it would stay forever
            elif process.fork_each != self._spare_is_launcher:
                pass  # of the other kind (a launcher a fresh-process task left): no spare
            elif process.awaiting_report:
                ready = ready or self._age(process) < SETTLE_WAIT  # about to be ready
            else:
                ready = True
        if ready:
            return
        try:
            self._processes.append(children.start_process(self._context, fork_each=self._spare_is_launcher))
        except Exception:
            log.exception("spare_executor_failed")

    def _end_stuck_forks(self) -> None:
        """A launcher whose fork sent its result long ago but has not exited (stuck in its own
        shutdown): end that fork, so that the launcher reports and can be used again."""
        for process in self._processes:
            if process.awaiting_report and self._age(process) > self._settle_timeout and not process.settled():
                log.warning("executor_stuck_after_result", pid=process.attempt_process[0] if process.attempt_process else None, task_id=process.task_id)
                process.kill_tree()
                self._returned_at[process.pid] = time.monotonic()

    def _drop_dead(self, process: children.ExecutorProcess) -> None:
        """Forget a process that died or is ending, reaping it if it has ended."""
        self._remove(process)
        log.warning("idle_executor_lost", pid=process.pid, exit=children.describe_exit(process.exitcode))
        if process.is_alive():
            process.dismiss()  # an ending launcher: exits at once
        else:
            process.close()

    def _age(self, process: children.ExecutorProcess) -> float:
        return time.monotonic() - self._returned_at.get(process.pid, 0.0)

    def _remove(self, process: children.ExecutorProcess) -> None:
        self._processes.remove(process)
        self._returned_at.pop(process.pid, None)

    def dismiss_all(self) -> None:
        """End every idle process (they exit when their assignment pipe closes)."""
        processes, self._processes = self._processes, []
        self._returned_at.clear()
        for process in processes:
            process.dismiss()
