"""Executor subprocesses for real: spawn, results, crashes, pause, cancel, process trees, floods.

No supervisor and no database: each test drives `daemon.engine.executor_processes` directly, the way the supervisor
does, and synchronises on files the sample executors write and on the status channel.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from daemon import models, pipes, processes
from daemon.engine import executor_processes
from tests import executor_launch
from executors import tasklog
from executors import assignment, channel, endpoint
from executors.base import ExecuteResult, TaskContext
from tests.conftest import make_task, wait_for
from tests.media import Recorder

REPO = Path(__file__).resolve().parent.parent

Launch = Callable[..., executor_processes.ExecutorProcess]


@pytest.fixture(scope="module")
def forkserver() -> executor_processes.ExecutorContext:
    return executor_processes.make_context("forkserver")


@pytest.fixture
def launch(forkserver: Any, tmp_path: Path) -> Iterator[Launch]:
    """Start a sample executor; whatever is still running at the end of the test is killed."""
    started: list[executor_processes.ExecutorProcess] = []

    def _launch(
        executor: str, payload: dict[str, Any] | None = None, *, context: Any = None,
        upstream: dict[str, Any] | None = None, ref: str | None = None, limits: assignment.Limits = assignment.Limits(),
    ) -> executor_processes.ExecutorProcess:
        task = make_task(executor.upper(), payload)
        child = executor_launch.spawn(
            task, ref or f"tests.sample_executors:{executor}", upstream or {},
            tmp_path / "logs" / f"{task.id}.log", context=context or forkserver, limits=limits,
        )
        started.append(child)
        return child

    yield _launch
    for child in started:
        if child.is_alive():
            child.kill_attempt()
        child.reap(5)
        child.close()


@pytest.fixture
def launcher(forkserver: Any) -> Iterator[executor_processes.ExecutorProcess]:
    """A launcher, waiting for its first attempt; dismissed (killed if need be) at the end."""
    started = executor_processes.start_process(forkserver, "fresh")
    yield started
    started.dismiss()


def read_drained(child: executor_processes.ExecutorProcess, limit: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """What one drain read, and whether more may come. A launcher's report of its fork's exit
    (which comes on a pipe of its own) is put last, as an "exited" entry with the exit status."""
    messages, open_, exitcode = child.drain(limit)
    if exitcode is not None and child.kind == "fresh":
        messages = [*messages, {"type": "exited", "exitcode": exitcode}]
    return messages, open_


def collect(child: executor_processes.ExecutorProcess, limit: int | None = None, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Every message until the channel is closed and the process has ended, like the supervisor."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        batch, open_ = read_drained(child, limit)
        assert limit is None or len(batch) <= limit + 1  # + a launcher's exit report
        # A launcher that exits after its fork reports that fork's exit, then its own.
        messages += [m for m in batch if m["type"] != "exited" or not any(s["type"] == "exited" for s in messages)]
        if not open_ and not child.is_alive():
            break
        assert time.monotonic() < deadline, f"child still running; got {messages[-3:]}"
        mp_connection.wait([child.sentinel, *([child.status.fileno()] if open_ else [])], 0.5)
    assert child.reap(5) is not None
    return messages


def next_message(child: executor_processes.ExecutorProcess, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Read messages (keeping them in `seen`) until one of type `kind` arrives."""
    def arrived() -> dict[str, Any] | None:
        for message in read_drained(child, 1)[0]:
            seen.append(message)
            if message["type"] == kind:
                return message
        return None

    found = wait_for(arrived, 10)
    assert found is not None
    return found


def result_of(messages: list[dict[str, Any]]) -> dict[str, Any]:
    results = [m for m in messages if m["type"] == "result"]
    assert len(results) == 1 and messages[-1] is results[0], messages[-5:]
    return results[0]


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- results ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_success_sends_the_result_and_exits_0(launch: Launch, start_method: str) -> None:
    child = launch("Echo", {"a": 1}, context=executor_processes.make_context(start_method))
    assert child.pid > 0 and child.log_path.name == "task-echo.log"
    messages = collect(child)
    assert messages == [
        {"type": "result", "result": {"echo": {"a": 1}, "task_id": "task-echo"}, "error": None, "error_type": None}
    ]
    assert child.exitcode == 0
    log = child.log_path.read_text()
    assert "task task-echo (ECHO) attempt 1 started" in log and "task finished: ok" in log


def test_a_json_string_result_arrives_as_its_text(launch: Launch) -> None:
    # The text itself, so that the supervisor can tell JSON text from any other kind of value
    # (a list, sent as one, is no result: BAD_RESULT); it stores the text decoded.
    assert result_of(collect(launch("JsonText", {"json": "[1, 2]"})))["result"] == "[1, 2]"


def test_upstream_results_reach_the_executor(launch: Launch) -> None:
    upstream = {"dep-1": {"path": "/tmp/x"}, "dep-2": None}
    assert result_of(collect(launch("Upstream", upstream=upstream)))["result"] == {"upstream": upstream}


def test_an_exception_is_an_exception_result_with_its_traceback_in_the_log(launch: Launch) -> None:
    child = launch("Raising")
    messages = collect(child)
    assert messages[0] == {"type": "progress", "percent": 10, "text": None}
    result = result_of(messages)
    assert result["error"] == "ValueError: boom from the executor"
    assert result["error_type"] == models.EXCEPTION and child.exitcode == 0
    log = child.log_path.read_text()
    assert "Traceback (most recent call last)" in log and 'raise ValueError("boom from the executor")' in log


@pytest.mark.parametrize(
    ("kind", "error", "error_type"),
    [
        ("object", "the result cannot be stored as JSON: Object of type object is not JSON serializable",
         models.BAD_RESULT),
        ("nan", "the result cannot be stored as JSON: Out of range float values are not JSON compliant",
         models.BAD_RESULT),
        ("list", "the result must be a dict (a JSON object) or a JSON string, not list", models.BAD_RESULT),
        ("bad_json", "the result is a string that is not valid JSON", models.BAD_RESULT),
        ("not_a_result", "execute() returned dict, not an ExecuteResult", models.EXCEPTION),  # a bug, no result
    ],
)
def test_an_unusable_result_is_refused_in_the_executor_process(
    launch: Launch, kind: str, error: str, error_type: str
) -> None:
    result = result_of(collect(launch("BadResult", {"kind": kind})))
    assert result["error"].startswith(error) and result["error_type"] == error_type


def test_an_error_type_alone_is_an_error(launch: Launch) -> None:
    result = result_of(collect(launch("BadResult", {"kind": "only_error_type"})))
    assert result == {"type": "result", "result": None, "error": "PAYLOAD_ERROR", "error_type": "PAYLOAD_ERROR"}


def test_an_unimportable_executor_is_an_exception_in_the_child(launch: Launch) -> None:
    result = result_of(collect(launch("Echo", ref="tests.no_such_module:Echo")))
    assert result["error_type"] == models.EXCEPTION and "cannot import module 'tests.no_such_module'" in result["error"]


def test_a_result_over_max_result_bytes_is_refused_before_it_is_sent(launch: Launch) -> None:
    limits = assignment.Limits(result_bytes=1000)
    # {"blob":"x...x"}: 11 bytes around the blob.
    assert result_of(collect(launch("BigResult", {"size": 989}, limits=limits)))["error"] is None
    messages = collect(launch("BigResult", {"size": 990}, limits=limits))
    assert messages == [{  # the one message, without the result
        "type": "result", "result": None, "error_type": models.BAD_RESULT,
        "error": "the result takes 1001 bytes as JSON, more than max_result_bytes (1000)",
    }]


def test_a_big_result_is_reassembled(launch: Launch) -> None:
    result = result_of(collect(launch("BigResult", {"size": 3_000_000}, limits=assignment.Limits(result_bytes=4_000_000))))
    assert result["result"] == {"blob": "x" * 3_000_000}


def test_pausable_and_clamped_progress_messages(launch: Launch) -> None:
    messages = collect(launch("TogglePausable"))
    assert messages[:-1] == [
        {"type": "pausable", "pausable": False},
        {"type": "progress", "percent": 0, "text": None},
        {"type": "progress", "percent": 100, "text": "over"},
        {"type": "progress", "percent": 42, "text": None},
    ]


def test_stdout_stderr_grandchildren_and_ctx_log_land_in_the_task_log(launch: Launch) -> None:
    child = launch("Printer")
    messages = collect(child)
    assert {"type": "log", "level": "WARNING", "message": "careful from ctx.log"} in messages
    assert not any(m["type"] == "log" and "hello" in m["message"] for m in messages)  # INFO stays local
    log = child.log_path.read_text()
    for line in ("hello on stdout", "hello on stderr", "hello from a grandchild", "grandchild stderr"):
        assert line in log
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO hello from ctx\.log$", log, re.M)


def test_an_executor_ignores_no_signal_even_when_its_daemon_was_started_ignoring_some(tmp_path: Path) -> None:
    # A daemon started in the background by a script has SIGINT and SIGQUIT ignored, which the
    # fork server passes on to what it starts; the commands executors run would inherit it.
    script = textwrap.dedent("""
        import re, signal, sys
        from daemon.engine import executor_processes
        process = executor_processes.start_process(executor_processes.make_context("forkserver"), "fresh")
        try:  # the fork that waits for a task: what an attempt, and its commands, start from
            status = open(f"/proc/{process.attempt_pid}/status").read()
            print(int(re.search(r"^SigIgn:\\s*([0-9a-f]+)$", status, re.M).group(1), 16))
        finally:
            process.dismiss()
    """)
    ignore = lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)]  # noqa: E731
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO,
                          preexec_fn=ignore)
    ignored = int(done.stdout.strip() or -1)
    assert ignored >= 0, done.stderr
    assert not ignored & (1 << (signal.SIGINT - 1)) and not ignored & (1 << (signal.SIGQUIT - 1))


def test_the_child_is_out_of_the_terminals_reach(launch: Launch, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = launch("Hang", {"ready_file": str(ready)})
    wait_for(ready.exists)
    # Ctrl-C on the daemon's terminal signals its foreground process group: the supervisor's to
    # handle, so the executor is in a group of its own.
    assert os.getpgid(child.pid) == child.pid != os.getpgrp()
    status = Path(f"/proc/{child.pid}/status").read_text()
    ignored = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M).group(1), 16)  # type: ignore[union-attr]
    # Nothing ignored that the commands it runs would inherit; terminate_tree must still work.
    assert not ignored & (1 << (signal.SIGINT - 1)) and not ignored & (1 << (signal.SIGTERM - 1))
    fds = {fd: os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in (0, 1, 2)}
    assert fds == {0: os.devnull, 1: str(child.log_path), 2: str(child.log_path)}


def test_a_log_that_cannot_be_opened_is_reported_as_an_exception(forkserver: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    child = executor_launch.spawn(make_task("ECHO"), "tests.sample_executors:Echo", {}, log_dir, context=forkserver)
    result = result_of(collect(child))  # the "log file" is a directory
    assert result["error_type"] == models.EXCEPTION
    assert result["error"].startswith("the executor process could not start: IsADirectoryError")
    assert child.exitcode == 1
    child.close()


# --- crashes ----------------------------------------------------------------------------------------


def test_os_exit_leaves_no_result_and_its_exit_code(launch: Launch) -> None:
    child = launch("ExitAbruptly")
    assert collect(child) == []
    assert child.exitcode == 3 and executor_processes.describe_exit(child.exitcode) == "exit code 3"
    assert tasklog.tail(child.log_path, 3).endswith("about to exit abruptly")


def test_sigkill_gives_a_negative_exit_code(launch: Launch, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = launch("Hang", {"ready_file": str(ready)})
    wait_for(ready.exists)
    os.kill(child.pid, signal.SIGKILL)
    assert collect(child) == []
    assert child.exitcode == -signal.SIGKILL and executor_processes.describe_exit(child.exitcode) == "killed by SIGKILL"


def test_a_segfault_gives_sigsegv_and_a_python_traceback_in_the_log(launch: Launch) -> None:
    child = launch("Segfault")
    assert collect(child) == []
    assert executor_processes.describe_exit(child.exitcode) == "killed by SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in child.log_path.read_text()


# --- pause and resume -------------------------------------------------------------------------------


def counter(launch: Launch, tmp_path: Path, n: int = 1_000_000) -> tuple[executor_processes.ExecutorProcess, Path, Path]:
    count, state = tmp_path / "count", tmp_path / "state"
    child = launch("Counter", {"n": n, "step": 0.001, "count_file": str(count), "state_file": str(state)})
    return child, count, state


def test_pause_stops_the_counter_and_resume_continues_it(launch: Launch, tmp_path: Path) -> None:
    child, count, state = counter(launch, tmp_path)
    wait_for(lambda: int(read(count) or 0) >= 2)
    child.pause()
    wait_for(lambda: read(state) == "paused")  # written just before it blocks in wait_if_paused
    frozen = read(count)
    child.drain()
    assert child.is_alive() and read(count) == frozen
    child.resume()
    wait_for(lambda: int(read(count) or 0) > int(frozen or 0))
    assert read(state) == "running"
    child.request_cancel()
    assert result_of(collect(child))["error_type"] == models.CANCELLED


def test_request_pause_clears_then_reports_then_waits(launch: Launch, tmp_path: Path) -> None:
    resumed = tmp_path / "resumed"
    child = launch("SelfPause", {"resumed_file": str(resumed)})
    seen: list[dict[str, Any]] = []
    assert next_message(child, "pause_request", seen)["reason"] == "waiting for the user (1)"
    # The child waits: for the resume below, nothing else.
    assert not mp_connection.wait([child.status.fileno(), child.sentinel], 0.2)
    assert child.is_alive() and not resumed.exists()
    child.resume()
    assert result_of(collect(child))["result"] == {"resumed": 1}
    assert read(resumed) == "1"


def test_a_resume_sent_on_receipt_of_the_request_is_never_lost(launch: Launch) -> None:
    child = launch("SelfPause", {"times": 25})
    seen: list[dict[str, Any]] = []
    for _ in range(25):
        next_message(child, "pause_request", seen)
        child.resume()  # as fast as a supervisor can: often before the child reaches its wait
    assert result_of(collect(child))["result"] == {"resumed": 25}


def test_a_resume_during_the_request_itself_is_kept() -> None:
    """The earliest possible resume, set while the request is being sent, ends the wait."""
    cancel, resume = threading.Event(), threading.Event()
    resume.set()

    class ResumeOnReceipt:
        def put(self, message: dict[str, Any]) -> None:
            if message["type"] == "pause_request":
                resume.set()

    ctx = TaskContext(make_task("SELF_PAUSE"), ResumeOnReceipt(), cancel, resume)  # type: ignore[arg-type]
    waiter = threading.Thread(target=ctx.request_pause, args=("gpu_oom",), daemon=True)
    waiter.start()
    waiter.join(5)
    assert not waiter.is_alive()


def test_request_pause_of_a_cancelled_task_returns_at_once() -> None:
    cancel, resume = threading.Event(), threading.Event()
    sent: list[dict[str, Any]] = []

    class Sink:
        def put(self, message: dict[str, Any]) -> None:
            sent.append(message)

    cancel.set()
    ctx = TaskContext(make_task("SELF_PAUSE"), Sink(), cancel, resume)  # type: ignore[arg-type]
    ctx.request_pause("late")
    ctx.request_resume()  # no pause of its own in progress: nothing to end
    assert sent == [] and not resume.is_set()


def test_a_cancel_that_lands_inside_request_pause_leaves_the_task_resumed() -> None:
    # The cancel (cancel set, then resume set) comes between request_pause's look at the cancel
    # Event and its clear of the resume Event: the executor's other threads, waiting in
    # wait_if_paused, must still wake.
    cancel = threading.Event()

    class CancelledJustBeforeTheClear(threading.Event):
        def clear(self) -> None:
            cancel.set()  # as the control reader applies "cancel": cancel first, then resume
            self.set()
            super().clear()

    resume = CancelledJustBeforeTheClear()
    resume.set()
    ctx = TaskContext(make_task("SELF_PAUSE"), Recorder(), cancel, resume)  # type: ignore[arg-type]
    ctx.request_pause("waiting for the disk")  # returns at once: the task is cancelled
    assert ctx.cancelled and ctx.wait_if_paused(0)


def test_progress_from_two_threads_arrives_in_the_order_it_was_recorded() -> None:
    # The first report is held up while it is being sent; the second, recorded after it, must
    # not overtake it: the last value recorded is the one the supervisor keeps.
    sending_first, release_first = threading.Event(), threading.Event()
    sent: list[int] = []

    class SlowFirstSend:
        def put(self, message: dict[str, Any]) -> None:
            if message["percent"] == 99:
                sending_first.set()
                release_first.wait(10)
            sent.append(message["percent"])

    ctx = TaskContext(make_task("PROGRESS"), SlowFirstSend(), threading.Event(), threading.Event())  # type: ignore[arg-type]
    first = threading.Thread(target=ctx.progress, args=(99,))
    first.start()
    sending_first.wait(10)
    second = threading.Thread(target=ctx.progress, args=(100,))
    second.start()
    second.join(0.5)  # a bound for the failure case only: done by now if it could overtake
    release_first.set()
    first.join(10)
    second.join(10)
    assert sent == [99, 100]


def test_text_that_is_not_valid_unicode_is_sent_escaped() -> None:
    # os.fsdecode of a file name with bytes that are not UTF-8 gives lone surrogates.
    name = os.fsdecode(b"clip\xff.mp4")
    frame = channel.encode({"type": "progress", "percent": 5, "text": f"encoding {name}"})
    assert json.loads(frame[channel.HEADER_SIZE:]) == {"type": "progress", "percent": 5, "text": "encoding clip\\udcff.mp4"}
    result = endpoint.result_message(ExecuteResult(error=f"cannot read {name}", error_type="CANCELLED"), 1000)
    assert json.loads(channel.encode(result)[channel.HEADER_SIZE:])["error_type"] == "CANCELLED"
    # A result's value is what other tasks read ("{download.output}"): never altered, refused.
    with pytest.raises(ValueError):
        channel.encode({"type": "result", "result": {"output": f"/media/{name}"}})
    refused = endpoint.result_message(ExecuteResult(result={"output": f"/media/{name}"}), 1000)
    assert refused["error_type"] == models.BAD_RESULT and "surrogates not allowed" in refused["error"]


def test_self_pause_then_self_resume_from_a_thread(launch: Launch) -> None:
    child = launch("SelfPauseSelfResume")
    messages = collect(child)
    assert [m["type"] for m in messages] == ["pause_request", "resume_request", "progress", "result"]
    assert messages[0]["reason"] == "gpu_oom" and result_of(messages)["result"] == {"self_resumed": True}


# --- cancel and process trees -----------------------------------------------------------------------


def test_cancel_gives_a_cancelled_result(launch: Launch, tmp_path: Path) -> None:
    child, count, _ = counter(launch, tmp_path)
    wait_for(lambda: int(read(count) or 0) >= 1)
    child.request_cancel()
    result = result_of(collect(child))
    assert result["error_type"] == models.CANCELLED and child.exitcode == 0


def test_cancel_wakes_a_paused_task(launch: Launch, tmp_path: Path) -> None:
    child, _, state = counter(launch, tmp_path)
    child.pause()
    wait_for(lambda: read(state) == "paused")
    child.request_cancel()
    assert result_of(collect(child))["error_type"] == models.CANCELLED


def test_cancel_wakes_a_self_paused_task(launch: Launch) -> None:
    child = launch("SelfPause")
    next_message(child, "pause_request", [])
    child.request_cancel()
    assert result_of(collect(child))["error_type"] == models.CANCELLED


def grandparent(launch: Launch, tmp_path: Path, **payload: Any) -> tuple[executor_processes.ExecutorProcess, int]:
    pid_file = tmp_path / "grandchild.pid"
    child = launch("Grandparent", {"pid_file": str(pid_file), **payload})
    grandchild = int(str(wait_for(lambda: read(pid_file))))
    assert not gone(grandchild)
    return child, grandchild


def test_terminate_tree_ends_the_child_and_its_grandchild(launch: Launch, tmp_path: Path) -> None:
    child, grandchild = grandparent(launch, tmp_path)
    try:
        child.request_cancel()  # ignored by this executor
        child.terminate_attempt()
        assert collect(child) == []
        assert child.exitcode == -signal.SIGTERM
        wait_for(lambda: gone(grandchild))
    finally:
        if not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_kill_tree_ends_a_tree_that_ignores_sigterm(launch: Launch, tmp_path: Path) -> None:
    child, grandchild = grandparent(launch, tmp_path, ignore_sigterm=True)
    try:
        child.terminate_attempt()  # ignored by both (SIG_IGN survives exec)
        child.kill_attempt()
        assert collect(child) == []
        assert child.exitcode == -signal.SIGKILL
        wait_for(lambda: gone(grandchild))
    finally:
        if not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_find_leftover_recognises_a_process_only_by_pid_and_start_time(launch: Launch, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = launch("Hang", {"ready_file": str(ready)})
    wait_for(ready.exists)
    assert child.create_time is not None
    found = processes.find_leftover(child.pid, child.create_time)
    assert found is not None and found.pid == child.pid
    assert processes.find_leftover(child.pid, child.create_time - 5) is None  # a reused pid
    child.kill_attempt()
    collect(child)
    wait_for(lambda: processes.find_leftover(child.pid, child.create_time or 0) is None)
    assert processes.find_leftover(2**22 + 12345, 0.0) is None  # beyond pid_max: never a process


# --- floods and broken channels ---------------------------------------------------------------------


def test_a_flood_is_drained_in_bounded_batches_and_ends_with_the_result(launch: Launch) -> None:
    messages = collect(launch("Flood", {"n": 100_000}), limit=1000)
    progress = [m for m in messages if m["type"] == "progress"]
    assert len(progress) == 100_000
    assert progress[0] == {"type": "progress", "percent": 0, "text": "0"} and progress[-1]["text"] == "99999"
    assert result_of(messages)["result"] == {"sent": 100_000}


def test_drain_after_sigkill_mid_flood_never_raises(launch: Launch) -> None:
    child = launch("Flood", {"n": 10_000_000})
    wait_for(lambda: child.drain(10).messages)  # flowing; the pipe refills while we do not read
    # Killed once the pipe is full (not after its first few messages, on a loaded machine), so
    # that there is a flood to drain.
    wait_for(lambda: pipe_bytes(child.status.connection) >= 32 * 1024)
    os.kill(child.pid, signal.SIGKILL)
    messages = collect(child, limit=1000)
    assert messages and all(m["type"] == "progress" for m in messages)
    assert child.exitcode == -signal.SIGKILL


def reader_with(data: bytes) -> channel.StatusReader:
    reader_conn, writer_conn = multiprocessing.Pipe(duplex=False)
    os.write(writer_conn.fileno(), data)
    writer_conn.close()
    return channel.StatusReader(reader_conn)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (channel.encode({"type": "progress", "percent": 5, "text": None})[:-3], "end of file inside a message"),
        (b"\x00\x00\x00\x03abc", "garbled data"),
        ((2**31).to_bytes(4, "big") + b"xxxx", "garbled data"),
        (b"\x00\x00\x00\x02[]", "garbled data"),
        (b"\x00\x00\x00\x02\xff\xfe", "garbled data"),
    ],
)
def test_the_reader_treats_broken_data_as_closed(data: bytes, reason: str) -> None:
    good = channel.encode({"type": "resume_request"})
    reader = reader_with(good + data)
    assert reader.drain() == [{"type": "resume_request"}]
    assert reader.closed and (reader.close_reason or "").startswith(reason)
    assert reader.broken == (reason == "garbled data")  # an end of file, however early, is no failure
    assert reader.drain() == []
    reader.close()


# --- small pieces -----------------------------------------------------------------------------------


def test_execute_result_ok() -> None:
    assert ExecuteResult().ok and ExecuteResult(result={"a": 1}).ok
    assert not ExecuteResult(error="x").ok and not ExecuteResult(error_type=models.CANCELLED).ok


def test_describe_exit() -> None:
    assert executor_processes.describe_exit(0) == "exit code 0"
    assert executor_processes.describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert executor_processes.describe_exit(-200) == "killed by signal 200"
    assert executor_processes.describe_exit(None) == "still running"


def test_tail_reads_the_last_lines_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    assert tasklog.tail(log) == ""
    log.write_text("".join(f"line {i} {'x' * 100}\n" for i in range(5000)))
    last = tasklog.tail(log, 3).splitlines()
    assert [line.split()[1] for line in last] == ["4997", "4998", "4999"]
    assert len(tasklog.tail(log, 20).splitlines()) == 20
    assert len(tasklog.tail(log, 10_000, max_bytes=4096)) <= 4096


def test_fork_is_refused() -> None:
    with pytest.raises(ValueError, match="forkserver, spawn"):
        executor_processes.make_context("fork")


# --- processes started ahead of their task, and processes that run several attempts -------------


def read_until(child: executor_processes.ExecutorProcess, kind: str = "result") -> list[dict[str, Any]]:
    """Messages up to and including the next of type `kind`, for a process that goes on afterwards."""
    seen: list[dict[str, Any]] = []
    next_message(child, kind, seen)
    return seen


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_an_idle_process_runs_the_one_task_it_is_given(tmp_path: Path, start_method: str) -> None:
    process = executor_processes.start_process(executor_processes.make_context(start_method))
    assert process.is_alive()
    pid, create_time = process.pid, process.create_time
    process.assign(make_task("ECHO", {"b": 2}), "tests.sample_executors:Echo", {}, tmp_path / "t.log", last=True)
    child = process
    try:
        # The same process, recognisable later by pid and start time like any executor.
        assert (child.pid, child.create_time) == (pid, create_time)
        messages = collect(child)
        assert messages[-1]["result"] == {"echo": {"b": 2}, "task_id": "task-echo"}
        assert child.exitcode == 0 and "task finished: ok" in (tmp_path / "t.log").read_text()
    finally:
        child.close()


def test_a_dismissed_idle_process_exits_without_running_anything(tmp_path: Path, forkserver: Any) -> None:
    process = executor_processes.start_process(forkserver)
    pid = process.pid
    process.dismiss()
    assert not process.is_alive() and process.exitcode == 0
    assert gone(pid)


def test_an_idle_process_can_be_paused_and_cancelled_like_any_executor(tmp_path: Path, forkserver: Any) -> None:
    process = executor_processes.start_process(forkserver)
    payload = {"n": 100_000, "step": 0.002, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    process.assign(make_task("COUNT", payload), "tests.sample_executors:Counter", {}, tmp_path / "t.log", last=True)
    child = process
    try:
        wait_for(lambda: (tmp_path / "c").exists())
        child.pause()
        wait_for(lambda: (tmp_path / "s").exists() and (tmp_path / "s").read_text() == "paused")
        child.request_cancel()
        assert collect(child)[-1]["error_type"] == "CANCELLED"
    finally:
        child.close()


def test_a_process_runs_attempts_one_after_another_and_exits_after_its_last(tmp_path: Path, forkserver: Any) -> None:
    process = executor_processes.start_process(forkserver)
    try:
        logs = [tmp_path / f"{n}.log" for n in range(3)]
        results = []
        for n, log_path in enumerate(logs):
            task = make_task("STATE", id=f"task-{n}")
            process.assign(task, "tests.sample_executors:ProcessState", {}, log_path, last=n == 2)
            messages = read_until(process) if n < 2 else collect(process)
            results.append(result_of(messages)["result"])
            if n < 2:
                assert process.is_alive()  # waiting for the next attempt
        assert {r["pid"] for r in results} == {process.pid}
        assert process.exitcode == 0 and process.attempts == 3
        with pytest.raises(OSError):  # nothing more can be sent after the last attempt
            process.assign(make_task("STATE"), "tests.sample_executors:ProcessState", {}, logs[0], last=True)
        # Each attempt's prints and log lines went to its own log, and only there.
        for n, log_path in enumerate(logs):
            text = log_path.read_text()
            assert f"attempt of task-{n}" in text and f"ctx.log of task-{n}" in text
            assert all(f"task-{m}" not in text for m in range(3) if m != n)
    finally:
        process.close()


@pytest.mark.parametrize(
    "how", ["detach", "wrap_buffer", "unflushed", "root_logging", "root_level", "handler_level", "reconfigure"]
)
def test_what_an_attempt_does_to_the_output_streams_stays_with_it(tmp_path: Path, forkserver: Any, how: str) -> None:
    process = executor_processes.start_process(forkserver)
    try:
        first, second = make_task("STREAMS", {"how": how}, id="first"), make_task("STREAMS", id="second")
        process.assign(first, "tests.sample_executors:Streams", {}, tmp_path / "first.log", last=False)
        assert result_of(read_until(process))["error"] is None
        process.assign(second, "tests.sample_executors:Streams", {}, tmp_path / "second.log", last=True)
        assert result_of(collect(process))["result"] == {"line_buffering": True}
        first_log, second_log = (tmp_path / "first.log").read_text(), (tmp_path / "second.log").read_text()
        assert "print of first" in first_log and "library warning of first" in first_log
        if how == "unflushed":
            assert "unflushed of first" in first_log
        assert "print of second" in second_log and "library warning of second" in second_log
        assert "first" not in second_log
    finally:
        process.close()


def test_commands_an_attempt_never_read_do_not_fill_its_launchers_control_pipe(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    for n in range(2):
        # Echo never looks at its Events, so its fork never reads the commands sent to it.
        launcher.assign(make_task("ECHO", id=f"echo-{n}"), "tests.sample_executors:Echo", {},
                        tmp_path / f"{n}.log", last=False)
        launcher.request_cancel()
        launcher.pause()
        assert result_of(read_until(launcher))["error"] is None
        wait_for(launcher.settled)
        assert pipe_bytes(launcher.control) == 0


def pause_then_cancel_a_counter(process: executor_processes.ExecutorProcess, tmp_path: Path) -> None:
    """Give `process` a counting attempt, pause it once it counts, then cancel it."""
    payload = {"n": 100_000, "step": 0.002, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    process.assign(make_task("COUNT", payload), "tests.sample_executors:Counter", {}, tmp_path / "a.log", last=False)
    wait_for(lambda: (tmp_path / "c").exists())
    process.pause()
    wait_for(lambda: read(tmp_path / "s") == "paused")
    process.request_cancel()


def test_a_cancel_or_a_pause_of_one_attempt_does_not_reach_the_next(tmp_path: Path, forkserver: Any) -> None:
    process = executor_processes.start_process(forkserver)
    try:
        pause_then_cancel_a_counter(process, tmp_path)
        assert result_of(read_until(process))["error_type"] == "CANCELLED"
        process.assign(make_task("STATE"), "tests.sample_executors:ProcessState", {}, tmp_path / "b.log", last=True)
        result = result_of(collect(process))["result"]
        assert result == {"pid": process.pid, "cancelled": False, "running": True}
    finally:
        process.close()


def test_a_thread_an_attempt_left_behind_cannot_report_for_the_next(tmp_path: Path, forkserver: Any) -> None:
    process = executor_processes.start_process(forkserver)
    try:
        ref = "tests.sample_executors:LeaveReporter"
        process.assign(make_task("LEAVE_REPORTER"), ref, {}, tmp_path / "a.log", last=False)
        read_until(process)
        # The reporter is still running in the process: it reports every millisecond or so.
        process.assign(make_task("STATE"), "tests.sample_executors:ProcessState", {}, tmp_path / "b.log", last=True)
        messages = collect(process)
        assert [m["type"] for m in messages] == ["result"] and messages[0]["result"]["pid"] == process.pid
    finally:
        process.close()


# --- launchers: each attempt in a fresh fork, forked before its task arrives -----------------------


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_launcher_runs_each_attempt_in_a_fresh_fork(tmp_path: Path, start_method: str) -> None:
    launcher = executor_processes.start_process(executor_processes.make_context(start_method), "fresh")
    try:
        pids = []
        for n in range(3):
            announced = launcher.attempt_pid
            assert announced is not None and announced != launcher.pid
            launcher.assign(make_task("STATE", id=f"task-{n}"), "tests.sample_executors:ProcessState", {},
                            tmp_path / f"{n}.log", last=False)
            messages = read_until(launcher, "exited")
            assert [m["type"] for m in messages] == ["result", "exited"]
            assert messages[0]["result"] == {"pid": announced, "cancelled": False, "running": True}
            assert messages[1]["exitcode"] == 0 and launcher.attempt_pid not in (None, announced)  # the next fork
            assert gone(announced)
            pids.append(announced)
        assert len(set(pids)) == 3 and launcher.is_alive()
        assert "attempt of task-1" in (tmp_path / "1.log").read_text()
        waiting = launcher.attempt_pid
        launcher.dismiss()
        assert launcher.exitcode == 0 and gone(waiting)
    finally:
        launcher.close()


def test_nothing_a_forked_attempt_started_outlives_it(tmp_path: Path, launcher: executor_processes.ExecutorProcess) -> None:
    pid_file = tmp_path / "pids"
    launcher.assign(make_task("LEAVE", {"pid_file": str(pid_file)}), "tests.sample_executors:LeavesProcesses",
                    {}, tmp_path / "a.log", last=False)
    assert result_of(read_until(launcher))["error"] is None
    # Ended before the result was sent: the one that detached into a session of its own too.
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2 and all(gone(pid) for pid in pids)
    assert "ended 2 processes the task left running" in (tmp_path / "a.log").read_text()
    # The launcher goes on to its next attempt as usual.
    launcher.assign(make_task("ECHO", {"n": 2}), "tests.sample_executors:Echo", {}, tmp_path / "b.log", last=False)
    assert result_of(read_until(launcher))["result"]["echo"] == {"n": 2}


def test_a_reused_process_keeps_what_its_attempts_started_until_it_exits(tmp_path: Path, forkserver: Any) -> None:
    # As with its threads and module state: an executor may keep helpers (a process pool) for
    # its next attempts. Nothing outlives the process itself, not even what detached itself.
    process = executor_processes.start_process(forkserver)
    pid_file = tmp_path / "pids"
    try:
        process.assign(make_task("LEAVE", {"pid_file": str(pid_file)}), "tests.sample_executors:LeavesProcesses",
                       {}, tmp_path / "a.log", last=False)
        assert result_of(read_until(process))["error"] is None
        pids = [int(pid) for pid in pid_file.read_text().split()]
        assert len(pids) == 2 and not any(gone(pid) for pid in pids)
        process.assign(make_task("ECHO", {"n": 2}), "tests.sample_executors:Echo", {}, tmp_path / "b.log", last=True)
        assert result_of(collect(process))["result"]["echo"] == {"n": 2}
        assert all(gone(pid) for pid in pids)
    finally:
        process.dismiss()
        for pid in [int(p) for p in (read(pid_file) or "").split()]:
            if not gone(pid):  # only when an assertion failed: never leave them running
                os.kill(pid, signal.SIGKILL)


def test_end_leftovers_ends_the_others_when_one_has_just_vanished() -> None:
    # A descendant may end (and be reaped by its own parent) between being listed and looked at.
    script = textwrap.dedent("""
        import subprocess, sys
        import psutil
        from executors import _parent
        vanished = subprocess.Popen(["true"])
        listed = psutil.Process(vanished.pid)
        vanished.wait()  # reaped: looking at it now fails
        sleeper = subprocess.Popen(["sleep", "60"])
        real = psutil.Process.children
        psutil.Process.children = lambda self, recursive=False: [listed, *real(self, recursive=recursive)]
        ended = _parent.end_leftovers()
        print(ended == [sleeper.pid], psutil.pid_exists(sleeper.pid))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.stdout.split() == ["True", "False"], done.stderr


@pytest.mark.parametrize("fork_each", [True, False], ids=["launcher", "reused process"])
def test_a_command_an_attempt_starts_inherits_only_stdin_stdout_and_stderr(
    tmp_path: Path, forkserver: Any, fork_each: bool
) -> None:
    # What the executor process got from multiprocessing (the fork server's pipes, the resource
    # tracker's) must not reach a command started without close_fds, as os.system starts them.
    process = executor_processes.start_process(forkserver, "fresh" if fork_each else "reused")
    try:
        process.assign(make_task("FDS"), "tests.sample_executors:InheritedFds", {}, tmp_path / "a.log", last=False)
        assert result_of(read_until(process))["result"] == {"fds": [0, 1, 2]}
    finally:
        process.dismiss()


def test_what_a_crashed_attempt_left_running_is_ended_before_the_next_attempt(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    # The worker of a fork that died holds the status pipe every later fork of the launcher
    # writes on: left running, it could report progress or a pause as the next task's.
    pid_file, go = tmp_path / "worker", tmp_path / "go"
    launcher.assign(make_task("CRASH_LEAVING_WORKER", {"pid_file": str(pid_file), "go_file": str(go)}),
                    "tests.sample_executors:CrashesLeavingAWorker", {}, tmp_path / "a.log", last=False)
    assert read_until(launcher, "exited")[-1]["exitcode"] == 3
    worker = int(pid_file.read_text())
    try:
        assert gone(worker)  # ended before the launcher reported the fork's exit
    finally:
        if not gone(worker):  # the assertion failed: never leave it running
            os.kill(worker, signal.SIGKILL)
    go.touch()
    launcher.assign(make_task("ECHO", {"n": 2}), "tests.sample_executors:Echo", {}, tmp_path / "b.log", last=False)
    assert [m["type"] for m in read_until(launcher, "exited")] == ["result", "exited"]


def test_a_reaped_process_is_not_alive_before_the_fork_server_closes_its_sentinel(
    forkserver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reaping reads the exit status out of a fork-server child's sentinel, which is readable
    # again only once the fork server has closed its end: under load, a while later.
    process = executor_processes.start_process(forkserver)
    try:
        process.process.kill()
        assert process.reap(10) == -signal.SIGKILL
        monkeypatch.setattr(executor_processes.channel, "poll_now", lambda fd: 0)  # not closed yet
        assert not process.is_alive() and process.exitcode == -signal.SIGKILL
    finally:
        process.close()


def test_a_launcher_with_no_waiting_fork_names_no_process_for_an_attempt(launcher: executor_processes.ExecutorProcess) -> None:
    # Recording the launcher itself as the attempt's process would have a stop end the launcher.
    waiting = launcher.attempt_pid
    assert launcher.next_attempt_process()[0] == waiting != launcher.pid
    launcher.attempt_pid = None  # as after its waiting fork died: it is ending
    with pytest.raises(OSError, match="no fork waiting"):
        launcher.next_attempt_process()
    launcher.attempt_pid = waiting


def test_a_result_nested_too_deeply_is_an_error_and_the_launcher_goes_on(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    launcher.assign(make_task("DEEP"), "tests.sample_executors:DeepResult", {}, tmp_path / "a.log", last=False)
    messages = read_until(launcher, "exited")
    result, exited = messages[-2], messages[-1]
    assert result["error_type"] == "BAD_RESULT" and "cannot be stored as JSON: it is nested too deeply" in result["error"]
    assert exited["exitcode"] == 0
    launcher.assign(make_task("ECHO", {"n": 2}), "tests.sample_executors:Echo", {}, tmp_path / "b.log", last=False)
    assert result_of(read_until(launcher))["result"]["echo"] == {"n": 2}


def test_an_attempt_cannot_report_its_own_exit_for_its_launcher(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    """Only the launcher's own pipe says a fork has exited: an "exited" report the attempt writes
    on its status channel is one more message (the supervisor logs it as unknown), no exit."""
    go, running_in = tmp_path / "go", launcher.attempt_pid
    launcher.assign(make_task("FORGE", {"go_file": str(go)}), "tests.sample_executors:ForgedExit", {},
                    tmp_path / "a.log", last=False)
    assert read_until(launcher, "exited") == [{"type": "exited", "exitcode": 0, "next_pid": 1}]
    assert launcher.awaiting_report and launcher.attempt_pid == running_in and not gone(running_in)
    go.touch()
    messages = read_until(launcher, "exited")
    assert [m["type"] for m in messages] == ["result", "exited"] and messages[1] == {"type": "exited", "exitcode": 0}
    assert not launcher.awaiting_report and launcher.attempt_pid not in (None, 1, running_in)


def test_an_attempt_that_crashes_leaves_its_launcher_ready_for_the_next(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    launcher.assign(make_task("EXIT", {"code": 3}), "tests.sample_executors:ExitAbruptly", {}, tmp_path / "a.log",
                    last=False)
    assert [(m["type"], m.get("exitcode")) for m in read_until(launcher, "exited")] == [("exited", 3)]
    launcher.assign(make_task("SEGFAULT"), "tests.sample_executors:Segfault", {}, tmp_path / "b.log", last=False)
    assert read_until(launcher, "exited")[-1]["exitcode"] == -signal.SIGSEGV
    assert "Fatal Python error" in (tmp_path / "b.log").read_text()  # faulthandler, set up once
    launcher.assign(make_task("ECHO", {"c": 3}), "tests.sample_executors:Echo", {}, tmp_path / "c.log", last=True)
    messages = collect(launcher)
    assert [m["type"] for m in messages] == ["result", "exited"] and messages[0]["result"]["echo"] == {"c": 3}
    assert launcher.exitcode == 0  # told it was the last: it exits after that attempt


def test_a_launchers_attempt_is_paused_cancelled_and_killed_by_its_own_tree(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    pause_then_cancel_a_counter(launcher, tmp_path)
    messages = read_until(launcher, "exited")
    assert result_of(messages[:-1])["error_type"] == "CANCELLED" and messages[-1]["exitcode"] == 0
    # An attempt that ignores SIGTERM: the tree signalled is the attempt's, not the launcher's.
    ready = tmp_path / "ready"
    launcher.assign(make_task("HANG", {"ready_file": str(ready), "ignore_sigterm": True}),
                    "tests.sample_executors:Hang", {}, tmp_path / "b.log", last=False)
    wait_for(ready.exists)
    attempt = int(ready.read_text())
    assert attempt == launcher.attempt_process[0]
    launcher.terminate_attempt()
    launcher.kill_attempt()
    assert read_until(launcher, "exited")[-1]["exitcode"] == -signal.SIGKILL
    assert gone(attempt) and launcher.is_alive()


def test_a_fork_that_dies_while_its_task_is_on_the_way_ends_its_launcher(tmp_path: Path, forkserver: Any) -> None:
    """The waiting fork reads its task from the assignment pipe itself. If it dies before it has
    read all of it, no later fork may read the rest as a task of its own: the launcher ends, and
    the supervisor's write fails rather than hangs."""
    launcher = executor_processes.start_process(forkserver, "fresh")
    waiting = launcher.attempt_pid
    assert waiting is not None
    upstream = {"big": "x" * 1_000_000}  # far more than the pipe holds: the write waits for a reader
    failed: list[BaseException] = []

    def send() -> None:
        try:
            launcher.assign(make_task("ECHO"), "tests.sample_executors:Echo", upstream, tmp_path / "a.log", last=False)
        except OSError as exc:
            failed.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    try:
        os.kill(waiting, signal.SIGSTOP)
        sender.start()
        wait_for(lambda: pipe_bytes(launcher.assignments) > 0)  # part of the task is in the pipe
        os.kill(waiting, signal.SIGKILL)
        assert launcher.reap(10) == 1
        sender.join(10)
        assert not sender.is_alive() and len(failed) == 1
        # Its last report says how the fork ended (for the CRASHED error) and that no fork
        # follows: the launcher is never handed another task, even before it is reaped.
        reports = wait_for(lambda: [m for m in read_drained(launcher)[0] if m["type"] == "exited"])
        assert reports == [{"type": "exited", "exitcode": -signal.SIGKILL}] and launcher.attempt_pid is None
        assert launcher.ending and not launcher.usable()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(waiting, signal.SIGKILL)
        launcher.kill()
        launcher.reap(5)
        launcher.close()


def pipe_bytes(connection: Any) -> int:
    unread = array.array("i", [0])
    fcntl.ioctl(connection.fileno(), termios.FIONREAD, unread)
    return unread[0]


@pytest.mark.parametrize("fork_each", [True, False])
def test_a_process_that_reads_none_of_its_task_cannot_hang_the_sender(
    tmp_path: Path, forkserver: Any, fork_each: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_processes.base, "SEND_STALL", 0.2)
    process = executor_processes.start_process(forkserver, "fresh" if fork_each else "reused")
    reader = process.attempt_pid if fork_each else process.pid
    assert reader is not None
    os.kill(reader, signal.SIGSTOP)  # stopped before it reads: a debugger, a frozen cgroup
    failed: list[BaseException] = []

    def send() -> None:
        try:
            process.assign(make_task("ECHO"), "tests.sample_executors:Echo", {"big": "x" * 1_000_000},
                           tmp_path / "a.log", last=False)
        except OSError as exc:
            failed.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(20)
    try:
        assert not sender.is_alive() and len(failed) == 1 and "read none of its task" in str(failed[0])
    finally:
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(reader, signal.SIGCONT)  # a stopped process may not have died yet
        process.reap(5)
        process.close()


def test_an_attempt_dies_with_its_launcher(tmp_path: Path, launcher: executor_processes.ExecutorProcess) -> None:
    ready = tmp_path / "ready"
    launcher.assign(make_task("HANG", {"ready_file": str(ready)}), "tests.sample_executors:Hang", {},
                    tmp_path / "a.log", last=False)
    wait_for(ready.exists)
    attempt = int(ready.read_text())
    os.kill(launcher.pid, signal.SIGKILL)  # the launcher alone: the kernel ends the attempt too
    assert launcher.reap(5) == -signal.SIGKILL
    wait_for(lambda: gone(attempt))


def test_a_command_an_executor_started_dies_with_the_executors_process(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    # The command leads a process group of its own, which the fork's death does not reach; only
    # PR_SET_PDEATHSIG, set between its fork and its exec, ends it.
    pid_file = tmp_path / "command.pid"
    argv = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    launcher.assign(make_task("SHELL", {"argv": argv}), "executors.shell:ShellExecutor", {}, tmp_path / "a.log",
                    last=False)
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
    command = int(pid_file.read_text())
    os.kill(launcher.attempt_process[0], signal.SIGKILL)  # the fork alone, not its tree
    wait_for(lambda: gone(command))


def test_steering_still_works_after_an_attempt_died_waiting_on_its_events(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    """With Events shared across a launcher's forks, a fork killed while waiting on one left a
    waiter that never wakes, and the supervisor's next cancel blocked forever."""
    for n in range(2):
        count = tmp_path / f"c{n}"
        payload = {"n": 100_000, "step": 0.5, "count_file": str(count), "state_file": str(tmp_path / f"s{n}")}
        launcher.assign(make_task("COUNT", payload, id=f"count-{n}"), "tests.sample_executors:Counter", {},
                        tmp_path / f"{n}.log", last=False)
        wait_for(count.exists)  # now sleeping in ctx.wait_cancelled(0.5)
        if n == 0:
            os.kill(launcher.attempt_process[0], signal.SIGKILL)
            assert read_until(launcher, "exited")[-1]["exitcode"] == -signal.SIGKILL
            continue
        steer = threading.Thread(
            target=lambda: (launcher.pause(), launcher.resume(), launcher.request_cancel()), daemon=True
        )
        steer.start()
        steer.join(5)
        assert not steer.is_alive(), "steering the next attempt blocked"
        messages = read_until(launcher, "exited")
        assert result_of(messages[:-1])["error_type"] == "CANCELLED" and messages[-1]["exitcode"] == 0


def test_an_attempt_killed_half_way_through_a_message_does_not_garble_the_next(
    tmp_path: Path, launcher: executor_processes.ExecutorProcess
) -> None:
    launcher.assign(make_task("BIG_RESULT", {"size": 1_000_000}), "tests.sample_executors:BigResult", {},
                    tmp_path / "a.log", last=False)
    wait_for(lambda: pipe_bytes(launcher.status) >= 60_000)  # the fork is blocked half-way through its result
    os.kill(launcher.attempt_process[0], signal.SIGKILL)
    messages = read_until(launcher, "exited")
    assert [m["type"] for m in messages] == ["exited"] and messages[0]["exitcode"] == -signal.SIGKILL
    launcher.assign(make_task("ECHO", {"after": 1}), "tests.sample_executors:Echo", {}, tmp_path / "b.log",
                    last=False)
    messages = read_until(launcher, "exited")
    assert [m["type"] for m in messages] == ["result", "exited"] and messages[0]["result"]["echo"] == {"after": 1}


@pytest.mark.parametrize("fork_each", [True, False])
def test_an_attempts_log_is_whole_before_its_result_is_sent(tmp_path: Path, forkserver: Any, fork_each: bool) -> None:
    process = executor_processes.start_process(forkserver, "fresh" if fork_each else "reused")
    try:
        for n in range(10):
            log_path = tmp_path / f"{n}.log"
            process.assign(make_task("PRINT", id=f"task-{n}"), "tests.sample_executors:Printer", {}, log_path,
                           last=False)
            seen: list[dict[str, Any]] = []

            def arrived(kind: str) -> bool:
                # Woken by the channel itself, not by polling: the result is read the moment it lands.
                # Not waited for if read already (the fork's exit can come in the result's drain).
                if not any(m["type"] == kind for m in seen):
                    mp_connection.wait(process.fds(), 5)
                    seen.extend(read_drained(process)[0])
                return any(m["type"] == kind for m in seen)

            wait_for(lambda: arrived("result"), interval=0)
            assert log_path.read_text().rstrip().endswith("task finished: ok")
            if fork_each:
                wait_for(lambda: arrived("exited"), interval=0)
    finally:
        process.dismiss()


def test_ready_names_the_handles_with_data_or_end_of_file() -> None:
    class Handle:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def fileno(self) -> int:
            return self.fd

    quiet_r, quiet_w = os.pipe()
    data_r, data_w = os.pipe()
    closed_r, closed_w = os.pipe()
    handle = Handle(data_r)
    try:
        assert pipes.ready([quiet_r, handle, closed_r], 0) == []
        os.write(data_w, b"x")
        os.close(closed_w)
        found = pipes.ready([quiet_r, handle, closed_r], 0)
        assert len(found) == 2 and handle in found and closed_r in found
        assert pipes.ready([quiet_r], 0.01) == []
    finally:
        for fd in (quiet_r, quiet_w, data_r, data_w, closed_r):
            os.close(fd)
