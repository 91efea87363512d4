"""A real executor that does nothing: measures the cost of the machinery around a task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from executors.base import ExecuteResult, TaskContext, TaskExecutor

if TYPE_CHECKING:
    from daemon.models import Task


class Noop(TaskExecutor):
    """Completes at once with an empty result."""

    task_type = "NOOP"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result={})


class AsyncSleep(TaskExecutor):
    """An event-loop executor that sleeps `seconds` (default 1) without blocking its loop."""

    task_type = "ASYNC_SLEEP"

    async def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:  # type: ignore[override]
        import asyncio

        await asyncio.sleep(float(task.payload.get("seconds", 1.0)))
        return ExecuteResult(result={})
