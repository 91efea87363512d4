"""`fredica clean` end to end (SPEC §14): the real daemon removes finished runs with their log
files, keeps the unfinished and those an unfinished task depends on; CliRunner for what the
command parses and prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from daemon import cli, client, operations, render
from daemon.store import cleaning
from tests import media
from tests.daemon_harness import Daemon

CONFIG = str(Path(__file__))  # any existing file: these commands fail before reading it


def fredica(d: Daemon, *args: str) -> Result:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], catch_exceptions=False)


def test_clean_removes_finished_runs_and_their_logs_and_keeps_what_unfinished_tasks_need(
    daemons: Any, tmp_path: Path
) -> None:
    d = daemons(keep_finished="0").start()
    printed = [d.submit("PRINT") for _ in range(3)]
    for task_id in printed:
        d.wait_task(task_id, "completed")
    logs = [d.log_dir / "tasks" / f"{task_id}.log" for task_id in printed]
    assert all(log.exists() for log in logs)
    upstream = d.submit("ECHO")
    d.wait_task(upstream, "completed")
    hang = d.submit("HANG", payload={"ready_file": str(tmp_path / "ready")})
    d.wait_task(hang, "running")
    # Waits for `hang`: the run of `upstream`, finished, must stay while it does.
    downstream = d.submit("ECHO", depends_on=[upstream, hang])

    dry = fredica(d, "clean", "--older-than", "0", "--dry-run")
    assert (dry.exit_code, dry.stdout) == (0, "would remove 3 runs, 3 tasks, 3 logs\n")
    assert all(log.exists() for log in logs)

    done = fredica(d, "clean", "--older-than", "0")
    assert (done.exit_code, done.stdout) == (0, "removed 3 runs, 3 tasks, 3 logs\n")
    assert not any(log.exists() for log in logs)
    for task_id in printed:
        assert d.request("show", id=task_id)["error"]["kind"] == "UnknownTask"
    kept = {task["id"] for task in d.data("ls")}
    assert kept == {upstream, hang, downstream}

    assert fredica(d, "clean", "--older-than", "1d").stdout == "removed 0 runs, 0 tasks, 0 logs\n"
    d.data("cancel", ids=[hang])
    d.wait_task(downstream, "cancelled")
    d.wait_task(hang, "cancelled")
    again = fredica(d, "clean", "--older-than", "0", "--status", "cancelled", "--json")
    assert '"runs": 2' in again.stdout  # hang's and downstream's; upstream's completed run is not asked for
    assert {task["id"] for task in d.data("ls")} == {upstream}
    assert "removed 1 run, 1 task, " in fredica(d, "clean", "--older-than", "0").stdout
    assert d.data("ls") == [] and d.data("runs") == []
    assert d.stop() == 0


def test_a_bad_age_or_status_is_a_usage_error_before_anything_is_asked() -> None:
    for args, word in ((["--older-than", "7 days"], "'7 days' is not a duration"),
                       (["--older-than", "-1d"], "is not a duration"),
                       (["--status", "running"], "'running' is not one of")):
        result = CliRunner().invoke(cli.main, ["clean", *args, "--config", CONFIG])
        assert result.exit_code == 2 and word in result.stderr, (args, result.output)


def test_the_summary_counts_in_words() -> None:
    assert render.clean_summary({"runs": 1, "tasks": 1, "logs": 0}) == "removed 1 run, 1 task, 0 logs"
    assert render.clean_summary({"runs": 12, "tasks": 340, "logs": 338}, dry_run=True) == (
        "would remove 12 runs, 340 tasks, 338 logs")


def test_the_client_asks_again_until_the_daemon_says_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    replies = [{"runs": 2, "tasks": 500, "logs": 500, "done": False}, {"runs": 1, "tasks": 3, "logs": 2, "done": True}]
    asked: list[dict[str, Any]] = []

    def call(self: client.Client, op: str, **args: Any) -> Any:
        asked.append({"op": op, **args})
        return replies.pop(0)

    monkeypatch.setattr(client.Client, "call", call)
    total = client.Client(socket_path=Path("/nonexistent")).clean(60.0, status="failed")
    assert total == {"runs": 3, "tasks": 503, "logs": 502, "done": True}
    assert asked == [{"op": "clean", "older_than": 60.0, "status": "failed", "dry_run": False}] * 2


def test_a_long_clean_answers_in_slices_each_of_whole_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sup = media.start_supervisor(tmp_path, keep_finished=0.0)
    try:
        sup.set_queue_paused("default", True)  # nothing runs: each task is cancelled while it waits
        made = [media.submit(sup, "SHELL", {"argv": ["true"]}) for _ in range(5)]
        for task_id in made:
            sup.cancel(task_id)
        monkeypatch.setattr(cleaning, "CHUNK", 2)
        monkeypatch.setattr(operations, "CLEAN_SLICE", 0.0)  # one chunk per request
        handlers = operations.Handlers(sup)
        replies = [handlers.op_clean(older_than=0.0)]
        while not replies[-1]["done"]:
            replies.append(handlers.op_clean(older_than=0.0))
        assert [reply["tasks"] for reply in replies] == [2, 2, 1]
        assert handlers.op_ls() == []
    finally:
        sup.stop(grace=0, timeout=20)
