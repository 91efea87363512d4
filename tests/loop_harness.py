"""Drives a real event-loop executor process through its pipes, as the supervisor would: the
`start` fixture starts one (fork server), `LoopProcess` sends assignments and commands and reads
its messages."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon import pipes
from daemon.engine import executor_processes
from executors import assignment, channel, event_loop, steering
from tests.conftest import make_task


class LoopProcess:
    """An event-loop executor process and our ends of its three pipes."""

    def __init__(self, context: Any, log_dir: Path, heartbeat: float) -> None:
        assignments_in, self.assignments = context.Pipe(duplex=False)
        control_in, self.control = context.Pipe(duplex=False)
        status, status_out = context.Pipe(duplex=False)
        self.process = context.Process(
            target=event_loop.serve, args=(assignments_in, control_in, status_out, heartbeat), daemon=False
        )
        self.process.start()
        for theirs in (assignments_in, control_in, status_out):
            theirs.close()
        self.status = channel.StatusReader(status)
        self.log_dir = log_dir
        self.messages: list[dict[str, Any]] = []  # everything read so far, in order
        self._read = 0  # how many of them `next` has handed out

    def assign(self, task_type: str, payload: dict[str, Any] | None = None, *, task_id: str | None = None,
               limits: assignment.Limits = assignment.Limits(), cancel_grace: float = 5.0,
               ref: str | None = None, after: str | None = None) -> str:
        """Send one attempt; its token (the task id, "#1"). `after`: sent ahead (prefetch), to
        follow the attempt with that token."""
        task = make_task(task_type, payload, id=task_id or f"task-{task_type.lower()}")
        token = f"{task.id}#1"
        message = assignment.Assignment(
            task, ref or f"tests.async_executors:{class_of(task_type)}", {"up-1": {"n": 1}},
            str(self.log_path(task.id)), token, False, limits, cancel_grace,
            prefetched=after is not None, after=after,
        )
        pipes.send_within(self.assignments.fileno(), pickle.dumps(message, pickle.HIGHEST_PROTOCOL), 5.0)
        return token

    def command(self, kind: str, token: str, reason: str | None = None) -> None:
        os.write(self.control.fileno(), steering.command(kind, token, reason))

    def log_path(self, task_id: str) -> Path:
        return self.log_dir / f"{task_id}.log"

    def poll(self) -> list[dict[str, Any]]:
        """Read what has arrived (waiting a little for something)."""
        pipes.ready([self.status, self.process.sentinel], 0.05)
        batch = self.status.drain()
        self.messages += batch
        return batch

    def until(self, condition: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        """The first message from here on for which `condition` holds (earlier ones are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            while self._read < len(self.messages):
                message = self.messages[self._read]
                self._read += 1
                if condition(message):
                    return message
            assert time.monotonic() < deadline, f"no such message; last ones: {self.messages[-5:]}"
            assert not self.status.closed, f"the channel closed ({self.status.close_reason}); last: {self.messages[-5:]}"
            self.poll()

    def result(self, token: str, timeout: float = 20.0) -> dict[str, Any]:
        """The result of the attempt `token`, whenever it arrived."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.messages:
                if message["type"] == "result" and message["attempt"] == token:
                    return message
            assert time.monotonic() < deadline, f"no result for {token}; last messages: {self.messages[-5:]}"
            assert not self.status.closed, f"the channel closed ({self.status.close_reason}); last: {self.messages[-5:]}"
            self.poll()

    def of(self, token: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("attempt") == token]

    def exit_code(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.process.exitcode is None and time.monotonic() < deadline:
            if not self.status.closed:
                self.poll()
            else:
                self.process.join(0.05)
        return self.process.exitcode


def class_of(task_type: str) -> str:
    """The test executor's class for `task_type`: UNTIL_FILE -> UntilFile."""
    return "".join(part.capitalize() for part in task_type.split("_"))


@pytest.fixture(scope="module")
def forkserver() -> executor_processes.ExecutorContext:
    return executor_processes.make_context("forkserver")


@pytest.fixture
def start(forkserver: Any, tmp_path: Path) -> Iterator[Callable[..., LoopProcess]]:
    started: list[LoopProcess] = []

    def _start(heartbeat: float = 1.0) -> LoopProcess:
        log_dir = tmp_path / "logs"
        log_dir.mkdir(exist_ok=True)
        process = LoopProcess(forkserver, log_dir, heartbeat)
        started.append(process)
        return process

    yield _start
    for process in started:
        if process.process.is_alive():
            process.process.kill()
        process.process.join(5)
