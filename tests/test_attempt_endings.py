"""A task's log says how each attempt ended: the attempt's own last line names why it was stopped
(a user's cancel, its timeout, the daemon's shutdown), and where it could write none (killed,
crashed) or its result was refused, the supervisor adds one."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable

import pytest

from daemon import models
from daemon.models import TaskStatus
from daemon.store import db, tasks
from daemon.supervisor import Supervisor
from tests.conftest import wait_for
from tests.test_supervisor import (  # noqa: F401 (make_supervisor is a fixture)
    EXECUTORS, counter_payload, get, make_supervisor, submit, wait_ended,
)


def last_line(sup: Supervisor, task_id: str) -> str:
    return sup.settings.task_log(task_id).read_text().splitlines()[-1]


def test_a_shutdown_that_interrupts_an_attempt_says_so_not_cancelled(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor()
    task_id = submit(sup, "COUNT", payload=counter_payload(tmp_path, "c"))
    wait_for((tmp_path / "c.count").exists)  # it runs, and honours the cancel a shutdown sends
    sup.stop(grace=0, timeout=20)
    line = last_line(sup, task_id)
    assert "task interrupted by the daemon's shutdown (CANCELLED: cancelled)" in line
    assert line.endswith("put back, it runs again after the next start") and "task finished" not in line
    conn = db.open_database(sup.settings.database)
    try:
        assert tasks.get(conn, task_id).status is TaskStatus.PENDING
    finally:
        conn.close()


def test_a_stop_for_a_timeout_or_a_users_cancel_says_which(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor()
    timed_out = submit(sup, "COUNT", timeout=0.3, payload=counter_payload(tmp_path, "t"))
    assert wait_ended(sup, timed_out).error_type == models.TIMEOUT
    assert last_line(sup, timed_out).endswith("task stopped: timed out after 0.3 s (CANCELLED: cancelled)")
    cancelled = submit(sup, "COUNT", payload=counter_payload(tmp_path, "c"))
    wait_for((tmp_path / "c.count").exists)
    sup.cancel(cancelled)
    assert wait_ended(sup, cancelled).status is TaskStatus.CANCELLED
    assert last_line(sup, cancelled).endswith("task cancelled by the user (CANCELLED: cancelled)")


@pytest.mark.parametrize("stop", ["cancel", "shutdown"])
def test_an_attempt_killed_after_a_stop_gets_a_last_line_from_the_supervisor(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path, stop: str
) -> None:
    sup = make_supervisor(cancel_grace=0.2)
    ready = tmp_path / "ready"
    task_id = submit(sup, "HANG", payload={"ready_file": str(ready), "ignore_sigterm": True})
    wait_for(ready.exists)
    if stop == "cancel":
        sup.cancel(task_id)
        wait_ended(sup, task_id)
        outcome = "CANCELLED: cancelled"
        cause = "the user's cancel"
    else:
        sup.stop(grace=0, timeout=20)
        outcome = "put back, it runs again after the next start"
        cause = "the daemon's shutdown"
    assert last_line(sup, task_id).endswith(
        f"WARNING supervisor: the attempt was killed after {cause}, which neither the cancel nor SIGTERM ended "
        f"(killed by SIGKILL); {outcome}"
    )


@pytest.mark.parametrize(
    ("task_type", "payload", "ending"),
    [
        ("EXIT", {}, "the attempt's process died without a result (exit code 3); CRASHED: retried"),
        ("HANG", None, "the attempt's process died without a result (killed by SIGKILL); CRASHED: retried"),
    ],
)
def test_an_attempt_that_dies_without_a_result_gets_a_last_line_from_the_supervisor(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path, task_type: str, payload: Any, ending: str
) -> None:
    sup = make_supervisor(backoff_base=60)  # one attempt, then waiting for its retry
    ready = tmp_path / "ready"
    task_id = submit(sup, task_type, max_retries=1, payload=payload or {"ready_file": str(ready)})
    if task_type == "HANG":
        wait_for(ready.exists)
        os.kill(int(ready.read_text()), signal.SIGKILL)  # by someone else: a crash
    wait_for(lambda: (task := get(sup, task_id)).status is TaskStatus.PENDING and task.retry_count == 1)
    text = sup.settings.task_log(task_id).read_text()
    assert text.splitlines()[-1].endswith(f"WARNING supervisor: {ending}") and text.count("supervisor:") == 1


def test_a_result_the_supervisor_refuses_is_said_after_the_attempts_own_last_line(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(executors=EXECUTORS | {"RAW_RESULT": "tests.sample_executors:RawResult"})
    message = {"type": "result", "result": [1, 2], "error": None, "error_type": None}
    task_id = submit(sup, "RAW_RESULT", payload={"message": message})
    assert wait_ended(sup, task_id).error_type == models.BAD_RESULT
    assert last_line(sup, task_id).endswith(
        "WARNING supervisor: the result was refused (the result must be a dict (a JSON object) or a JSON string, "
        "not list); BAD_RESULT: failed"
    )


def test_an_attempt_that_ends_as_it_says_gets_no_line_from_the_supervisor(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    for task_type in ("ECHO", "RAISE"):
        task_id = submit(sup, task_type)
        wait_ended(sup, task_id)
        assert "supervisor:" not in sup.settings.task_log(task_id).read_text()
