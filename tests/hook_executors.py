"""Executors whose supervisor-side hooks (can_skip, on_task_failed) leave traces for the tests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from daemon.models import Task
from executors.base import ExecuteResult, TaskContext, TaskExecutor
from tests.sample_executors import Counter


def _record(path: str, task: Task, result: ExecuteResult) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"task_id": task.id, "status": task.status.value, "error_type": result.error_type}) + "\n")


class RecordingRaise(TaskExecutor):
    """Raises on every attempt; on_task_failed appends a line to `hook_file`."""

    task_type = "RECORDING_RAISE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        raise RuntimeError(f"attempt {task.retry_count + 1} failed")

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        _record(task.payload["hook_file"], task, result)


class RecordingHang(TaskExecutor):
    """Writes `ready_file`, then runs until cancelled; on_task_failed appends a line to `hook_file`."""

    task_type = "RECORDING_HANG"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        Path(task.payload["ready_file"]).write_text(str(os.getpid()))
        ctx.wait_cancelled()
        return ExecuteResult(error="cancelled", error_type="CANCELLED")

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        _record(task.payload["hook_file"], task, result)


class RecordingCounter(Counter):
    """The pausable Counter, recording on_task_failed calls in `hook_file`."""

    task_type = "RECORDING_COUNT"

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        _record(task.payload["hook_file"], task, result)


class SkipIfExists(TaskExecutor):
    """Skipped when `output` already exists; otherwise creates it."""

    task_type = "SKIP_IF_EXISTS"

    def can_skip(self, task: Task) -> bool:
        return os.path.exists(task.payload["output"])

    def skipped_result(self, task: Task) -> dict[str, object]:
        if task.payload.get("skipped_result") == "broken":
            return {"not json": float("nan")}
        return {"made": task.payload["output"]} if task.payload.get("skipped_result") else {}

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        Path(task.payload["output"]).write_text("made")
        return ExecuteResult(result={"made": task.payload["output"]})


class BrokenHooks(TaskExecutor):
    """can_skip and on_task_failed raise; execute fails with a retryable error."""

    task_type = "BROKEN_HOOKS"

    def can_skip(self, task: Task) -> bool:
        raise RuntimeError("can_skip is broken")

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(error="nope", error_type="IO_ERROR")

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        raise RuntimeError("on_task_failed is broken")


class ExitingHooks(TaskExecutor):
    """can_skip and on_task_failed call sys.exit (in the supervisor's process); execute fails with
    a retryable error."""

    task_type = "EXITING_HOOKS"

    def can_skip(self, task: Task) -> bool:
        sys.exit("can_skip exits")

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(error="nope", error_type="IO_ERROR")

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        sys.exit(3)


def _stored(db_path: str, task_id: str) -> dict[str, object]:
    """The task's row as another process sees it (read-only: what is committed, nothing else)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        status, pid = conn.execute("SELECT status, executor_pid FROM task WHERE id = ?", (task_id,)).fetchone()
    finally:
        conn.close()
    return {"status": status, "executor_pid": pid}


class SeesItsOwnRow(TaskExecutor):
    """Reports how its task's row reads from outside the supervisor when execute() begins; raises
    if `fail` is set, and then on_task_failed records how the row reads in `hook_file`."""

    task_type = "SEES_ITS_ROW"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        seen = _stored(task.payload["db"], task.id)
        if task.payload.get("fail"):
            raise RuntimeError("failing on purpose")
        return ExecuteResult(result={"seen": seen, "pid": os.getpid()})

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        Path(task.payload["hook_file"]).write_text(json.dumps(_stored(task.payload["db"], task.id)))
