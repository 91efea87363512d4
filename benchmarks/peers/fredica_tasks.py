"""fredica-worker's side of W2: a no-op executor that records when it started running.

`execute` reads `time.time()` first and returns it as the task's result, so W2 measures the same
thing for every system: start time recorded inside the task minus the client's `time.time()`
just before submitting. (benchmarks/noop.py's `Noop` is used for W1 and W3.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from executors.base import ExecuteResult, TaskContext, TaskExecutor

if TYPE_CHECKING:
    from daemon.models import Task


class Stamp(TaskExecutor):
    """Completes at once; its result is {"started": time.time() at the start of execute}."""

    task_type = "STAMP"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        started = time.time()
        return ExecuteResult(result={"started": started})


class Gate(TaskExecutor):
    """Runs until the file its payload names exists (or it is cancelled): a dependency that keeps
    the tasks submitted behind it waiting, so that a submission measures the submission alone."""

    task_type = "GATE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        import os

        while not os.path.exists(task.payload["open_file"]):
            if ctx.wait_cancelled(0.05):
                break
        return ExecuteResult(result={})


class AsyncNoop(TaskExecutor):
    """The event-loop row's no-op (W1, W3): an `async def` executor, so it runs in an event-loop
    executor process that holds many attempts at once (SPEC §15)."""

    task_type = "NOOP"

    async def execute(self, task: Task, ctx: Any) -> ExecuteResult:  # type: ignore[override]
        return ExecuteResult()


class AsyncStamp(TaskExecutor):
    """`Stamp` as an `async def` executor, for the event-loop row's W2."""

    task_type = "STAMP"

    async def execute(self, task: Task, ctx: Any) -> ExecuteResult:  # type: ignore[override]
        started = time.time()
        return ExecuteResult(result={"started": started})


class AsyncHang(TaskExecutor):
    """Runs, idle, until it is cancelled: an event-loop process holds any number of them at once
    (the PostgreSQL benchmark's 1,000 running tasks of a supervisor that is then killed). It waits
    on the cancel alone, so that a thousand of them cost no CPU while the rescue is measured."""

    task_type = "HANG"

    async def execute(self, task: Task, ctx: Any) -> ExecuteResult:  # type: ignore[override]
        await ctx.wait_cancelled()
        return ExecuteResult(result={})
