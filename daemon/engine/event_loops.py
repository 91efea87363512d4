"""The event-loop executor processes of the daemon: how many there are, which takes the next
attempt, and their replacement when one dies or its loop is found blocked (SPEC §15).

Unlike the idle pool (daemon/pool.py), these processes are shared: each holds many attempts at
once, so an attempt takes the one holding fewest, and a process is kept while it serves.
"""

from __future__ import annotations

from typing import Iterator

import structlog

from daemon.engine import executor_processes
from daemon.engine.executor_processes import EventLoopProcess, ExecutorContext, ExecutorProcess

log = structlog.get_logger("fredica.supervisor")


class EventLoops:
    """Up to `processes` event-loop processes, started when an attempt first needs one. Used by
    the supervisor's loop thread only."""

    def __init__(
        self, context: ExecutorContext, *, queue: str = "default", processes: int = 1, block_limit: float = 10.0,
        idle_timeout: float = 60.0,
        start_process: executor_processes.StartProcess = executor_processes.start_process,
    ) -> None:
        self._context = context
        self.queue = queue
        self.idle_timeout = idle_timeout
        self._idle_since: dict[int, float] = {}  # pid -> the first tick's `now` that saw it hold nothing
        self._start_process = start_process  # a test's fake processes (tests/fake_processes.py)
        self.processes = processes
        self.block_limit = block_limit
        self._serving: list[EventLoopProcess] = []  # alive and taking attempts
        self._ending: list[EventLoopProcess] = []  # dead or blocked, some of their attempts unconcluded

    def __iter__(self) -> Iterator[EventLoopProcess]:
        return iter([*self._serving, *self._ending])

    def take(self) -> EventLoopProcess:
        """The process for the next attempt: a new one while there are fewer than `processes`,
        else the one holding fewest attempts."""
        for process in [p for p in self._serving if not self._still_serving(p)]:
            self._retire(process)
        if len(self._serving) < self.processes:
            started = self._start_process(self._context, "event_loop")
            assert isinstance(started, EventLoopProcess)
            started.block_limit, started.queue = self.block_limit, self.queue
            self._serving.append(started)
        process = min(self._serving, key=lambda p: p.holding)
        process.holding += 1
        return process

    def put_back(self, process: ExecutorProcess) -> None:
        """One of its attempts is over (or was never sent): it holds one fewer."""
        assert isinstance(process, EventLoopProcess)
        process.holding -= 1
        if process.holding <= 0 and process not in self._serving:
            self._close(process)

    def watch(self, now: float) -> list[float]:
        """End the processes whose loop is blocked; when to look again. One that holds nothing
        is not watched: the loop reads its channel only while it has attempts there, and its
        heartbeats are counted again from when it next gets one."""
        due = []
        for process in self._serving:
            if process.holding <= 0:
                process.alive_at = None
                continue
            at = process.watch(now)
            if at is not None:
                due.append(at)
        return due

    def tick(self, now: float) -> None:
        """Move the processes that died or were found blocked out of service, and end those that
        have held nothing for longer than `idle_timeout` (one is started again when needed)."""
        for process in list(self._serving):
            if not self._still_serving(process):
                self._retire(process)
            elif process.holding > 0:
                self._idle_since.pop(process.pid, None)
            elif now - self._idle_since.setdefault(process.pid, now) > self.idle_timeout:
                self._serving.remove(process)
                self._idle_since.pop(process.pid, None)
                self._close(process, reason="idle_timeout")

    def dismiss_all(self) -> None:
        """End every process (each exits once the attempts it holds have reported: at shutdown,
        none is left)."""
        processes, self._serving, self._ending = [*self._serving, *self._ending], [], []
        for process in processes:
            process.dismiss()

    def _still_serving(self, process: EventLoopProcess) -> bool:
        if process.blocked or not process.is_alive() or process.status.closed:
            if process not in self._ending:
                self._ending.append(process)
            return False
        return True

    def _retire(self, process: EventLoopProcess) -> None:
        """Out of service (dead, blocked or its channel closed): closed now if it holds nothing,
        else once its last attempt is put back."""
        self._serving.remove(process)
        if process.holding <= 0:
            self._close(process)

    def _close(self, process: EventLoopProcess, reason: str = "ended") -> None:
        if process in self._ending:
            self._ending.remove(process)
        log.info("event_loop_process_ended", pid=process.pid, reason=reason,
                 exit=executor_processes.describe_exit(process.exitcode))
        if process.is_alive():
            process.dismiss()
        else:
            process.close()
