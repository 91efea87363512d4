"""What an attempt's status messages do to its task, message by message (daemon.messages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from daemon import messages
from daemon.models import TaskStatus
from daemon.running import RunningTask
from daemon.store import db, tasks
from daemon.submission import parse_spec
from executors.base import ExecuteResult

T0 = 1_700_000_000.0


def running_task(tmp_path: Path) -> tuple[Any, RunningTask]:
    conn = db.open_database(tmp_path / "fredica.db")
    tasks.submit(conn, [parse_spec({"type": "ECHO"})], now=T0)
    claimed = tasks.claim_next(conn, T0)
    assert claimed is not None
    started = tasks.start(conn, claimed.id, now=T0, known=claimed)
    # The messages never touch the process or the executor: the loop applies them.
    return conn, RunningTask(task=started, child=None, executor=None, started_at=T0)  # type: ignore[arg-type]


def test_a_malformed_message_is_logged_and_the_ones_after_it_still_apply(tmp_path: Path) -> None:
    conn, rt = running_task(tmp_path)
    batch = [
        {"type": "progress", "percent": "most of it"},
        {"type": "progress", "percent": None},
        {"type": "progress", "percent": float("inf")},  # JSON lets an executor send Infinity
        {"type": "progress", "percent": 40, "text": "halfway"},
        {"type": "pause_request", "reason": "waiting for the disk"},
        {"type": "result", "result": {"done": True}, "error": None, "error_type": None},
    ]
    with structlog.testing.capture_logs() as events:
        for message in batch:
            messages.apply(conn, rt, message, T0 + 1)
    assert [e["event"] for e in events if e["event"] == "bad_executor_message"] == ["bad_executor_message"] * 3
    assert rt.progress == (40, "halfway") and rt.paused_since == T0 + 1
    assert rt.result == ExecuteResult(result={"done": True})
    task = tasks.get(conn, rt.task.id)
    assert task.status is TaskStatus.RUNNING and task.is_paused


def test_an_unknown_message_is_logged_and_changes_nothing(tmp_path: Path) -> None:
    conn, rt = running_task(tmp_path)
    with structlog.testing.capture_logs() as events:
        messages.apply(conn, rt, {"type": "exited", "exitcode": 0}, T0 + 1)  # only a launcher's pipe says that
    assert [(e["event"], e["kind"]) for e in events] == [("unknown_executor_message", "exited")]
    assert rt.result is None and rt.attempt_exitcode is None
    assert tasks.get(conn, rt.task.id).status is TaskStatus.RUNNING
