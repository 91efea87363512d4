"""Executors for the database-fault tests: attempts that end when the test says so."""

from __future__ import annotations

import os
import time
from pathlib import Path

from daemon import models
from daemon.models import Task
from executors.base import ExecuteResult, TaskContext, TaskExecutor
from tests.sample_executors import write_atomically


class Gated(TaskExecutor):
    """Writes `ready_file`, reports progress, then waits until `gate_file` exists and returns a
    result `size` characters long (a big one needs new database pages to be recorded)."""

    task_type = "GATED"
    pausable = True

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        p = task.payload
        write_atomically(p["ready_file"], str(os.getpid()))
        step = 0
        while not Path(p["gate_file"]).exists():
            if ctx.cancelled:
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
            ctx.wait_if_paused()
            step += 1
            ctx.progress(min(99, step), f"step {step}")
            if ctx.wait_cancelled(0.01):
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
        return ExecuteResult(result={"blob": "x" * int(p.get("size", 0)), "finished_at": time.time()})
