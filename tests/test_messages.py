"""What an attempt's status messages do to its task, message by message (daemon.messages).

Messages change the attempt's memory only; the loop writes its mirror in the task row
(tests/test_supervisor.py shows that part)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from daemon import messages
from daemon.engine.attempt import Attempt, Phase
from daemon.store import db, tasks
from daemon.submission import parse_spec
from executors.base import ExecuteResult
from tests import store_steps

T0 = 1_700_000_000.0


class RecordingChild:
    """The few commands of an executor process the messages may send."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def resume(self, token: str | None = None) -> None:
        self.commands.append("resume")


def running_task(tmp_path: Path) -> tuple[Any, Attempt]:
    conn = db.open_database(tmp_path / "fredica.db")
    tasks.submit(conn, [parse_spec({"type": "ECHO"})], now=T0)
    claimed = store_steps.claim_next(conn, T0)
    assert claimed is not None
    started = tasks.start(conn, claimed.id, now=T0, known=claimed)
    # The loop applies the messages: they touch the executor process only to resume it.
    return conn, Attempt(task=started, process=RecordingChild(), executor=None, started_at=T0, phase=Phase.RUNNING,  # type: ignore[arg-type]
                             pausable=True)


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
            messages.apply(rt, message, T0 + 1)
    assert [e["event"] for e in events if e["event"] == "bad_executor_message"] == ["bad_executor_message"] * 3
    assert rt.progress == (40, "halfway") and rt.paused_since == T0 + 1
    assert rt.result == ExecuteResult(result={"done": True})
    assert rt.mirror_dirty and rt.last_progress == (40, "halfway")  # for the loop to write


def test_an_unknown_message_is_logged_and_changes_nothing(tmp_path: Path) -> None:
    conn, rt = running_task(tmp_path)
    with structlog.testing.capture_logs() as events:
        messages.apply(rt, {"type": "exited", "exitcode": 0}, T0 + 1)  # only a launcher's pipe says that
    assert [(e["event"], e["kind"]) for e in events] == [("unknown_executor_message", "exited")]
    assert rt.result is None and rt.exitcode is None and not rt.mirror_dirty


def test_a_pause_taken_before_the_executor_said_it_is_not_pausable_is_undone(tmp_path: Path) -> None:
    # SHELL counts as pausable until it has read "pausable": false in its payload; a user's
    # pause accepted in between would never be honoured, and would stop the timeout's clock.
    conn, rt = running_task(tmp_path)
    rt.note_paused(T0 + 1, "user")  # as the supervisor records a user's pause
    messages.apply(rt, {"type": "pausable", "pausable": False}, T0 + 3)
    assert not rt.pausable and rt.paused_since is None and rt.mirror_dirty
    assert rt.process.commands == ["resume"] and rt.paused_seconds == 2  # type: ignore[attr-defined]
    messages.apply(rt, {"type": "pausable", "pausable": False}, T0 + 4)  # not paused: nothing to undo
    assert rt.process.commands == ["resume"]  # type: ignore[attr-defined]
    # A pause the executor asked for itself is its own business, pausable or not.
    messages.apply(rt, {"type": "pause_request", "reason": "disk full"}, T0 + 5)
    messages.apply(rt, {"type": "pausable", "pausable": False}, T0 + 6)
    assert rt.process.commands == ["resume"] and rt.paused_by == "executor"  # type: ignore[attr-defined]
    assert rt.paused_since == T0 + 5
