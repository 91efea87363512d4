"""An executor process that runs several attempts itself, one at a time (`tasks_per_process` > 1).

Cheaper than a fork per attempt (no process to start or tear down), at the price of isolation:
what one attempt leaves in memory (threads, module state, helper processes) the next finds.
Each assignment says whether it is the process's last; after that one it exits.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import psutil

from daemon import processes
from daemon.engine.attempt import Phase
from daemon.engine.executor_processes.base import ExecutorProcess

if TYPE_CHECKING:
    from daemon.engine.attempt import Attempt


@dataclasses.dataclass(eq=False)
class ReusedProcess(ExecutorProcess):
    """Runs attempts itself until it has run its last (see the module docstring)."""

    kind: ClassVar[str] = "reused"

    def next_attempt_process(self) -> tuple[int, float | None]:
        return self.pid, self.create_time

    def takes_another(self, attempt: Attempt) -> bool:
        # It reported its result and was not told it was its last attempt; a SIGTERMed process
        # may be on its way out.
        return (
            attempt.phase is Phase.REPORTED and not self.last and not attempt.reached(Phase.TERMINATED)
            and not self.status.closed and self.is_alive()
        )

    def _root(self) -> psutil.Process | None:
        if self.create_time is not None:
            return processes.find_leftover(self.pid, self.create_time)
        if self.is_alive():
            try:
                return psutil.Process(self.pid)
            except psutil.Error:
                return None
        return None
