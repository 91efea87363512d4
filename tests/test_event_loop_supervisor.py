"""The supervisor with event-loop executors (SPEC §15): many attempts of `async def` executors in
one event-loop process, each steered, ended and recorded on its own; a loop that blocks gets its
process replaced. The in-process Supervisor drives real event-loop processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from daemon import models, queues
from daemon.engine.executor_processes import EventLoopProcess
from daemon.models import TaskStatus
from daemon.store import db, tasks
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor
from tests.conftest import wait_for
from tests.test_supervisor import get, submit, supervisors, wait_ended

EXECUTORS = {
    name.upper(): f"tests.async_executors:{name.title().replace('_', '')}"
    for name in ("gathering", "raising", "until_cancelled", "stubborn", "pause_watcher", "self_pausing",
                 "blocking", "until_file")
} | {"ECHO": "tests.sample_executors:Echo"}


@pytest.fixture
def make_supervisor(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """test_supervisor's supervisors, with the async executors and room for fifty attempts."""
    yield from supervisors(tmp_path, executors=EXECUTORS, max_workers=50)


def loop_processes(sup: Supervisor) -> list[EventLoopProcess]:
    return sup.call(lambda: list(sup.loops["default"]))


def test_fifty_attempts_run_at_once_in_one_event_loop_process(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    ids = [t.id for t in sup.submit([parse_spec({"type": "GATHERING", "payload": {"expect": 50}})] * 50).tasks]
    ended = [wait_ended(sup, task_id) for task_id in ids]
    # Each waited until all fifty had started: they overlapped, in one process.
    assert {t.status for t in ended} == {TaskStatus.COMPLETED} and {t.result["seen"] for t in ended} == {50}
    assert len({t.executor_pid for t in ended}) == 1 and len(loop_processes(sup)) == 1


def test_one_attempts_exception_and_anothers_cancel_leave_the_rest_running(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor()
    gate = tmp_path / "gate"
    waiting = submit(sup, "UNTIL_FILE", payload={"path": str(gate)})
    cancelled = submit(sup, "UNTIL_CANCELLED")
    stubborn = submit(sup, "STUBBORN", payload={"swallow": False})
    raising = submit(sup, "RAISING")
    assert wait_ended(sup, raising).error_type == models.EXCEPTION
    wait_for(lambda: get(sup, cancelled).progress == 1 and get(sup, stubborn).progress == 1)
    sup.cancel(cancelled)
    sup.cancel(stubborn)  # never looks at ctx.cancelled: its coroutine is cancelled after the grace
    assert wait_ended(sup, cancelled).status is TaskStatus.CANCELLED
    assert wait_ended(sup, stubborn).status is TaskStatus.CANCELLED
    assert get(sup, waiting).status is TaskStatus.RUNNING
    gate.touch()
    done = wait_ended(sup, waiting)
    assert done.status is TaskStatus.COMPLETED and len(loop_processes(sup)) == 1
    assert done.executor_pid == get(sup, raising).executor_pid  # the same process throughout


def test_a_user_pauses_and_resumes_an_async_attempt(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    task_id = submit(sup, "PAUSE_WATCHER")
    wait_for(lambda: get(sup, task_id).progress == 1)
    sup.pause(task_id)
    wait_for(lambda: get(sup, task_id).progress == 2)  # it found itself paused
    assert get(sup, task_id).is_paused
    sup.resume(task_id)
    done = wait_ended(sup, task_id)
    assert done.status is TaskStatus.COMPLETED and done.result == {"cancelled": False} and not done.is_paused


def test_a_self_pause_shows_paused_until_the_executor_resumes_itself(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    task_id = submit(sup, "SELF_PAUSING", payload={"self_resume": True})
    done = wait_ended(sup, task_id)
    assert done.status is TaskStatus.COMPLETED and done.result == {"resumed": True} and not done.is_paused


def test_a_blocked_loop_gets_its_process_replaced_and_its_attempts_crash(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor()
    sup.call(lambda: setattr(sup.loops["default"], "block_limit", 0.5))
    gate = tmp_path / "gate"
    beside = submit(sup, "UNTIL_FILE", payload={"path": str(gate)})
    wait_for(lambda: get(sup, beside).progress == 1)
    blocking = submit(sup, "BLOCKING", payload={"seconds": 60})
    first = wait_ended(sup, blocking)
    assert first.status is TaskStatus.FAILED and first.error_type == models.CRASHED
    # Every attempt of the process ended with it.
    assert wait_ended(sup, beside).error_type == models.CRASHED
    after = submit(sup, "GATHERING", payload={"expect": 0})
    done = wait_ended(sup, after)
    assert done.status is TaskStatus.COMPLETED and done.executor_pid != first.executor_pid


def test_a_shutdown_puts_async_attempts_back(make_supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    sup = make_supervisor()
    task_id = submit(sup, "UNTIL_FILE", payload={"path": str(tmp_path / "never")})
    wait_for(lambda: get(sup, task_id).progress == 1)
    sup.stop(grace=0, timeout=20)
    reader = db.open_database(tmp_path / "fredica.db")
    try:
        assert tasks.get(reader, task_id).status is TaskStatus.PENDING
    finally:
        reader.close()


def test_sync_and_async_tasks_run_side_by_side(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(max_workers=4)
    sync = submit(sup, "ECHO", payload={"word": "hi"})
    asynchronous = submit(sup, "GATHERING", payload={"expect": 1})
    assert wait_ended(sup, sync).status is TaskStatus.COMPLETED
    assert wait_ended(sup, asynchronous).status is TaskStatus.COMPLETED


def test_a_queue_spreads_its_attempts_over_its_event_loop_processes(make_supervisor: Callable[..., Supervisor]) -> None:
    web = queues.QueueConfig("web", 40, ("GATHERING",), processes=2, loop_block_limit=5.0)
    sup = make_supervisor(queues={"web": web})
    # Each process counts only its own attempts: twenty in each of two, all overlapping.
    ids = [t.id for t in sup.submit([parse_spec({"type": "GATHERING", "payload": {"expect": 20}})] * 40).tasks]
    ended = [wait_ended(sup, task_id) for task_id in ids]
    assert {t.status for t in ended} == {TaskStatus.COMPLETED} and {t.queue for t in ended} == {"web"}
    assert len({t.executor_pid for t in ended}) == 2
    assert [p.block_limit for p in sup.call(lambda: list(sup.loops["web"]))] == [5.0, 5.0]


# --- the real daemon ------------------------------------------------------------------------------

ASYNC = {"UNTIL_FILE": "tests.async_executors:UntilFile", "UNTIL_CANCELLED": "tests.async_executors:UntilCancelled"}


def test_kill9_of_the_daemon_ends_its_event_loop_process_and_the_restart_logs_every_attempt(
    daemons: Callable[..., Any], tmp_path: Path
) -> None:
    d = daemons(executors=ASYNC, max_workers=8).start()
    waiting = [d.submit("UNTIL_FILE", payload={"path": str(tmp_path / "never")}) for _ in range(3)]
    for task_id in waiting:
        wait_for(lambda task_id=task_id: d.task(task_id)["progress"] == 1)
    pids = {d.task(task_id)["executor_pid"] for task_id in waiting}
    assert len(pids) == 1  # the three share one event-loop process
    loop_pid = pids.pop()
    d.kill9()
    # It ends within about a second of the daemon's death (tests/test_event_loop.py times that on
    # its own); the bound here is loose because four test workers share two cores.
    wait_for(lambda: not psutil.pid_exists(loop_pid) or psutil.Process(loop_pid).status() == psutil.STATUS_ZOMBIE,
             timeout=15)
    d.start()
    for task_id in waiting:
        task = d.task(task_id)
        assert task["status"] == "failed" and task["error_type"] == "INTERRUPTED"
    assert sorted(e["task_id"] for e in d.data("restarts")) == sorted(waiting)
    # Recreated, one runs again in a new event-loop process, and completes.
    entry = d.data("restarts")[0]
    (tmp_path / "never").touch()
    (recreated,) = d.data("restarts_recreate", ids=[str(entry["id"])])["results"]
    run = d.data("show", id=recreated["run_id"])["object"]
    done = d.wait_task(run["tasks"][0]["id"], "completed")
    assert done["executor_pid"] != loop_pid


def test_sigterm_puts_async_attempts_back_and_the_next_start_runs_them(
    daemons: Callable[..., Any], tmp_path: Path
) -> None:
    d = daemons(executors=ASYNC, max_workers=8, shutdown_grace=0.5).start()
    gate = tmp_path / "gate"
    task_id = d.submit("UNTIL_FILE", payload={"path": str(gate)})
    wait_for(lambda: d.task(task_id)["progress"] == 1)
    assert d.stop() == 0
    reader = db.open_database(d.database)
    try:
        assert tasks.get(reader, task_id).status is TaskStatus.PENDING  # put back, not failed
    finally:
        reader.close()
    gate.touch()
    d.start()
    assert d.wait_task(task_id, "completed")["retry_count"] == 0


def test_an_idle_event_loop_process_is_not_taken_for_blocked_and_ends_after_the_idle_timeout(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    # Its heartbeats are not read while it holds nothing: that must not look like a blocked loop.
    sup = make_supervisor(idle_process_timeout=1.5)
    sup.call(lambda: setattr(sup.loops["default"], "block_limit", 0.3))
    first = wait_ended(sup, submit(sup, "GATHERING", payload={"expect": 0}))
    process = loop_processes(sup)[0]
    assert first.status is TaskStatus.COMPLETED and process.pid == first.executor_pid
    wait_for(lambda: not loop_processes(sup), timeout=10)  # ended as idle, never as blocked
    assert not process.blocked and process.exitcode == 0
    again = wait_ended(sup, submit(sup, "GATHERING", payload={"expect": 0}))
    assert again.status is TaskStatus.COMPLETED and again.executor_pid != first.executor_pid
