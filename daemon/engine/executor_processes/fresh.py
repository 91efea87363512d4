"""A launcher: an executor process that runs each attempt in a fresh fork of itself.

Killing one attempt's process then never touches another task, and nothing one attempt leaves
in memory reaches the next. The launcher never runs executor code itself: it forks the next
attempt's process before its task arrives, and reports on a pipe of its own ("forked", "exited"),
which no attempt can write. The pid recorded for the task is the fork's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, ClassVar

import psutil
import structlog

from daemon import pipes, processes
from daemon.engine.executor_processes.base import ExecutorProcess, describe_exit, is_int

if TYPE_CHECKING:
    from daemon.engine.attempt import Attempt

log = structlog.get_logger("fredica.supervisor")


@dataclasses.dataclass(eq=False)
class LauncherProcess(ExecutorProcess):
    """Runs every attempt in a fresh fork (see the module docstring)."""

    kind: ClassVar[str] = "fresh"

    attempt_pid: int | None = None  # its fork waiting for the next attempt
    awaiting_report: bool = False  # its last attempt's exit not reported yet

    def next_attempt_process(self) -> tuple[int, float | None]:
        """Its waiting fork, by pid and start time (read from /proc, once per attempt). OSError if
        none waits: recording the launcher instead would have a stop end its whole tree."""
        if self.attempt_pid is None:
            raise OSError(f"executor launcher {self.pid} has no fork waiting for a task")
        return self.attempt_pid, processes.start_time(self.attempt_pid)

    def _assigned(self) -> None:
        self.awaiting_report = True

    def takes_another(self, attempt: Attempt) -> bool:
        # Once the fork has sent its result (its exit then follows, reported later) or has
        # exited. Stop escalation signals the fork's tree, never the launcher: it stays usable,
        # and takes its next task once it has reported that exit (`settled`).
        return not self.status.closed and not self.ending and self.is_alive()

    def _root(self) -> psutil.Process | None:
        if self.attempt_process is None:
            return None
        pid, create_time = self.attempt_process
        return processes.find_leftover(pid, create_time) if create_time is not None else None

    def _attempt_exit(self) -> int | None:
        """The exit status of its last fork, if its report has come (-1 if the report does not
        say one); the next fork's pid is noted."""
        assert self.reports is not None
        for report in self.reports.drain(1):
            if report.get("type") == "exited":
                next_pid, code = report.get("next_pid"), report.get("exitcode")
                self.attempt_pid = next_pid if is_int(next_pid) else None
                self.awaiting_report = False
                return code if is_int(code) else -1
        return None

    def settled(self) -> bool:
        """Ready for an attempt: it has reported its last attempt's exit (and so announced the
        fork that waits for the next). Reads its report if it has come."""
        if self.awaiting_report and not self._closed:
            # Only the report can be left: the attempt's result was its last word.
            exitcode = self.drain(100).exitcode
            if exitcode not in (0, None):
                log.warning("executor_exit_after_result", pid=self.pid, task_id=self.task_id,
                            exit=describe_exit(exitcode))
            if self.awaiting_report and not self.is_alive():
                self.awaiting_report = False  # died before reporting: nothing more will come
        return not self.awaiting_report

    @property
    def ending(self) -> bool:
        """It announced no next fork (its waiting fork died): it is exiting."""
        return self.attempt_pid is None

    def usable(self) -> bool:
        """Alive and not ending. Reads a report an idle launcher sent about its waiting fork's death."""
        if not self.awaiting_report and not self._closed:
            self._attempt_exit()
        return not self.ending and self.is_alive()

    def announced_first_fork(self, timeout: float = 30.0) -> None:
        """Wait for a new launcher to announce its first fork (OSError, dismissing it, if it does not)."""
        assert self.reports is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.reports.closed:
            for message in self.reports.drain(1):
                if message.get("type") == "forked" and is_int(message.get("pid")):
                    self.attempt_pid = message["pid"]
                    return
            pipes.ready([self.reports, self.sentinel], max(0.0, deadline - time.monotonic()))
        self.dismiss()
        raise OSError(f"executor launcher {self.pid} did not start ({describe_exit(self.exitcode)})")
