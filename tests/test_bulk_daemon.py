"""Hold, release, priority and the bulk acting commands against the real daemon (SPEC §14), and a
user's pause that outlives a graceful restart as a hold."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from daemon import cli, errors
from daemon.client import Client
from tests.conftest import wait_for
from tests.daemon_harness import Daemon

BLOCKER = {"LOG_FLOOD": "tests.sample_executors:LogFlood"}


def fredica(d: Daemon, *args: str) -> Result:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], catch_exceptions=False)


def blocker(d: Daemon, tmp_path: Path, name: str = "gate", **fields: Any) -> tuple[str, Path]:
    """A task that runs until the file it returns exists (its `ready` file written once it runs)."""
    gate, ready = tmp_path / name, tmp_path / f"{name}.ready"
    task_id = d.submit("LOG_FLOOD", payload={"n": 0, "hold_file": str(gate), "ready_file": str(ready)}, **fields)
    wait_for(ready.exists, 20)
    return task_id, gate


def test_a_held_task_is_never_claimed_and_runs_once_released(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=1).start()
    held = fredica(d, "submit", "ECHO", "--hold", "--priority", "9").stdout.strip()
    first = d.submit("ECHO")
    d.wait_task(first, "completed")  # the one worker was free, and took the other
    assert d.task(held)["status"] == "pending" and d.task(held)["is_held"] is True
    row = next(line.split() for line in fredica(d, "ls").stdout.splitlines() if line.startswith(held[:8]))
    assert row[2:4] == ["ECHO", "held"]
    assert d.data("status")["counts"]["held"] == 1
    assert [t["id"] for t in d.data("ls", status="held")] == [held]
    run = d.data("show", id=d.task(held)["workflow_run_id"])["object"]
    assert run["status"] == "pending" and run["completed_at"] is None  # a held run is not finished
    refused = fredica(d, "release", first)
    assert (refused.exit_code, refused.stderr) == (
        1, f"error: task {first} is completed: only a waiting task can be released\n")
    assert fredica(d, "hold", held[:6]).stderr == f"error: task {held} is already held\n"
    result = fredica(d, "release", held[:6])
    assert (result.exit_code, result.stdout) == (0, f"released {held}\n")
    d.wait_task(held, "completed")
    again = fredica(d, "release", "--status", "held")
    assert (again.exit_code, again.stderr) == (1, "error: no held task matches --status held: nothing was released\n")


def test_priority_reorders_the_next_claims(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=1, executors=BLOCKER).start()
    gate_id, gate = blocker(d, tmp_path)
    first, second, third = (d.submit("ECHO") for _ in range(3))
    assert fredica(d, "priority", "5", third).stdout == f"priority 5: {third}\n"
    assert fredica(d, "priority", "-1", first).exit_code == 0
    refused = fredica(d, "priority", "3", gate_id)
    assert refused.exit_code == 1 and "is running: only a waiting task can be given a priority" in refused.stderr
    assert [d.task(t)["priority"] for t in (first, second, third)] == [-1, 0, 5]
    gate.touch()
    started = {t: d.wait_task(t, "completed")["started_at"] for t in (first, second, third)}
    assert sorted(started, key=started.__getitem__) == [third, second, first]


def test_bulk_cancel_by_run_cancels_what_is_unfinished_and_reports_each(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=2).start()
    count = tmp_path / "count"
    counting = {"n": 100_000, "count_file": str(count), "state_file": str(tmp_path / "state")}
    lines = [
        {"type": "ECHO", "key": "done"},
        {"type": "COUNT", "key": "gate", "payload": counting},
        {"type": "ECHO", "key": "after", "depends_on": ["gate"]},
        {"type": "ECHO", "key": "held", "hold": True},
    ]
    done, running, after, held = d.data("submit", tasks=lines)["tasks"]
    d.wait_task(done["id"], "completed")
    wait_for(count.exists, 20)
    run_id = d.task(done["id"])["workflow_run_id"]
    result = fredica(d, "cancel", "--run", run_id[:8])
    assert (result.exit_code, result.stderr) == (0, "")
    # The newest first: none is reached by the cascade of one before it, so none is refused.
    assert result.stdout.splitlines() == [
        f"cancelled {held['id']}",
        f"cancelled {after['id']}",
        f"stopping {running['id']} (cancel sent to the running task)",
    ]
    for task in (held, after, running):
        assert d.wait_task(task["id"], "cancelled")["error_type"] == "CANCELLED"
    assert d.task(done["id"])["status"] == "completed"
    nothing = fredica(d, "cancel", "--run", run_id[:8])
    assert nothing.exit_code == 1
    assert nothing.stderr == f"error: no unfinished task matches --run {run_id[:8]}: nothing was cancelled\n"


def test_several_ids_each_on_its_own_line_and_exit_1_if_any_was_refused(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=1, executors=BLOCKER).start()
    gate_id, gate = blocker(d, tmp_path)
    upstream = d.submit("ECHO", hold=True)
    downstream = d.submit("ECHO", depends_on=[upstream])
    result = fredica(d, "cancel", upstream, "nope", downstream, upstream[:8])  # the last: a repeat
    assert result.exit_code == 1
    # In the order given, each counting what depended on it (both waiting: cancelled together).
    assert result.stdout.splitlines() == [f"cancelled {upstream}, and the 1 task that depends on it",
                                          f"cancelled {downstream}"]
    assert result.stderr == "error: no task or workflow run has id nope\n"
    # Through the client: every task acted on, the first refusal raised with all the results.
    with Client(d.config) as client:
        with pytest.raises(errors.InvalidTransition) as refused:
            client.hold(upstream, gate_id)
        assert [r["ok"] for r in refused.value.results] == [False, False]
        held = client.submit("ECHO", hold=True)
        assert client.get(held)["is_held"] is True
        assert client.priority(4, held) == [{"id": held, "ok": True, "message": f"priority 4: {held}"}]
        assert client.release(held)[0]["message"] == f"released {held}"
        gate.touch()
        assert [t["status"] for t in client.wait(held, gate_id, timeout=20)] == ["completed", "completed"]


def test_a_task_paused_by_its_user_comes_back_held_after_a_graceful_restart(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=2).start()
    count, state = tmp_path / "count", tmp_path / "state"
    payload = {"n": 200, "step": 0.01, "count_file": str(count), "state_file": str(state)}
    paused = d.submit("COUNT", payload=payload)
    asked = d.submit("SELF_PAUSE")  # pauses itself: not a user's pause
    wait_for(count.exists, 20)
    assert fredica(d, "pause", paused).stdout == f"paused {paused}\n"
    wait_for(lambda: state.exists() and state.read_text() == "paused")
    wait_for(lambda: d.task(asked)["is_paused"])
    assert d.stop(signal.SIGTERM) == 0
    d.start()
    row = d.task(paused)
    assert (row["status"], row["is_held"], row["is_paused"]) == ("pending", True, False)
    assert d.data("restarts") == []  # put back by the graceful stop: nothing interrupted to review
    assert d.task(asked)["is_held"] is False  # runs again, and asks again
    wait_for(lambda: d.task(asked)["is_paused"])
    [row] = fredica(d, "ls", "--status", "held").stdout.splitlines()[1:]
    assert row.split()[0] == paused[:8] and row.split()[2:4] == ["COUNT", "held"]
    assert fredica(d, "release", paused).stdout == f"released {paused}\n"
    done = d.wait_task(paused, "completed", timeout=30)
    assert done["result"] == {"count": 200}
    fredica(d, "cancel", asked)


def test_a_bulk_of_thousands_is_a_few_hand_overs(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=1).start()
    ids = [t["id"] for t in d.data("submit", tasks=[{"type": "ECHO", "hold": True} for _ in range(2500)])["tasks"]]
    before = d.data("status")
    reply = d.data("priority", priority=3, status="held")
    assert [r["id"] for r in reply["results"]] == ids and all(r["ok"] for r in reply["results"])
    calls = [e for e in d.log_events() if e.get("event") == "bulk_acted" and e.get("op") == "priority"]
    assert calls and calls[-1]["targets"] == 2500 and calls[-1]["hand_overs"] == 3  # chunks of 1000
    assert before["counts"]["held"] == 2500
    cancelled = d.data("cancel", status="held")["results"]
    assert len(cancelled) == 2500 and all(r["ok"] for r in cancelled)
    assert d.data("status")["counts"]["cancelled"] == 2500


def test_retry_by_selectors_reaches_the_failed_tasks_of_a_run_as_one_new_run(daemons) -> None:
    d = daemons(max_workers=1).start()
    lines = [{"type": "RAISE", "key": "a"}, {"type": "ECHO", "depends_on": ["a"]},
             {"type": "RAISE", "key": "b"}, {"type": "ECHO"}]
    first, cascaded, second, fine = (t["id"] for t in d.data("submit", tasks=lines)["tasks"])
    for task_id in (first, second):
        d.wait_task(task_id, "failed")
    d.wait_task(fine, "completed")
    run_id = d.task(first)["workflow_run_id"]
    result = fredica(d, "retry", "--run", run_id[:8], "--status", "failed")
    assert (result.exit_code, result.stderr) == (0, "")
    lines_out = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines_out] == [["retried", first[:8]], ["retried", second[:8]]]
    assert "with 1 task its failure cancelled" in lines_out[0]
    # Selected together, the two failed tasks of one run come back as one new run.
    assert len({line.rsplit("(run ", 1)[1] for line in lines_out}) == 1
    nothing = fredica(d, "retry", "--run", run_id[:8], "--status", "completed")
    assert nothing.exit_code == 1
    assert nothing.stderr == (f"error: no failed or cancelled task matches --run {run_id[:8]} --status completed: "
                              "nothing was retried\n")


def test_restart_log_entries_dismissed_by_run_and_all(daemons, tmp_path: Path) -> None:
    d = daemons(max_workers=3).start()
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    pair = d.data("submit", tasks=[{"type": "HANG", "payload": {"ready_file": str(r)}} for r in ready[:2]])
    alone = d.submit("HANG", payload={"ready_file": str(ready[2])})
    for path in ready:
        wait_for(path.exists, 20)
    d.kill9()
    d.start()
    entries = {e["task_id"]: e["id"] for e in d.data("restarts")}
    assert len(entries) == 3
    by_run = fredica(d, "restarts", "dismiss", "--run", pair["run_id"][:8])
    assert (by_run.exit_code, by_run.stdout.splitlines()) == (
        0, [f"dismissed {entries[t['id']]}" for t in pair["tasks"]])
    rest = fredica(d, "restarts", "dismiss", "--all")
    assert (rest.exit_code, rest.stdout) == (0, f"dismissed {entries[alone]}\n")
    none_left = fredica(d, "restarts", "dismiss", "--all")
    assert (none_left.exit_code, none_left.stderr) == (1, "error: no restart-log entry awaits review\n")
    huge = fredica(d, "restarts", "recreate", "99999999999999999999", str(entries[alone]))
    assert huge.exit_code == 1
    assert huge.stderr.splitlines() == ["error: no restart-log entry has id 99999999999999999999",
                                        f"error: restart-log entry {entries[alone]} is already dismissed"]
    assert d.process.poll() is None and "Traceback" not in d.output.read_text()
