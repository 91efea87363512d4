"""Helpers for the built-in executor tests: tasks, in-process contexts, real executor processes.

Three ways to run an executor, from the lightest to the most complete:
- `run_inline`: `execute` in the test process with a recording context (payload checks);
- `Launcher`: a real executor subprocess through `daemon.engine.executor_processes`, steered like the supervisor does;
- `start_supervisor`: an in-process Supervisor with a real database (end to end).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any

import psutil

from daemon.config import Settings
from daemon.models import Task
from daemon.store import tasks
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor
from daemon.engine import executor_processes
from tests import executor_launch
from executors.base import ExecuteResult, TaskContext, TaskExecutor
from executors import registry
from tests import conftest
from tests.conftest import wait_for

BUILT_INS = registry.BUILTINS


def make_task(task_type: str, payload: dict[str, Any] | None = None, **fields: Any) -> Task:
    """A task snapshot for a built-in executor, which is pausable."""
    return conftest.make_task(task_type, payload, **{"is_pausable": True, **fields})


class Recorder:
    """A status sink that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def put(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


def run_inline(executor: TaskExecutor, payload: dict[str, Any]) -> tuple[ExecuteResult, list[dict[str, Any]]]:
    """Run `execute` in this process, neither paused nor cancelled; the result and the messages."""
    # A task id of its own: TaskContext attaches its status sink to the task's logger once per id.
    task = make_task(executor.task_type, payload, id=f"inline-{uuid.uuid4()}")
    cancel, resume = threading.Event(), threading.Event()
    resume.set()
    sink = Recorder()
    ctx = TaskContext(task, sink, cancel, resume)  # type: ignore[arg-type]
    return executor.execute(task, ctx), sink.messages


class Launcher:
    """Starts built-in executors in real subprocesses; `close` kills what is still running."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.context = executor_processes.make_context("forkserver")
        self.started: list[executor_processes.ExecutorProcess] = []
        self.seen: dict[int, list[dict[str, Any]]] = {}

    def launch(self, task_type: str, payload: dict[str, Any], *, ref: str | None = None,
               task_id: str | None = None, **fields: Any) -> executor_processes.ExecutorProcess:
        task = make_task(task_type, payload, **({"id": task_id} if task_id else {}), **fields)
        log_path = self.tmp_path / "logs" / f"{task.id}.{len(self.started)}.log"
        child = executor_launch.spawn(task, ref or BUILT_INS[task_type], {}, log_path, context=self.context)
        self.started.append(child)
        self.seen[id(child)] = []
        return child

    def messages(self, child: executor_processes.ExecutorProcess) -> list[dict[str, Any]]:
        """Every message read so far from `child` (reads what has arrived)."""
        seen = self.seen[id(child)]
        seen.extend(child.drain().messages)
        return seen

    def wait_message(self, child: executor_processes.ExecutorProcess, predicate: Any, timeout: float = 15.0) -> dict[str, Any]:
        """The first message (seen so far or arriving) for which `predicate` is true."""
        def found() -> dict[str, Any] | None:
            return next((m for m in self.messages(child) if predicate(m)), None)

        message = wait_for(found, timeout)
        assert message is not None
        return message

    def finish(self, child: executor_processes.ExecutorProcess, timeout: float = 30.0) -> dict[str, Any]:
        """Read until the child has ended; its result message."""
        deadline = time.monotonic() + timeout
        seen = self.seen[id(child)]
        while True:
            batch, open_, _ = child.drain()
            seen.extend(batch)
            if not open_ and not child.is_alive():
                break
            assert time.monotonic() < deadline, f"executor still running; last messages {seen[-3:]}"
            mp_connection.wait([child.sentinel, *([child.status.fileno()] if open_ else [])], 0.5)
        child.reap(5)
        results = [m for m in seen if m["type"] == "result"]
        assert len(results) == 1, seen[-5:]
        return results[0]

    def close(self) -> None:
        for child in self.started:
            if child.is_alive():
                child.kill_attempt()
            child.reap(5)
            child.close()


def progress_of(messages: list[dict[str, Any]]) -> list[int]:
    return [m["percent"] for m in messages if m["type"] == "progress"]


def start_supervisor(tmp_path: Path, **overrides: Any) -> Supervisor:
    """A started in-process Supervisor that knows the built-in executors; call `stop` when done."""
    options: dict[str, Any] = dict(
        database=tmp_path / "fredica.db", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
        executors=BUILT_INS, max_workers=2, cancel_grace=5.0, backoff_base=0.05, backoff_max=0.5,
        progress_interval=0.02,
    )
    options.update(overrides)
    supervisor = Supervisor(Settings(**options))
    supervisor.start()
    return supervisor


def submit(sup: Supervisor, task_type: str, payload: dict[str, Any], **fields: Any) -> str:
    return sup.submit([parse_spec({"type": task_type, "payload": payload, **fields})]).tasks[0].id


def store_unchecked(sup: Supervisor, task_type: str, payload: dict[str, Any] | None = None, **fields: Any) -> str:
    """Store a task as a daemon from before submit-time validation did: straight into the store,
    on the loop's thread. Its executor still checks it when it runs."""
    from daemon.store import tasks

    spec = parse_spec({"type": task_type, "payload": payload or {}, **fields})
    return sup.call(lambda: tasks.submit(sup.conn, [spec], now=sup.clock())).tasks[0].id


def get(sup: Supervisor, task_id: str) -> Task:
    return sup.call(lambda: tasks.get(sup.conn, task_id))


def wait_ended(sup: Supervisor, task_id: str, timeout: float = 30.0) -> Task:
    def ended() -> Task | None:
        task = get(sup, task_id)
        return task if task.status.is_terminal else None

    task = wait_for(ended, timeout)
    assert task is not None
    return task


def is_stopped(pid: int) -> bool:
    """True while the process is stopped by a signal (SIGSTOP)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def is_running(pid: int) -> bool:
    """True while the process exists and is not stopped."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
