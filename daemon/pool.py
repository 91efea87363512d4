"""The executor processes waiting for an attempt, and the warm spare kept among them."""

from __future__ import annotations

from typing import Iterator

import structlog

from daemon import children

log = structlog.get_logger("fredica.supervisor")


class IdleProcesses:
    """Executor processes waiting for work: the warm spare, launchers between attempts, and (with
    tasks_per_process > 1) processes whose last attempt has reported.

    Used by the supervisor's loop thread only.
    """

    def __init__(self, context: children.ExecutorContext, *, warm_spare: bool, launchers: bool) -> None:
        self._context = context
        self._warm_spare = warm_spare
        self._spare_is_launcher = launchers  # what most tasks will need
        self._processes: list[children.ExecutorProcess] = []

    def __iter__(self) -> Iterator[children.ExecutorProcess]:
        return iter(list(self._processes))

    def __len__(self) -> int:
        return len(self._processes)

    def take(self, *, launcher: bool) -> children.ExecutorProcess:
        """An idle launcher, or an idle process that runs attempts itself; started if none waits."""
        # Newest first: a process that has just finished an attempt is reused before the spare.
        for process in reversed(list(self._processes)):
            if process.fork_each != launcher:
                continue
            self._processes.remove(process)
            if process.is_alive():
                return process
            log.warning("idle_executor_lost", pid=process.pid, exit=children.describe_exit(process.exitcode))
            process.close()
        return children.start_process(self._context, fork_each=launcher)

    def put_back(self, process: children.ExecutorProcess) -> None:
        """A process whose attempt is over and that takes another."""
        self._processes.append(process)

    def keep_a_spare(self) -> None:
        """Start the next task's process now, while nothing waits for it."""
        if not self._warm_spare or self._processes:
            return
        try:
            self._processes.append(children.start_process(self._context, fork_each=self._spare_is_launcher))
        except Exception:
            log.exception("spare_executor_failed")

    def dismiss_all(self) -> None:
        """End every idle process (they exit when their assignment pipe closes)."""
        processes, self._processes = self._processes, []
        for process in processes:
            process.dismiss()
