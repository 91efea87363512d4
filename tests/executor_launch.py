"""Running one attempt in a real executor process, outside the supervisor: for the tests of what
lives in the process (the endpoint, the built-in executors, task logs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from daemon.engine import executor_processes
from daemon.engine.executor_processes import ExecutorContext, ExecutorProcess
from daemon.models import Task
from executors.assignment import Limits


def spawn(
    task: Task,
    executor_ref: str,
    upstream: Mapping[str, Any],
    log_path: Path,
    *,
    context: ExecutorContext,
    limits: Limits = Limits(),
) -> ExecutorProcess:
    """Start a fresh executor process for one attempt of `task`; its output goes to `log_path`."""
    process = executor_processes.start_process(context, "reused")
    process.assign(task, executor_ref, upstream, Path(log_path), last=True, limits=limits)
    return process
