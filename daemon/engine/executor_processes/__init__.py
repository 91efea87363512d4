"""The kinds of executor process behind one interface (`base.ExecutorProcess`), and starting one.

A fresh fork per attempt (`fresh.LauncherProcess`, the default), a process reused for several
attempts (`reused.ReusedProcess`, `tasks_per_process` > 1), or a process that holds many attempts
of `async def` executors at once (`event_loop.EventLoopProcess`). All are started with the
"forkserver" method by default: each is a fork of a small, warm server that has already imported
the executor machinery, which is much faster than "spawn" while still never forking the
supervisor itself (its threads, sockets and SQLite connection). "fork" is refused for that
reason, and because a forked child would inherit every other task's pipes.
"""

from __future__ import annotations

from multiprocessing.context import ForkServerContext
from typing import Callable

from daemon import processes
from daemon.engine.executor_processes.base import (
    FORKSERVER_PRELOAD, START_METHODS, Drained, ExecutorContext, ExecutorProcess, describe_exit, make_context,
    start_child,
)
from daemon.engine.executor_processes.event_loop import HEARTBEAT_INTERVAL, EventLoopProcess
from daemon.engine.executor_processes.fresh import LauncherProcess
from daemon.engine.executor_processes.reused import ReusedProcess
from executors import channel, endpoint, event_loop

KINDS: dict[str, type[ExecutorProcess]] = {
    "fresh": LauncherProcess, "reused": ReusedProcess, "event_loop": EventLoopProcess,
}
# How the pools start a process of a kind: `start_process`, or a test's fakes.
StartProcess = Callable[[ExecutorContext, str], ExecutorProcess]

__all__ = [
    "FORKSERVER_PRELOAD", "KINDS", "START_METHODS", "Drained", "EventLoopProcess", "ExecutorContext",
    "ExecutorProcess", "LauncherProcess", "ReusedProcess", "StartProcess", "describe_exit", "make_context",
    "start_process",
]


def start_process(context: ExecutorContext, kind: str = "reused") -> ExecutorProcess:
    """Start an idle executor process of `kind`, waiting for its first attempt.

    Starting a process costs milliseconds (the fork server's round trip, the child's set-up); the
    supervisor starts one ahead of time (`warm_spare`), so dispatch is one message.
    """
    cls = KINDS[kind]
    launcher = cls is LauncherProcess
    if cls is EventLoopProcess:
        process, (assignments, control, status, reports) = start_child(
            context, event_loop.serve, reports=False, extra=(HEARTBEAT_INTERVAL,)
        )
    else:
        process, (assignments, control, status, reports) = start_child(context, endpoint.serve, reports=launcher)
    assert control is not None and status is not None
    pid = process.pid
    assert pid is not None
    started = cls(
        process=process,
        status=channel.StatusReader(status),
        control=control,
        pid=pid,
        create_time=processes.start_time(pid),
        assignments=assignments,
        sentinel_exact=isinstance(context, ForkServerContext),
    )
    if isinstance(started, LauncherProcess):
        assert reports is not None
        started.reports = channel.StatusReader(reports)
        started.announced_first_fork()
    return started
