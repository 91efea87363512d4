"""Executors for the tests of supervisors sharing one PostgreSQL queue: each attempt says that it
ran, then holds its worker until the test lets it go, so that tasks are really running when a
supervisor is killed, and no attempt can pass unseen."""

from __future__ import annotations

import os
from pathlib import Path

from daemon import models
from daemon.models import Task
from executors.base import ExecuteResult, TaskContext, TaskExecutor


class Tally(TaskExecutor):
    """Appends one line `<task id> <pid>` to `tally_file` as it starts (one write of a short
    line to a file opened for appending: attempts of several processes never mix their lines),
    then waits until `gate_file` exists, honouring cancel."""

    task_type = "TALLY"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        fd = os.open(task.payload["tally_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{task.id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        gate = Path(task.payload["gate_file"])
        while not gate.exists():
            if ctx.wait_cancelled(0.02):
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
        return ExecuteResult(result={"ran_in": os.getpid()})


def tallied(path: Path) -> list[str]:
    """The task ids `Tally` attempts wrote to `path`, one per attempt, in the order they started."""
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []
