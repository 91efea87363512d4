"""An executor process whose daemon has died ends its attempt, with its whole process tree, within
a second, and writes one line saying so to the task's log; never a traceback (SPEC §13)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from executors import _parent
from tests.conftest import wait_for


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("chatty", [False, True], ids=["silent", "reporting progress"])
@pytest.mark.parametrize("tasks_per_process", [1, 3], ids=["fork per attempt", "process runs several"])
def test_after_kill9_of_the_daemon_an_attempt_ends_with_its_tree_and_says_so(
    daemons, tmp_path: Path, chatty: bool, tasks_per_process: int
) -> None:
    d = daemons(tasks_per_process=tasks_per_process).start()
    pid_file = tmp_path / "pids"
    task_id = d.submit("FAMILY", payload={"pid_file": str(pid_file), "chatty": chatty})
    descendants = wait_for(lambda: pid_file.exists() and [int(pid) for pid in pid_file.read_text().split()])
    executor = d.wait_task(task_id, "running")["executor_pid"]
    tree = [executor, *descendants]  # the detached one too, which left the executor's session
    log = d.log_dir / "tasks" / f"{task_id}.log"
    if chatty:
        wait_for(lambda: d.task(task_id)["progress"] > 0)
    assert not any(gone(pid) for pid in tree)

    d.kill9()
    killed_at = time.monotonic()
    wait_for(lambda: all(gone(pid) for pid in tree), timeout=5)
    ended_after = time.monotonic() - killed_at
    wait_for(lambda: _parent.ORPHANED in log.read_text(), timeout=5)
    text = log.read_text()
    assert text.count(_parent.ORPHANED) == 1 and text.splitlines()[-1].endswith(_parent.ORPHANED)
    assert "Traceback" not in text and "BrokenPipeError" not in text, text
    assert ended_after < 5
