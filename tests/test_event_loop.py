"""The event-loop executor process for real (SPEC §15): many attempts of async executors at once.

No supervisor: each test starts `executors.event_loop.serve` with a fork-server context, as
`daemon.engine.executor_processes` starts the other kind of process, sends pickled assignments and control commands
down its pipes, and synchronises on the messages it sends back.
"""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from daemon import models, pipes
from tests import executor_launch
from executors import assignment
from executors._parent import ORPHANED
from tests.conftest import make_task
from tests.loop_harness import LoopProcess, forkserver, start  # noqa: F401 (fixtures)


def first_and_last_lines(path: Path) -> tuple[str, str]:
    lines = path.read_text().splitlines()
    return lines[0], lines[-1]


# --- many at once -----------------------------------------------------------------------------------


def test_two_hundred_attempts_run_at_once_in_one_process(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    tokens = [loop.assign("GATHERING", {"expect": 200}, task_id=f"t{i}") for i in range(200)]
    results = {}
    while len(results) < 200:
        message = loop.until(lambda m: m["type"] == "result")
        results[message["attempt"]] = message
    assert set(results) == set(tokens)
    assert all(m["error"] is None and m["result"]["seen"] == 200 for m in results.values())
    # Every attempt had started (said so) before any ended: they overlapped.
    first_result = next(i for i, m in enumerate(loop.messages) if m["type"] == "result")
    started = {m["attempt"] for m in loop.messages[:first_result] if m["type"] == "progress" and m["text"] == "started"}
    assert started == set(tokens)
    assert len({loop.process.pid}) == 1 and loop.process.is_alive()


def test_one_attempt_raising_fails_alone(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    waiting = loop.assign("UNTIL_FILE", {"path": str(loop.log_dir / "go")}, task_id="waits")
    raising = loop.assign("RAISING", task_id="raises")
    failed = loop.result(raising)
    assert failed["error_type"] == models.EXCEPTION and failed["error"] == "ValueError: boom from an async executor"
    assert "ValueError: boom from an async executor" in loop.log_path("raises").read_text()
    (loop.log_dir / "go").touch()
    assert loop.result(waiting)["result"] == {"path": str(loop.log_dir / "go")}
    other = loop.assign("GATHERING", {"expect": 1}, task_id="after")  # the process goes on
    assert loop.result(other)["error"] is None


# --- cancel -------------------------------------------------------------------------------------------


def test_a_cancel_stops_its_attempt_only(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    cancelled = loop.assign("UNTIL_CANCELLED", task_id="victim")
    other = loop.assign("UNTIL_FILE", {"path": str(loop.log_dir / "go")}, task_id="bystander")
    loop.until(lambda m: m.get("attempt") == cancelled and m["type"] == "progress")
    loop.until(lambda m: m.get("attempt") == other and m["type"] == "progress")
    loop.command("cancel", cancelled, "cancel")
    result = loop.result(cancelled)
    assert result["error_type"] == models.CANCELLED
    assert first_and_last_lines(loop.log_path("victim"))[1].endswith("task cancelled by the user (CANCELLED: cancelled)")
    assert not loop.of(other)[1:]  # only its "waiting": still running, untouched
    (loop.log_dir / "go").touch()
    assert loop.result(other)["error"] is None


def test_a_coroutine_ignoring_the_cancel_is_cancelled_after_the_grace(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    stubborn = loop.assign("STUBBORN", task_id="stubborn", cancel_grace=0.2)
    swallowing = loop.assign("STUBBORN", {"swallow": True}, task_id="swallowing", cancel_grace=0.2)
    for token in (stubborn, swallowing):
        loop.until(lambda m, t=token: m.get("attempt") == t and m["type"] == "progress")
        loop.command("cancel", token, "timeout")
    assert loop.result(stubborn)["error_type"] == models.CANCELLED
    log = loop.log_path("stubborn").read_text()
    assert "still running 0.2 s after the cancel: its coroutine is cancelled" in log
    # One that swallows the CancelledError too is reported cancelled after the grace again.
    assert loop.result(swallowing)["error_type"] == models.CANCELLED
    assert "ignored being cancelled" in loop.log_path("swallowing").read_text()
    later = loop.assign("GATHERING", {"expect": 1}, task_id="later")  # the loop is not stuck
    assert loop.result(later)["error"] is None


def test_a_cancel_sent_before_its_assignment_is_kept_for_it(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    loop.command("cancel", "early#1", "shutdown")
    loop.until(lambda m: m["type"] == "alive")  # the loop has read it (one read loop for both pipes)
    token = loop.assign("UNTIL_CANCELLED", task_id="early")
    assert loop.result(token)["error_type"] == models.CANCELLED
    assert "interrupted by the daemon's shutdown" in first_and_last_lines(loop.log_path("early"))[1]


# --- pause ----------------------------------------------------------------------------------------------


def test_pause_and_resume_by_command(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("PAUSE_WATCHER", task_id="watched")
    loop.until(lambda m: m.get("attempt") == token and m["type"] == "progress")
    loop.command("pause", token)
    loop.until(lambda m: m.get("attempt") == token and m.get("text") == "paused")
    loop.command("resume", token)
    loop.until(lambda m: m.get("attempt") == token and m.get("text") == "resumed")
    assert loop.result(token)["result"] == {"cancelled": False}


def test_a_cancel_wakes_a_paused_attempt(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("PAUSE_WATCHER", task_id="watched")
    loop.command("pause", token)
    loop.until(lambda m: m.get("attempt") == token and m.get("text") == "paused")
    loop.command("cancel", token, "cancel")
    assert loop.result(token)["result"] == {"cancelled": True}


def test_a_self_pause_clears_puts_then_waits_and_a_resume_right_after_is_never_lost(
    start: Callable[..., LoopProcess]
) -> None:
    loop = start()
    token = loop.assign("SELF_PAUSING", task_id="pauser")
    request = loop.until(lambda m: m.get("attempt") == token)
    assert request == {"type": "pause_request", "reason": "waiting for a resource", "attempt": token}
    loop.command("resume", token)  # the moment it is read, as the supervisor does
    assert loop.result(token)["result"] == {"resumed": True}
    assert [m["type"] for m in loop.of(token)] == ["pause_request", "progress", "result"]


def test_a_self_pause_ended_by_the_executor_itself(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("SELF_PAUSING", {"self_resume": True}, task_id="pauser")
    assert loop.result(token)["result"] == {"resumed": True}
    assert [m["type"] for m in loop.of(token)] == ["pause_request", "resume_request", "progress", "result"]


# --- messages and logs ----------------------------------------------------------------------------------


def test_progress_logs_and_prints_go_to_their_own_attempt(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    tokens = {task_id: loop.assign("CHATTY", task_id=task_id) for task_id in ("one", "two", "three")}
    for task_id, token in tokens.items():
        assert loop.result(token)["result"] == {"id": task_id}
    for task_id, token in tokens.items():
        mine = loop.of(token)
        assert {"type": "progress", "percent": 10, "text": f"progress of {task_id}", "attempt": token} in mine
        assert {"type": "log", "level": "WARNING", "message": f"warning of {task_id}", "attempt": token} in mine
        text = loop.log_path(task_id).read_text()
        others = [other for other in tokens if other != task_id]
        for line in (f"printed by {task_id}", f"to stderr by {task_id}", f"INFO info of {task_id}", f"WARNING warning of {task_id}"):
            assert line in text
        assert not any(other in text for other in others)
        first, last = first_and_last_lines(loop.log_path(task_id))
        assert re.search(
            rf"INFO task {task_id} \(CHATTY\) attempt 1 started in pid {loop.process.pid} with tests.async_executors:Chatty$", first
        )
        assert last.endswith("INFO task finished: ok")


def test_each_log_is_kept_within_its_limit(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    limits = assignment.Limits(log_bytes=16 * 1024)
    token = loop.assign("CHATTY", {"bytes": 100_000}, task_id="loud", limits=limits)
    assert loop.result(token)["error"] is None
    log, rotated = loop.log_path("loud"), Path(f"{loop.log_path('loud')}.1")
    assert rotated.exists() and log.stat().st_size <= 8 * 1024 + 4096 and rotated.stat().st_size <= 8 * 1024 + 4096
    assert log.read_text().splitlines()[-1].endswith("task finished: ok")


def test_result_limits_fail_only_the_attempt_over_them(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    limits = assignment.Limits(result_bytes=1000)
    big = loop.assign("SIZED", {"size": 2000}, task_id="big", limits=limits)
    small = loop.assign("SIZED", {"size": 10}, task_id="small", limits=limits)
    refused = loop.result(big)
    assert refused["error_type"] == models.BAD_RESULT and "more than max_result_bytes (1000)" in refused["error"]
    assert loop.result(small)["result"] == {"data": "x" * 10}
    assert "task finished: BAD_RESULT" in first_and_last_lines(loop.log_path("big"))[1]


def test_a_plain_executor_is_refused_with_one_clear_error(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("NOT_ASYNC", task_id="plain")
    result = loop.result(token)
    assert result["error_type"] == models.NO_EXECUTOR and "is not async def" in result["error"]


def test_an_attempt_whose_log_cannot_be_opened_fails_alone(start: Callable[..., LoopProcess], tmp_path: Path) -> None:
    loop = start()
    task = make_task("GATHERING", {"expect": 1}, id="nolog")
    message = assignment.Assignment(task, "tests.async_executors:Gathering", {}, str(tmp_path / "missing" / "x.log"), "nolog#1")
    pipes.send_within(loop.assignments.fileno(), pickle.dumps(message), 5.0)
    result = loop.result("nolog#1")
    assert result["error_type"] == models.EXCEPTION and "cannot open its log" in result["error"]
    assert loop.result(loop.assign("GATHERING", {"expect": 1}, task_id="fine"))["error"] is None


# --- heartbeat --------------------------------------------------------------------------------------------


def test_the_heartbeat_stops_while_an_attempt_blocks_the_loop(start: Callable[..., LoopProcess]) -> None:
    loop = start(heartbeat=0.02)
    loop.until(lambda m: m["type"] == "alive")
    loop.until(lambda m: m["type"] == "alive")  # and it repeats
    token = loop.assign("BLOCKING", {"seconds": 0.5, "after": 0.2}, task_id="blocker")
    loop.result(token)
    kinds = [m.get("text") or m["type"] for m in loop.messages]
    blocking, unblocked = kinds.index("blocking"), kinds.index("unblocked")
    # 0.5 s blocked at a 0.02 s interval: no beat between the two, beats again after.
    assert "alive" not in kinds[blocking:unblocked]
    assert "alive" in kinds[unblocked:]


# --- the end ------------------------------------------------------------------------------------------------


def test_dismissed_it_exits_once_its_running_attempts_have_reported(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("UNTIL_FILE", {"path": str(loop.log_dir / "go")}, task_id="last")
    loop.until(lambda m: m.get("attempt") == token)
    loop.assignments.close()
    loop.until(lambda m: m["type"] == "alive")  # a full beat later, still there
    assert loop.process.is_alive()
    (loop.log_dir / "go").touch()
    assert loop.result(token)["error"] is None
    assert loop.exit_code(10) == 0


def test_when_the_daemon_is_gone_it_cancels_every_attempt_and_exits(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    tokens = [loop.assign("STUBBORN", task_id=f"orphan{i}") for i in range(3)]
    for token in tokens:
        loop.until(lambda m, t=token: m.get("attempt") == t)
    pid = loop.process.pid
    began = time.monotonic()
    loop.control.close()
    assert loop.exit_code(5) == 1
    assert time.monotonic() - began < 3
    assert not [m for m in loop.messages if m["type"] == "result"]
    for i in range(3):
        assert first_and_last_lines(loop.log_path(f"orphan{i}"))[1].endswith(ORPHANED)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_when_the_daemon_is_gone_a_blocked_loop_is_ended_too(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    token = loop.assign("BLOCKING", {"seconds": 30}, task_id="blocked")
    loop.until(lambda m: m.get("attempt") == token)
    began = time.monotonic()
    loop.control.close()
    assert loop.exit_code(10) == 1
    assert time.monotonic() - began < 5
    assert first_and_last_lines(loop.log_path("blocked"))[1].endswith(ORPHANED)


# --- the other kind of process, and the registry -------------------------------------------------------------


def test_an_async_executor_in_a_one_at_a_time_process_gets_one_clear_error(forkserver: Any, tmp_path: Path) -> None:
    task = make_task("GATHERING", {"expect": 1})
    child = executor_launch.spawn(task, "tests.async_executors:Gathering", {}, tmp_path / "g.log", context=forkserver)
    try:
        messages: list[dict[str, Any]] = []
        while child.reap(0) is None or not child.status.closed:
            messages += child.drain().messages
            pipes.ready([child.status, child.sentinel], 0.1)
        messages += child.drain().messages
    finally:
        child.close()
    [result] = [m for m in messages if m["type"] == "result"]
    assert result["error_type"] == models.NO_EXECUTOR
    assert "its execute() is async def" in result["error"] and "event-loop executor process" in result["error"]
    assert "never awaited" not in (tmp_path / "g.log").read_text()


def test_the_registry_tells_event_loop_executors_apart() -> None:
    from executors import registry

    reg = registry.Registry()
    reg.add("GATHERING", "tests.async_executors:Gathering")
    reg.add("NOT_ASYNC", "tests.async_executors:NotAsync")
    assert reg.runs_in_event_loop("GATHERING") and not reg.runs_in_event_loop("NOT_ASYNC")
