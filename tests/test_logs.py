"""The daemon's log: JSON lines in a rotated file, and task events that name their task and run."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Iterator

import pytest
import structlog

from daemon import logs
from tests.daemon_harness import Daemon


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    structlog.reset_defaults()


def test_json_lines_in_a_rotated_file(tmp_path: Path, restore_logging: None) -> None:
    log_file = tmp_path / "logs" / "daemon.log"
    logs.configure(log_file, stream=None, max_bytes=2_000)
    log = structlog.get_logger("fredica.test")
    for i in range(100):
        log.info("task_progress", task_id=f"t{i}", run_id="r", step=i)
    files = sorted(log_file.parent.glob("daemon.log*"))
    assert log_file in files and len(files) == 1 + logs.BACKUPS  # rotated, old ones kept
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert {"event", "level", "timestamp", "logger", "task_id", "run_id"} <= set(lines[-1])
    assert json.loads(log_file.read_text().splitlines()[-1])["step"] == 99


def test_a_log_path_that_is_a_pipe_gets_every_line_and_is_never_rotated(tmp_path: Path, restore_logging: None) -> None:
    # As a container collects logs: the log path is a FIFO (or a link to /dev/stdout).
    fifo = tmp_path / "daemon.log"
    os.mkfifo(fifo)
    received: list[str] = []

    def read_to_the_end() -> None:
        with open(fifo) as pipe:
            received.extend(pipe)

    reader = threading.Thread(target=read_to_the_end, daemon=True)
    reader.start()
    logs.configure(fifo, stream=None, max_bytes=200)  # every line would need a rotation
    log = structlog.get_logger("fredica.test")
    for i in range(20):
        log.info("task_progress", task_id=f"t{i}", run_id="r", step=i)
    logs.configure(None, stream=None)  # closes the pipe: the reader sees its end
    reader.join(10)
    assert not reader.is_alive()
    assert [json.loads(line)["step"] for line in received] == list(range(20))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(tmp_path.iterdir()) == [fifo]


def test_every_task_event_carries_its_task_and_run(daemons, tmp_path: Path) -> None:
    d: Daemon = daemons().start()
    d.wait_task(d.submit("RAISE", max_retries=1), "failed")
    d.wait_task(d.submit("ECHO"), "completed")
    hang = d.submit("HANG", payload={"ready_file": str(tmp_path / "ready")})
    d.wait_task(hang, "running")
    d.data("cancel", ids=[hang])
    d.wait_task(hang, "cancelled")
    events = [e for e in d.log_events() if e.get("logger") == "fredica.supervisor" and e["event"].startswith("task_")]
    assert {"task_started", "task_retrying", "task_failed", "task_completed", "task_cancelled"} <= {
        e["event"] for e in events
    }
    for event in events:
        assert event.get("task_id") and event.get("run_id"), event


def test_a_rotation_that_cannot_reopen_the_log_loses_lines_never_raises_and_never_writes_elsewhere(
    tmp_path: Path, restore_logging: None
) -> None:
    import shutil

    log_dir = tmp_path / "logs"
    logs.configure(log_dir / "daemon.log", stream=None, max_bytes=300)
    log = structlog.get_logger("fredica.test")
    log.info("first", pad="x" * 200)
    shutil.rmtree(log_dir)  # the next line rotates, and the reopen fails
    log.info("second", pad="x" * 200)  # does not raise
    victim = tmp_path / "victim"
    with open(victim, "w") as reused:  # takes the lowest free descriptor: the log's old number
        log.info("third", pad="x" * 200)
        reused.flush()
    assert victim.read_text() == ""
    log_dir.mkdir()
    log.info("fourth")  # the log comes back
    assert [json.loads(line)["event"] for line in (log_dir / "daemon.log").read_text().splitlines()] == ["fourth"]
