"""The idle executor processes (SPEC §13): never more than the worker slots plus the warm spare,
and those idle for longer than `idle_process_timeout` exit.

The pool is driven directly with real launchers and a stepped clock (the settling clock and the
loop's `now` both), then the real daemon shows the same under a stream of tasks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from daemon import pipes, pool
from daemon.engine import executor_processes
from tests.conftest import make_task, wait_for
from tests.media import gone
from tests.daemon_harness import Daemon


class SteppedClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def forkserver() -> executor_processes.ExecutorContext:
    return executor_processes.make_context("forkserver")


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def make_pool(
    forkserver: executor_processes.ExecutorContext, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., pool.IdleProcesses]]:
    """Pools of launchers on the stepped clock; at the end every process they started is ended,
    stopped ones included."""
    made: list[pool.IdleProcesses] = []
    started: list[executor_processes.ExecutorProcess] = []
    start_process = executor_processes.start_process

    def recording_start(*args: Any, **kwargs: Any) -> executor_processes.ExecutorProcess:
        started.append(start_process(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(executor_processes, "start_process", recording_start)

    def make(**options: Any) -> pool.IdleProcesses:
        settings: dict[str, Any] = dict(warm_spare=True, spare_kind="fresh", settle_timeout=60, slots=2,
                                        idle_timeout=60, monotonic=clock)
        settings.update(options)
        made.append(pool.IdleProcesses(forkserver, **settings))
        return made[-1]

    yield make
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
    for idle in made:
        idle.dismiss_all()
    for process in started:
        if process.is_alive():
            process.kill()
        process.reap(5)
        process.close()


def run_an_attempt(process: executor_processes.ExecutorProcess, tmp_path: Path, *, launcher_stopped: bool = False) -> None:
    """Give a launcher an attempt and wait for its result, read off the status channel alone: the
    launcher's report of the fork's exit is left unread, as it is when the supervisor puts a
    launcher back. `launcher_stopped`: the launcher is SIGSTOPped first, so that it cannot report."""
    task = make_task("ECHO", id=f"echo-{process.pid}-{process.attempts}")
    if launcher_stopped:
        os.kill(process.pid, signal.SIGSTOP)  # its fork runs the attempt all the same
    process.assign(task, "tests.sample_executors:Echo", {}, tmp_path / f"{task.id}.log", last=False)
    wait_for(lambda: any(m["type"] == "result" for m in process.status.drain()))


# --- the pool on a stepped clock ----------------------------------------------------------------


def test_a_launcher_that_reported_while_idle_is_the_spare_however_long_ago(
    make_pool: Callable[..., pool.IdleProcesses], clock: SteppedClock, tmp_path: Path
) -> None:
    # The root of the growth: the loop never waits on an idle launcher's report pipe, and the
    # pool judged it by a flag only reading that pipe clears. Past SETTLE_WAIT, a launcher that
    # had reported long ago looked stuck, and a new spare was started beside it, tick after tick.
    idle = make_pool(slots=1)
    launcher = idle.take("fresh")
    run_an_attempt(launcher, tmp_path)
    idle.put_back(launcher)
    assert launcher.reports is not None and pipes.ready([launcher.reports], 10)  # reported, not read
    clock.step(1.0)  # long past SETTLE_WAIT
    idle.tick(0.0)
    assert list(idle) == [launcher]  # it is the spare: none started beside it
    assert idle.take("fresh") is launcher


def test_idle_and_busy_processes_never_outnumber_the_slots_plus_the_spare(
    make_pool: Callable[..., pool.IdleProcesses], clock: SteppedClock, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool, "BOUND_WAIT", 0.05)  # no report can come: the launchers are stopped
    idle = make_pool(slots=2)
    first, second = idle.take("fresh"), idle.take("fresh")  # both slots busy
    idle.tick(0.0)
    (spare,) = idle
    # The first slot's attempt ends, and its launcher cannot report (stopped): not settled.
    run_an_attempt(first, tmp_path, launcher_stopped=True)
    idle.put_back(first)
    clock.step(1.0)
    assert idle.take("fresh") is spare  # the next task in that slot
    idle.tick(0.0)
    # Three processes already (two busy, one idle): no spare beside the one slow to report.
    assert list(idle) == [first]
    # The second slot's attempt ends the same way; its next task finds no launcher ready and no
    # room: the oldest idle one is ended to make room for a new one.
    run_an_attempt(second, tmp_path, launcher_stopped=True)
    idle.put_back(second)
    clock.step(1.0)
    third = idle.take("fresh")
    assert third not in (first, second, spare) and third.is_alive()
    assert gone(first.pid) and list(idle) == [second]  # busy: spare, third; idle: second


def test_processes_idle_for_longer_than_the_timeout_exit_and_the_spare_is_renewed(
    make_pool: Callable[..., pool.IdleProcesses], tmp_path: Path
) -> None:
    idle = make_pool(slots=2, idle_timeout=60)
    busy = [idle.take("fresh"), idle.take("fresh")]
    idle.tick(0.0)
    (spare,) = idle
    for process in busy:
        run_an_attempt(process, tmp_path)
        idle.put_back(process)
    idle.tick(30.0)  # both idle from now on
    assert sorted(p.pid for p in idle) == sorted(p.pid for p in [spare, *busy])
    idle.tick(60.0)  # the spare: idle 60 s, not more
    assert spare in list(idle)
    idle.tick(61.0)
    assert spare not in list(idle) and gone(spare.pid)
    assert sorted(p.pid for p in idle) == sorted(p.pid for p in busy)  # those are the spare now
    idle.tick(91.0)
    assert all(gone(p.pid) for p in busy)
    (renewed,) = idle  # a fresh spare
    assert renewed not in [spare, *busy] and renewed.is_alive()


def test_without_a_warm_spare_no_idle_process_is_left_after_the_timeout(
    make_pool: Callable[..., pool.IdleProcesses], tmp_path: Path
) -> None:
    idle = make_pool(slots=1, warm_spare=False, idle_timeout=5)
    launcher = idle.take("fresh")
    run_an_attempt(launcher, tmp_path)
    idle.put_back(launcher)
    idle.tick(0.0)
    assert list(idle) == [launcher]
    idle.tick(5.5)
    assert list(idle) == [] and gone(launcher.pid)


# --- the real daemon ------------------------------------------------------------------------------


def daemon_executor_pids(daemon: Daemon) -> set[int]:
    """The daemon's executor processes: the children of its fork server (a launcher's waiting
    fork is the launcher's child, not counted)."""
    assert daemon.process is not None
    found: set[int] = set()
    with contextlib.suppress(psutil.NoSuchProcess):
        for helper in psutil.Process(daemon.process.pid).children():  # the fork server, the resource tracker
            with contextlib.suppress(psutil.NoSuchProcess):
                found.update(p.pid for p in helper.children())
    return found


def test_the_daemon_never_keeps_more_executor_processes_than_slots_plus_the_spare(daemons: Any) -> None:
    # One submission at a time, each task over before the next arrives or soon after: what grew
    # the pool to 34 launchers for 2 slots after 2,000 tasks.
    d = daemons(max_workers=2, idle_process_timeout=3600).start()
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            counts.append(len(daemon_executor_pids(d)))
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        ids = [d.submit("ECHO") for _ in range(300)]
        for task_id in ids:
            assert d.wait_task(task_id, "completed", "failed", "cancelled", timeout=60)["status"] == "completed"
    finally:
        done.set()
        sampler.join()
    assert counts and max(counts) <= 3, max(counts)
    assert len(daemon_executor_pids(d)) <= 3


def test_the_daemons_idle_executor_processes_exit_after_the_timeout(daemons: Any, tmp_path: Path) -> None:
    d = daemons(max_workers=4, idle_process_timeout=0.5).start()
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    ids = [d.submit("HANG", payload={"ready_file": str(path)}) for path in ready]
    wait_for(lambda: all(path.exists() for path in ready))
    busy = {psutil.Process(d.task(task_id)["executor_pid"]).ppid() for task_id in ids}  # their launchers
    assert len(busy) == 4 and busy <= daemon_executor_pids(d)
    for task_id in ids:
        d.data("cancel", ids=[task_id])
    for task_id in ids:
        d.wait_task(task_id, "cancelled")
    # Idle now, all five (the four and the spare), and each exits once idle for 0.5 s; a spare
    # is kept (renewed), nothing more.
    wait_for(lambda: all(gone(pid) for pid in busy) and len(daemon_executor_pids(d)) <= 1, timeout=20)
    assert d.wait_task(d.submit("ECHO"), "completed")["status"] == "completed"


def test_a_spare_that_fails_to_start_is_tried_again_after_a_growing_delay_not_at_every_tick(
    forkserver: executor_processes.ExecutorContext, clock: SteppedClock
) -> None:
    attempts: list[float] = []
    now = 500.0

    def failing_start(context: Any, kind: str) -> executor_processes.ExecutorProcess:
        attempts.append(now)
        raise OSError("executor launcher 1 did not start (exit code 1)")

    idle = pool.IdleProcesses(forkserver, warm_spare=True, spare_kind="fresh", settle_timeout=60, slots=2,
                              idle_timeout=60, monotonic=clock, start_process=failing_start)
    for ms in range(4000):  # a busy loop: a tick each millisecond for 4 s
        now = 500.0 + ms / 1000
        idle.tick(now)
    # Tried at once, then after 1 s and 2 s more (the next would be 4 s after that): not 4,000 times.
    assert [round(at - 500.0, 3) for at in attempts] == [0.0, 1.0, 3.0]
    assert list(idle) == []
