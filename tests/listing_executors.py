"""An executor for the `watch` tests: it holds a worker, with a long status text, until a file
named in its payload exists (many of them running at once, all let go together)."""

from __future__ import annotations

from pathlib import Path

from daemon import models
from executors.base import ExecuteResult, TaskContext, TaskExecutor
from daemon.models import Task


class Gate(TaskExecutor):
    """Reports `payload["percent"]` and `payload["text"]`, then waits for `payload["go_file"]`."""

    task_type = "GATE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctx.progress(task.payload.get("percent", 50), task.payload.get("text"))
        go = Path(task.payload["go_file"])
        # The file is the test's signal; looking every 50 ms is this task's work, not the test's timing.
        while not go.exists():
            if ctx.wait_cancelled(0.05):
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
        return ExecuteResult(result={"done": True})
