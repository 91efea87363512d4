"""Every `fredica` command end to end against the real daemon (CliRunner in-process for speed,
the installed command as a subprocess where the exit status of a whole process matters)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from daemon import cli
from tests.conftest import wait_for
from tests.daemon_harness import Daemon

TASK_COLUMNS = {
    "id", "type", "workflow_run_id", "material_id", "status", "priority", "depends_on", "payload",
    "result", "error", "error_type", "idempotency_key", "retry_count", "max_retries", "progress",
    "is_paused", "is_pausable", "created_at", "claimed_at", "started_at", "completed_at", "heartbeat_at",
}
RUN_COLUMNS = {"id", "material_id", "template", "status", "total_tasks", "done_tasks", "created_at", "completed_at"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    d = Daemon(tmp_path_factory.mktemp("cli") / "d", max_workers=2)
    try:
        yield d.start()
    finally:
        d.kill_if_running()


def fredica(d: Daemon, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], input=input, catch_exceptions=False)


def ok(d: Daemon, *args: str, input: str | None = None) -> str:
    result = fredica(d, *args, input=input)
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout


def refused(d: Daemon, *args: str) -> str:
    result = fredica(d, *args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def as_json(d: Daemon, *args: str) -> Any:
    return json.loads(ok(d, *args, "--json"))


def test_submit_show_ls_runs(daemon: Daemon, tmp_path: Path) -> None:
    task_id = ok(daemon, "submit", "ECHO", "--payload", '{"x": 1}', "--priority", "3", "--material", "m1").strip()
    daemon.wait_task(task_id, "completed")
    shown = as_json(daemon, "show", task_id)
    assert TASK_COLUMNS <= set(shown)
    assert shown["payload"] == {"x": 1} and shown["priority"] == 3 and shown["material_id"] == "m1"
    assert shown["result"]["echo"] == {"x": 1}
    # The one supervisor of a SQLite file names itself in what it claims, as on PostgreSQL (SPEC §16).
    assert (shown["supervisor"], shown["attempt"]) == (socket.gethostname(), 1)
    assert "supervisor:" in ok(daemon, "show", task_id)
    listed = as_json(daemon, "ls", "--status", "completed", "--type", "ECHO")
    assert task_id in {t["id"] for t in listed} and all(TASK_COLUMNS <= set(t) for t in listed)
    run_id = shown["workflow_run_id"]
    run = as_json(daemon, "show", run_id)
    assert RUN_COLUMNS <= set(run) and [t["id"] for t in run["tasks"]] == [task_id]
    assert run["template"] == "adhoc" and run["status"] == "completed"
    runs = as_json(daemon, "runs", "--status", "completed")
    assert run_id in {r["id"] for r in runs} and all(RUN_COLUMNS <= set(r) for r in runs)
    table = ok(daemon, "ls", "--run", run_id)
    assert task_id[:8] in table and "completed" in table
    assert run_id[:8] in ok(daemon, "runs")
    assert "ECHO" in ok(daemon, "show", task_id)


def test_batch_with_keys_and_idempotency(daemon: Daemon, tmp_path: Path) -> None:
    lines = "\n".join(
        json.dumps(line)
        for line in [
            {"type": "ECHO", "key": "a", "payload": {"n": 1}},
            {"type": "ECHO", "depends_on": ["a"], "idempotency_key": "batch-key"},
        ]
    )
    ids = ok(daemon, "submit", "--batch", "-", input=lines).split()
    assert len(ids) == 2
    second = daemon.wait_task(ids[1], "completed")
    assert second["depends_on"] == [ids[0]]
    # A finished key does not block; an active one reports the existing task.
    # Its ready file is written by renaming a temporary file over it: never a path of the system's
    # (as root, "/dev/null" became a regular file).
    ready = tmp_path / "ready"
    gate = ok(daemon, "submit", "HANG", "--payload", json.dumps({"ready_file": str(ready)}),
              "--idempotency-key", "busy").strip()
    wait_for(ready.exists)  # it runs: its key is active
    result = fredica(daemon, "submit", "ECHO", "--idempotency-key", "busy")
    assert result.exit_code == 0 and result.stdout.strip() == gate
    assert "already active" in result.stderr
    ok(daemon, "cancel", gate)
    daemon.wait_task(gate, "cancelled")


def test_pause_resume_cancel_and_invalid_transitions(daemon: Daemon, tmp_path: Path) -> None:
    payload = {"n": 100_000, "step": 0.005, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    task_id = ok(daemon, "submit", "COUNT", "--payload", json.dumps(payload)).strip()
    wait_for(lambda: (tmp_path / "c").exists())
    assert ok(daemon, "pause", task_id).strip() == f"paused {task_id}"
    assert as_json(daemon, "show", task_id)["is_paused"] is True
    assert "already paused" in refused(daemon, "pause", task_id)
    assert ok(daemon, "resume", task_id).strip() == f"resumed {task_id}"
    assert "not paused" in refused(daemon, "resume", task_id)
    ok(daemon, "cancel", task_id)
    assert daemon.wait_task(task_id, "cancelled")["error_type"] == "CANCELLED"
    assert "cancelled" in refused(daemon, "cancel", task_id)
    assert "only a running task" in refused(daemon, "pause", task_id)


def test_unknown_ids_and_bad_input_exit_1(daemon: Daemon) -> None:
    before = as_json(daemon, "status")["counts"]
    for args in (["show", "nope"], ["cancel", "nope"], ["pause", "nope"], ["resume", "nope"], ["logs", "nope"]):
        assert "nope" in refused(daemon, *args)
    assert "payload" in refused(daemon, "submit", "ECHO", "--payload", "[1, 2]")
    assert "unknown dependency" in refused(daemon, "submit", "ECHO", "--depends-on", "missing-id")
    assert "restart-log entry" in refused(daemon, "restarts", "dismiss", "999999")
    assert "no workflow templates" in refused(daemon, "run", "anything")
    assert as_json(daemon, "status")["counts"] == before


def test_usage_errors_exit_2(daemon: Daemon) -> None:
    assert fredica(daemon, "submit").exit_code == 2
    assert fredica(daemon, "ls", "--status", "bogus").exit_code == 2
    assert fredica(daemon, "run", "t", "--set", "novalue").exit_code == 2


def test_logs_of_a_task_and_of_the_daemon(daemon: Daemon) -> None:
    task_id = ok(daemon, "submit", "PRINT").strip()
    daemon.wait_task(task_id, "completed")
    text = ok(daemon, "logs", task_id)
    assert "hello on stdout" in text and "hello on stderr" in text and "hello from a grandchild" in text
    assert ok(daemon, "logs", task_id, "-n", "1").count("\n") == 1
    # -f on a finished task prints what there is and returns.
    assert "hello from ctx.log" in ok(daemon, "logs", task_id, "-f")
    daemon_log = ok(daemon, "logs", "-n", "200")
    assert "task_completed" in daemon_log and task_id in daemon_log


def test_logs_follow_until_the_task_ends(daemon: Daemon, tmp_path: Path) -> None:
    payload = {"n": 30, "step": 0.01, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    task_id = ok(daemon, "submit", "COUNT", "--payload", json.dumps(payload)).strip()
    followed = ok(daemon, "logs", task_id, "-f")
    assert "task finished: ok" in followed
    assert daemon.task(task_id)["status"] == "completed"


def test_watch_until_the_tasks_end(daemon: Daemon, tmp_path: Path) -> None:
    payload = {"n": 20, "step": 0.01, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    task_id = ok(daemon, "submit", "COUNT", "--payload", json.dumps(payload)).strip()
    out = ok(daemon, "watch", task_id)
    assert task_id[:8] in out and "completed" in out
    assert daemon.task(task_id)["status"] == "completed"


def test_wait_says_how_each_task_ended_and_exits_1_unless_all_completed(daemon: Daemon, tmp_path: Path) -> None:
    done = ok(daemon, "submit", "ECHO").strip()
    assert ok(daemon, "wait", done[:8]) == f"{done[:8]} ECHO completed\n"
    failed = ok(daemon, "submit", "RAISE").strip()
    result = fredica(daemon, "wait", done, failed)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{done[:8]} ECHO completed" and lines[1].startswith(f"{failed[:8]} RAISE failed EXCEPTION: ")
    # `watch ID` exits the same way.
    assert fredica(daemon, "watch", failed).exit_code == 1 and fredica(daemon, "watch", done).exit_code == 0
    ready = tmp_path / "hang.ready"
    hanging = ok(daemon, "submit", "HANG", "--payload", json.dumps({"ready_file": str(ready)})).strip()
    timed_out = fredica(daemon, "wait", hanging, "--timeout", "0.2")
    assert timed_out.exit_code == 1 and timed_out.stdout.startswith(f"{hanging[:8]} HANG ")
    assert timed_out.stderr.strip() == "error: 1 of 1 tasks still active after 0.2s"
    ok(daemon, "cancel", hanging)
    assert fredica(daemon, "wait", hanging).stdout.startswith(f"{hanging[:8]} HANG cancelled")


def test_a_cancel_says_how_many_tasks_that_depend_on_it_it_cancels(daemon: Daemon, tmp_path: Path) -> None:
    ready = tmp_path / "head.ready"
    batch = tmp_path / "chain.jsonl"
    batch.write_text("\n".join([
        json.dumps({"type": "HANG", "key": "head", "payload": {"ready_file": str(ready)}}),
        json.dumps({"type": "ECHO", "key": "a", "depends_on": ["head"]}),
        json.dumps({"type": "ECHO", "key": "b", "depends_on": ["a"]}),
        json.dumps({"type": "ECHO", "depends_on": ["head", "b"]}),
    ]) + "\n")
    head, *below = ok(daemon, "submit", "--batch", str(batch)).split()
    wait_for(ready.exists)
    assert ok(daemon, "cancel", head).strip() == (
        f"stopping {head} (cancel sent to the running task); the 3 tasks that depend on it are cancelled once it stops")
    for task_id in below:
        assert daemon.wait_task(task_id, "cancelled")["error_type"] == "DEPENDENCY_FAILED"


def test_status(daemon: Daemon) -> None:
    status = as_json(daemon, "status")
    assert status["pid"] == daemon.process.pid and status["max_workers"] == 2
    assert {"uptime", "busy_workers", "counts"} <= set(status)
    assert str(daemon.process.pid) in ok(daemon, "status")


def test_restarts_listing_is_empty_without_a_crash(daemon: Daemon) -> None:
    assert as_json(daemon, "restarts") == []


def test_the_installed_command_exits_3_when_the_daemon_is_stopped(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "stopped")
    for args in (["status"], ["ls", "--json"], ["submit", "ECHO"], ["cancel", "x"]):
        result = subprocess.run(
            [sys.executable, "-m", "daemon", *args, "--config", str(d.config)],
            capture_output=True, text=True, timeout=30, env=d.env(),
        )
        assert result.returncode == 3, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and str(d.socket) in result.stderr


def test_ids_by_prefix_and_filters_by_the_words_shown(daemon: Daemon, tmp_path: Path) -> None:
    payload = {"n": 100_000, "step": 0.005, "count_file": str(tmp_path / "c"), "state_file": str(tmp_path / "s")}
    counter = ok(daemon, "submit", "COUNT", "--payload", json.dumps(payload)).strip()
    waiting = ok(daemon, "submit", "ECHO", "--depends-on", counter).strip()
    wait_for(lambda: (tmp_path / "c").exists())
    short = counter[:8]
    assert as_json(daemon, "show", short)["id"] == counter
    assert counter in ok(daemon, "show", short)
    assert ok(daemon, "pause", short).strip() == f"paused {counter}"
    assert [t["id"] for t in as_json(daemon, "ls", "--status", "paused")] == [counter]
    assert counter not in {t["id"] for t in as_json(daemon, "ls", "--status", "waiting")}
    assert waiting in {t["id"] for t in as_json(daemon, "ls", "--status", "waiting")}
    assert short in ok(daemon, "ls", "--status", "paused")  # tables show 8 characters
    assert ok(daemon, "resume", counter[:5]).strip() == f"resumed {counter}"
    assert counter in {t["id"] for t in as_json(daemon, "ls", "--type", "count")}
    assert waiting not in {t["id"] for t in as_json(daemon, "ls", "--type", "count")}
    run_id = daemon.task(waiting)["workflow_run_id"]
    assert [t["id"] for t in as_json(daemon, "ls", "--run", run_id[:6])] == [waiting]
    assert ok(daemon, "cancel", short).strip() == (
        f"stopping {counter} (cancel sent to the running task); the 1 task that depends on it is cancelled once it stops")
    daemon.wait_task(counter, "cancelled")
    daemon.wait_task(waiting, "cancelled")
    assert f"task {counter} (COUNT) attempt 1 started" in ok(daemon, "logs", short)
    assert ok(daemon, "ls", "--status", "held").strip() == "no tasks"  # none is held


def test_short_and_ambiguous_ids_are_refused_in_one_line(daemon: Daemon) -> None:
    twins = [f"abcd1234-0000-4000-8000-00000000000{n}" for n in (1, 2)]
    ok(daemon, "submit", "--batch", "-", input="\n".join(json.dumps({"type": "ECHO", "id": i}) for i in twins))
    for twin in twins:
        daemon.wait_task(twin, "completed")
    before = as_json(daemon, "status")["counts"]
    for args in (["show", "abcd"], ["cancel", "abcd1234"], ["logs", "abcd1234-0"], ["pause", "abcd"], ["watch", "abcd"]):
        line = refused(daemon, *args)
        assert "is ambiguous" in line and all(f"task {i} (" in line for i in twins), line
    assert "at least 4 characters" in refused(daemon, "show", "abc")
    assert as_json(daemon, "show", twins[1][:-1] + "2")["id"] == twins[1]
    assert as_json(daemon, "status")["counts"] == before
