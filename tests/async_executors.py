"""Event-loop executors (`async def execute`) for tests/test_event_loop.py, run in a real event-loop
executor process. What they share across attempts (`_started`) is module state of that process."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING

from executors.base import ExecuteResult, TaskExecutor

if TYPE_CHECKING:
    from daemon.models import Task
    from executors.base import AsyncTaskContext

_started: set[str] = set()


class Gathering(TaskExecutor):
    """Says it started, then sleeps until `expect` attempts of its kind have started in this
    process: only attempts that overlap can all end."""

    task_type = "GATHERING"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        _started.add(task.id)
        ctx.progress(1, "started")
        while len(_started) < task.payload["expect"]:
            await asyncio.sleep(0.01)
        return ExecuteResult(result={"id": task.id, "seen": len(_started)})


class Raising(TaskExecutor):
    task_type = "RAISING"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        await asyncio.sleep(0)
        raise ValueError("boom from an async executor")


class UntilCancelled(TaskExecutor):
    """Waits for its cancel, then returns CANCELLED itself."""

    task_type = "UNTIL_CANCELLED"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(1, "waiting")
        await ctx.wait_cancelled()
        return ExecuteResult(error="cancelled", error_type="CANCELLED")


class Stubborn(TaskExecutor):
    """Never looks at `ctx.cancelled`; with `swallow`, also swallows every CancelledError."""

    task_type = "STUBBORN"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(1, "ignoring")
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not task.payload.get("swallow"):
                    raise


class PauseWatcher(TaskExecutor):
    """Reports when it finds itself paused and when it is running again, then ends."""

    task_type = "PAUSE_WATCHER"
    pausable = True

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(1, "running")
        while not ctx.cancelled:
            if not await ctx.wait_if_paused(timeout=0):
                ctx.progress(2, "paused")
                await ctx.wait_if_paused()
                ctx.progress(3, "resumed")
                return ExecuteResult(result={"cancelled": ctx.cancelled})
            await asyncio.sleep(0.005)
        return ExecuteResult(error="cancelled", error_type="CANCELLED")


class SelfPausing(TaskExecutor):
    """Asks for a pause; with `self_resume`, another of its coroutines ends it."""

    task_type = "SELF_PAUSING"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        resumer = None
        if task.payload.get("self_resume"):
            async def resume_soon() -> None:
                await asyncio.sleep(0)  # runs once request_pause waits: after the clear and the put
                ctx.request_resume()

            resumer = asyncio.ensure_future(resume_soon())
        await ctx.request_pause("waiting for a resource")
        ctx.progress(100, "resumed")
        if resumer is not None:
            await resumer
        return ExecuteResult(result={"resumed": True})


class Chatty(TaskExecutor):
    """Prints, logs and reports progress, each naming its task; with `bytes`, prints that much."""

    task_type = "CHATTY"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(10, f"progress of {task.id}")
        await asyncio.sleep(0)
        print(f"printed by {task.id}")
        print(f"to stderr by {task.id}", file=sys.stderr)
        ctx.log.info("info of %s", task.id)
        ctx.log.warning("warning of %s", task.id)
        line = "x" * 99 + "\n"
        for _ in range(task.payload.get("bytes", 0) // 100):
            print(line, end="")
            await asyncio.sleep(0)
        return ExecuteResult(result={"id": task.id})


class Sized(TaskExecutor):
    """Returns a result of `size` characters."""

    task_type = "SIZED"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        return ExecuteResult(result={"data": "x" * task.payload["size"]})


class Blocking(TaskExecutor):
    """Blocks the whole loop with time.sleep (a bug the supervisor must see), between two messages."""

    task_type = "BLOCKING"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(1, "blocking")
        time.sleep(task.payload["seconds"])
        ctx.progress(2, "unblocked")
        await asyncio.sleep(task.payload.get("after", 0))
        return ExecuteResult(result={})


class UntilFile(TaskExecutor):
    """Waits (asleep, not blocking) until the file `path` exists."""

    task_type = "UNTIL_FILE"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        ctx.progress(1, "waiting")
        while not os.path.exists(task.payload["path"]):
            await asyncio.sleep(0.01)
        return ExecuteResult(result={"path": task.payload["path"]})


class NotAsync(TaskExecutor):
    """A plain executor, sent by mistake to an event-loop process."""

    task_type = "NOT_ASYNC"

    def execute(self, task: Task, ctx: object) -> ExecuteResult:  # type: ignore[override]
        return ExecuteResult(result={})
