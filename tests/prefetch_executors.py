"""Executors for the prefetch tests (SPEC §15): each run leaves one line in a tally file, so a
test can tell that a task ran exactly once, and in which process."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from daemon import models
from daemon.models import Task
from executors.base import AsyncTaskContext, ExecuteResult, TaskContext, TaskExecutor


class Tally(TaskExecutor):
    """Appends "<task id> <pid>" to `payload["tally"]`, then, given `payload["go_file"]`, waits
    until that file exists (or the task is cancelled); its result names its process."""

    task_type = "TALLY"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        _append(task.payload["tally"], f"{task.id} {os.getpid()}\n")
        go = task.payload.get("go_file")
        while go is not None and not Path(go).exists():
            if ctx.cancelled:
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
            threading.Event().wait(0.01)  # the executor's own polling of a file, not a test's
        return ExecuteResult(result={"pid": os.getpid()})


class AsyncTally(TaskExecutor):
    """`Tally` as an event-loop executor (its execute is async def)."""

    task_type = "ATALLY"

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        _append(task.payload["tally"], f"{task.id} {os.getpid()}\n")
        go = task.payload.get("go_file")
        while go is not None and not Path(go).exists():
            if ctx.cancelled:
                return ExecuteResult(error="cancelled", error_type=models.CANCELLED)
            await asyncio.sleep(0.01)
        return ExecuteResult(result={"pid": os.getpid()})


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write to an O_APPEND file: lines of two processes never mix
    finally:
        os.close(fd)


def tally(path: Path) -> list[tuple[str, int]]:
    """The (task id, pid) lines of a tally file, in order."""
    if not path.exists():
        return []
    return [(task_id, int(pid)) for task_id, pid in (line.split() for line in path.read_text().splitlines())]
