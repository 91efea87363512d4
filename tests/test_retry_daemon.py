"""`fredica retry` and `restarts recreate` of several entries, through the real daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from click.testing import CliRunner

from daemon import cli
from daemon.client import Client
from tests.conftest import wait_for


def fredica(d: Any, *args: str) -> Any:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)])


def test_a_pipeline_whose_head_failed_runs_whole_in_a_new_run(daemons: Callable[..., Any], tmp_path: Path) -> None:
    d = daemons().start()
    gate = tmp_path / "gate"
    head, middle, tail = [t["id"] for t in d.data("submit", tasks=[
        {"type": "SHELL", "key": "head", "payload": {"argv": ["test", "-e", str(gate)]}},
        {"type": "ECHO", "key": "middle", "depends_on": ["head"], "payload": {"step": 2}},
        {"type": "ECHO", "depends_on": ["middle"], "payload": {"step": 3}},
    ])["tasks"]]
    d.wait_task(head, "failed")
    assert d.wait_task(tail, "cancelled")["error_type"] == "DEPENDENCY_FAILED"

    gate.touch()
    result = fredica(d, "retry", head[:8])
    assert result.exit_code == 0, result.output
    (run_id,) = [r["id"] for r in d.data("runs") if r["id"] != d.task(head)["workflow_run_id"]]
    run = wait_for(lambda: (r := d.data("show", id=run_id)["object"])["status"] == "completed" and r, timeout=20)
    copies = run["tasks"]
    assert [(t["type"], t["status"]) for t in copies] == [("SHELL", "completed"), ("ECHO", "completed"),
                                                          ("ECHO", "completed")]
    assert copies[1]["depends_on"] == [copies[0]["id"]] and copies[2]["depends_on"] == [copies[1]["id"]]
    assert copies[2]["result"]["echo"] == {"step": 3}
    assert result.stdout == (f"retried {head[:8]} as {copies[0]['id'][:8]}, with 2 tasks its failure cancelled"
                             f" (run {run_id[:8]})\n")
    # The originals stay as they ended; retrying a completed copy is refused, and changes nothing.
    assert [d.task(t)["status"] for t in (head, middle, tail)] == ["failed", "cancelled", "cancelled"]
    refused = fredica(d, "retry", copies[0]["id"])
    assert refused.exit_code == 1 and "is completed: only a failed or cancelled task" in refused.stderr
    with Client(socket_path=d.socket) as fredica_client:
        (by_prefix,) = fredica_client.retry(copies[0]["id"][:6])
    assert (by_prefix["id"], by_prefix["ok"]) == (copies[0]["id"], False)
    assert len(d.data("runs")) == 2


def test_recreating_two_entries_after_kill9_keeps_their_run_together(
    daemons: Callable[..., Any], tmp_path: Path
) -> None:
    d = daemons().start()
    gate = tmp_path / "gate"

    def waiting_for_the_gate(name: str) -> dict[str, Any]:
        # Says it started, then waits for the gate: running at the kill, and quick once recreated.
        ready = tmp_path / f"{name}.ready"
        script = f'touch "{ready}"; while [ ! -e "{gate}" ]; do sleep 0.02; done'
        return {"type": "SHELL", "key": name, "payload": {"command": script, "shell": True}}

    left, right, joined = [t["id"] for t in d.data("submit", tasks=[
        waiting_for_the_gate("left"), waiting_for_the_gate("right"),
        {"type": "ECHO", "depends_on": ["left", "right"]},
    ])["tasks"]]
    wait_for(lambda: (tmp_path / "left.ready").exists() and (tmp_path / "right.ready").exists())
    d.kill9()
    d.start()
    assert d.task(joined)["error_type"] == "DEPENDENCY_FAILED"
    entries = {e["task_id"]: e["id"] for e in d.data("restarts")}
    assert set(entries) == {left, right}

    gate.touch()
    result = fredica(d, "restarts", "recreate", str(entries[left]), str(entries[right]))
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2
    (new_run,) = {e["new_workflow_run_id"] for e in d.data("restarts", all=True) if e["task_id"] in entries}
    run = wait_for(lambda: (r := d.data("show", id=new_run)["object"])["status"] == "completed" and r, timeout=20)
    new_left, new_right, new_joined = run["tasks"]
    assert new_joined["depends_on"] == [new_left["id"], new_right["id"]]
    assert [t["status"] for t in run["tasks"]] == ["completed"] * 3
    assert d.data("restarts") == []
