"""A task's log within `max_task_log_bytes` (SPEC §13): rotated to `<id>.log.1` at half the limit,
by the executor process as it writes; `fredica logs` (and `-f`) reads both."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from daemon import cli, client
from executors import assignment, tasklog
from daemon.models import TaskStatus
from daemon.supervisor import Supervisor
from daemon.engine import executor_processes
from tests import executor_launch
from tests.conftest import make_task, wait_for
from tests.test_supervisor import EXECUTORS, make_supervisor, submit, wait_ended  # noqa: F401 (a fixture)

LIMIT = 64 * 1024  # the smallest the config allows
KEEP = LIMIT // 2
LINE = re.compile(r"line (\d+) ")


@pytest.fixture(scope="module")
def forkserver() -> executor_processes.ExecutorContext:
    return executor_processes.make_context("forkserver")


def run_flood(forkserver: Any, log: Path, **payload: Any) -> None:
    child = executor_launch.spawn(make_task("LOG_FLOOD", payload), "tests.sample_executors:LogFlood", {}, log,
                           context=forkserver, limits=assignment.Limits(log_bytes=LIMIT))
    try:
        assert child.reap(30) == 0
    finally:
        child.close()


def numbers(text: str) -> list[int]:
    return [int(match.group(1)) for line in text.splitlines() if (match := LINE.match(line))]


def test_a_chatty_task_keeps_its_latest_output_within_the_limit(forkserver: Any, tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    run_flood(forkserver, log, n=5000, width=100)  # 500 KB through its stdout
    rotated = Path(tasklog.rotated(str(log)))
    assert log.stat().st_size + rotated.stat().st_size <= LIMIT + 8 * 1024
    # Nothing lost at a rotation the process made itself: the last lines, in order, to the end.
    kept = numbers(rotated.read_text()) + numbers(log.read_text())
    assert kept == list(range(kept[0], 5001)) and kept[0] > 4000
    assert log.read_text().splitlines()[-1].endswith("task finished: ok")


def test_the_daemons_max_task_log_bytes_bounds_its_tasks_logs(make_supervisor: Any) -> None:
    sup: Supervisor = make_supervisor(executors=EXECUTORS | {"LOG_FLOOD": "tests.sample_executors:LogFlood"},
                                      max_task_log_bytes=LIMIT)
    task = wait_ended(sup, submit(sup, "LOG_FLOOD", payload={"n": 3000}))
    assert task.status is TaskStatus.COMPLETED
    log = sup.settings.task_log(task.id)
    assert log.stat().st_size + Path(tasklog.rotated(str(log))).stat().st_size <= LIMIT + 8 * 1024


def test_output_written_straight_to_the_log_is_bounded_too(forkserver: Any, tmp_path: Path) -> None:
    # `seq` writes through the fd it inherited, which the process never sees go by: the log is
    # looked at again when the attempt ends, and only its last half is kept.
    log = tmp_path / "task.log"
    run_flood(forkserver, log, n=20_000, width=50, direct=True)  # 1 MB
    rotated = tasklog.rotated(str(log))
    kept = Path(rotated).read_text()
    assert log.stat().st_size + len(kept) <= LIMIT
    first, *rest = kept.splitlines()
    assert tasklog.dropped(first.encode() + b"\n") > 900_000  # says how much it left out
    assert numbers("\n".join(rest)) == list(range(numbers(rest[0])[0], 20_001))


@pytest.mark.parametrize("fork_each", [True, False], ids=["a launcher's fork", "a process that runs attempts"])
def test_output_written_straight_to_the_log_is_bounded_while_the_attempt_runs(
    forkserver: Any, tmp_path: Path, fork_each: bool
) -> None:
    # Nothing the attempt writes itself says when to look: the launcher, or a thread of the
    # process, looks every second.
    log, ready, hold = tmp_path / "task.log", tmp_path / "ready", tmp_path / "hold"
    task = make_task("LOG_FLOOD", {"n": 20_000, "width": 50, "direct": True, "ready_file": str(ready),
                                   "hold_file": str(hold)})
    child = executor_processes.start_process(forkserver, "fresh" if fork_each else "reused")
    try:
        child.assign(task, "tests.sample_executors:LogFlood", {}, log, last=not fork_each,
                     limits=assignment.Limits(log_bytes=LIMIT))
        wait_for(ready.exists)
        rotated = Path(tasklog.rotated(str(log)))
        wait_for(lambda: rotated.exists() and log.stat().st_size + rotated.stat().st_size <= LIMIT, timeout=5)
        assert not child.drain().messages  # the attempt is still under way
        hold.touch()
        wait_for(lambda: any(m["type"] == "result" for m in child.drain().messages))
    finally:
        child.kill()
        child.reap(5)
        child.close()


def test_a_log_is_rotated_once_however_many_processes_look_at_it(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    log.write_text("a\n" * KEEP)
    holder = os.open(log, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process is at it
    try:
        assert not tasklog.rotate(str(log), KEEP) and log.stat().st_size == 2 * KEEP
    finally:
        os.close(holder)
    assert tasklog.rotate(str(log), KEEP) and log.stat().st_size == 0
    assert not tasklog.rotate(str(log), KEEP)  # not due any more
    assert Path(tasklog.rotated(str(log))).read_text() == "a\n" * KEEP


def write_lines(path: Path, first: int, last: int) -> None:
    with open(path, "a") as handle:
        handle.writelines(f"line {n} " + "x" * 40 + "\n" for n in range(first, last + 1))


def test_logs_reads_the_rotated_half_for_the_lines_the_log_lacks(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    config_file = tmp_path / "down.toml"
    config_file.write_text(f'[daemon]\nsocket = "{tmp_path / "gone.sock"}"\nlog_dir = "{log_dir}"\n')
    log = log_dir / "tasks" / "t1.log"
    log.parent.mkdir(parents=True)
    write_lines(log, 1, 1000)
    assert tasklog.rotate(str(log), 1000)
    write_lines(log, 1001, 1003)
    result = CliRunner().invoke(cli.main, ["--config", str(config_file), "logs", "t1", "-n", "5"])
    assert result.exit_code == 0, result.output
    assert numbers(result.stdout) == [999, 1000, 1001, 1002, 1003]


@pytest.mark.parametrize("far_over", [False, True], ids=["at half", "far over"])
def test_following_a_log_goes_on_across_its_rotations(tmp_path: Path, far_over: bool) -> None:
    log = tmp_path / "task.log"
    write_lines(log, 1, 30)
    follower = client.LogFile(log)
    seen = [int(LINE.match(line).group(1)) for line in follower.last(3, keep_partial=True) or []]
    # Each poll of the follower, the task writes more and its log is rotated in between, as
    # the executor process does; then the task ends. Far over, the follower is behind what the
    # last rotation keeps (the last 1000 bytes: some 20 lines).
    last = 1600 if far_over else 1200
    steps: Iterator[list[tuple[int, int]]] = iter([
        [(31, 40), (41, 400)], [(401, 410), (411, 800)], [(801, 1500 if far_over else 810), (None, last)], [],
    ])
    active = True

    def poll(_seconds: float) -> None:
        nonlocal active
        step = next(steps)
        if not step:
            active = False
            return
        (first, before), (_, after) = step
        write_lines(log, first, before)
        assert tasklog.rotate(str(log), 1000)
        write_lines(log, before + 1, after)

    follower.follow(lambda line: seen.append(int(LINE.match(line).group(1))) if LINE.match(line) else None,
                    lambda: active, poll=0, recheck=0, sleep=poll)
    follower.close()
    if far_over:  # what the rotation left out is skipped; what it kept, and all after, follows on
        resumed = seen[seen.index(800) + 1]
        assert seen == [*range(28, 801), *range(resumed, last + 1)] and 1480 < resumed <= 1500
    else:
        assert seen == list(range(28, last + 1))
