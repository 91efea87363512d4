"""Cancel, pause and resume given on one host reach the supervisor on another that runs the task
(SPEC §16): two real daemons of different names on one PostgreSQL database, the CLI asked of the
one that does not run it. With NOTIFY the owner acts at the other's commit; with `notify = false`
it finds the request by reading its attempts' rows every second, never waiting for a heartbeat.
What the row says cannot be done is refused on the asking host in one line, asking nothing. A
run cancelled elsewhere stops its tasks running here; a wish survives a rolled-back tick."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from daemon import models
from daemon.store import db
from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_daemons import fredica, hang, ok, on_postgres, url  # noqa: F401 (fixtures)
from tests.prefetch_executors import tally

PREFETCH_EXECUTORS = {"TALLY": "tests.prefetch_executors:Tally"}

# Every timer of the loops far away: the heartbeat (30 s) and the claim polls (60 s) cannot be
# what makes the owner act within the waits below.
SLOW = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}


def counting(tmp_path: Path) -> dict[str, Any]:
    """A COUNT task's payload: it counts for as long as the test lasts, honouring pause at each step."""
    return {"n": 100000, "step": 0.02, "state_file": str(tmp_path / "state"), "count_file": str(tmp_path / "count")}


def state(tmp_path: Path) -> str | None:
    path = tmp_path / "state"
    return path.read_text() if path.exists() else None


def pause_wanted(url: str, task_id: str) -> Any:
    conn = db.connect_read_only(url)
    try:
        return conn.execute("SELECT pause_wanted FROM task WHERE id = ?", (task_id,)).fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def two_hosts(on_postgres: Callable[..., Daemon], tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Daemon, Daemon, str]:
    """alpha runs a COUNT task; beta, started after, runs nothing. `notify` as parametrised."""
    notify = getattr(request, "param", True)
    alpha = on_postgres("alpha", notify=notify, **SLOW).start()
    task_id = alpha.submit("COUNT", payload=counting(tmp_path))
    wait_for((tmp_path / "count").exists, timeout=20)  # alpha runs it
    beta = on_postgres("beta", notify=notify, **SLOW).start()
    return alpha, beta, task_id


@pytest.mark.parametrize("two_hosts", [True, False], ids=["notify", "polling"], indirect=True)
def test_pause_and_resume_given_on_another_host_reach_the_executor(
    two_hosts: tuple[Daemon, Daemon, str], tmp_path: Path, url: str
) -> None:
    alpha, beta, task_id = two_hosts
    assert ok(beta, "pause", task_id).strip() == f"pause of {task_id} asked of supervisor alpha"
    wait_for(lambda: state(tmp_path) == "paused", timeout=15)
    shown = wait_for(lambda: (t := json.loads(ok(beta, "show", task_id, "--json")))["is_paused"] and t, timeout=15)
    assert (shown["status"], shown["supervisor"]) == ("running", "alpha")
    assert "paused (running)" in ok(beta, "show", task_id)
    wait_for(lambda: pause_wanted(url, task_id) is None, timeout=15)  # answered, so not acted on twice
    assert any(e["event"] == "task_paused" and e.get("task_id") == task_id for e in alpha.log_events())

    assert ok(beta, "resume", task_id).strip() == f"resume of {task_id} asked of supervisor alpha"
    wait_for(lambda: state(tmp_path) == "running", timeout=15)
    wait_for(lambda: not alpha.task(task_id)["is_paused"], timeout=15)
    assert alpha.task(task_id)["status"] == "running"


@pytest.mark.parametrize("two_hosts", [False], ids=["polling"], indirect=True)
def test_a_cancel_given_on_another_host_reaches_the_owner_without_notify(two_hosts: tuple[Daemon, Daemon, str]) -> None:
    alpha, beta, task_id = two_hosts
    ok(beta, "cancel", task_id)
    # No wake-up comes, and alpha's heartbeat is 30 s away: its look at its rows finds it.
    wait_for(lambda: any(e["event"] == "attempt_no_longer_current" and e["task_id"] == task_id
                         for e in alpha.log_events()), timeout=15)
    done = alpha.wait_task(task_id, "cancelled")
    assert (done["error_type"], done["supervisor"]) == (models.CANCELLED, "alpha")


def test_what_the_row_refuses_is_refused_on_the_asking_host_in_one_line(
    two_hosts: tuple[Daemon, Daemon, str], on_postgres: Callable[..., Daemon], tmp_path: Path, url: str
) -> None:
    alpha, beta, task_id = two_hosts
    refused = fredica(beta, "resume", task_id)
    assert refused.exit_code != 0 and f"task {task_id} is not paused" in refused.stderr
    hung = alpha.submit("HANG", payload=hang(tmp_path, "h"))  # not pausable
    wait_for((tmp_path / "h.ready").exists, timeout=20)
    refused = fredica(beta, "pause", hung)
    assert refused.exit_code != 0 and f"task {hung} (HANG) cannot be paused" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (pause_wanted(url, task_id), pause_wanted(url, hung)) == (None, None)  # nothing asked
    ok(beta, "pause", task_id)
    wait_for(lambda: state(tmp_path) == "paused", timeout=15)
    wait_for(lambda: json.loads(ok(beta, "show", task_id, "--json"))["is_paused"], timeout=15)
    refused = fredica(beta, "pause", task_id)
    assert refused.exit_code != 0 and f"task {task_id} is already paused" in refused.stderr
    alpha.data("cancel", ids=[hung])


def test_a_task_sent_ahead_and_cancelled_on_another_host_is_taken_back_never_run(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    alpha = on_postgres("alpha", executors=PREFETCH_EXECUTORS, max_workers=1, tasks_per_process=50,
                        warm_spare=False, extra_toml="[queues.default]\nprefetch = 1\n", **SLOW).start()
    ledger, go = tmp_path / "tally", tmp_path / "go"
    first = alpha.submit("TALLY", payload={"tally": str(ledger), "go_file": str(go)})
    pid = alpha.wait_task(first, "running")["executor_pid"]
    behind = alpha.submit("TALLY", payload={"tally": str(ledger)})
    wait_for(lambda: (t := alpha.task(behind))["status"] == "claimed" and t["executor_pid"] == pid, timeout=15)
    assert alpha.task(first)["supervisor"] == alpha.task(behind)["supervisor"] == "alpha"
    # beta's start recovers its own tasks only: not those alpha claimed into its lanes.
    beta = on_postgres("beta", executors=PREFETCH_EXECUTORS, **SLOW).start()
    ok(beta, "cancel", behind)
    # Taken back from the process it was sent to while the first one still runs there: its
    # process has answered that it never started it (not only been asked to give it back).
    wait_for(lambda: any(e["event"] == "task_taken_back" and e.get("task_id") == behind
                         for e in alpha.log_events()), timeout=15)
    go.touch()
    assert alpha.wait_task(first, "completed")["executor_pid"] == pid
    assert alpha.task(behind)["status"] == "cancelled"
    wait_for(lambda: alpha.data("status")["busy_workers"] == 0, timeout=15)
    assert [task_id for task_id, _ in tally(ledger)] == [first]  # the cancelled one never ran


def test_an_attempt_cancelled_elsewhere_is_told_to_stop_once_while_it_stops(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    # HANG ignores the cancel: it stops only at SIGTERM, cancel_grace (3 s) later; alpha reads
    # its rows every 0.9 s meanwhile.
    alpha = on_postgres("alpha", notify=False, cancel_grace=3, **SLOW).start()
    task_id = alpha.submit("HANG", payload=hang(tmp_path, "h"))
    wait_for((tmp_path / "h.ready").exists, timeout=20)
    beta = on_postgres("beta", notify=False, **SLOW).start()
    ok(beta, "cancel", task_id)
    wait_for(lambda: alpha.data("status")["busy_workers"] == 0, timeout=30)
    told = [e for e in alpha.log_events() if e["event"] == "attempt_no_longer_current" and e.get("task_id") == task_id]
    assert len(told) == 1, [e["timestamp"] for e in told]


def test_a_pause_asked_from_another_host_survives_a_tick_rolled_back_after_the_look(url: str, tmp_path: Path) -> None:
    """The owner's tick acts on the wish, then meets a database fault: nothing is sent to the
    process (the wish's answer and is_paused are rolled back), the wish stays, and the tick after
    the fault acts on it."""
    import sqlite3

    from daemon.config import Settings
    from daemon.store import attempts, db, tasks
    from daemon.submission import parse_spec
    from daemon.supervisor import Supervisor

    sup = Supervisor(Settings(
        database=url, name="alpha", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
        executors={"COUNT": "tests.sample_executors:Counter"}, cancel_grace=0.3, notify=False,
    ))
    payload = {"n": 100000, "step": 0.02, "state_file": str(tmp_path / "state"), "count_file": str(tmp_path / "count")}
    task_id = sup.submit([parse_spec({"type": "COUNT", "payload": payload})]).tasks[0].id
    other = db.open_database(url)

    def tick_until(condition: Callable[[], object]) -> object:
        return wait_for(lambda: sup.tick() is not None and condition(), timeout=20)

    def row() -> sqlite3.Row:
        return other.execute("SELECT is_paused, pause_wanted FROM task WHERE id = ?", (task_id,)).fetchone()

    try:
        tick_until(lambda: (tmp_path / "count").exists())
        with db.write(other):  # beta's user: asked of alpha
            assert attempts.ask_pause(other, tasks.AttemptRef.of(tasks.get(other, task_id)), True)
        real_tick = sup.lease.tick
        failed: list[bool] = []

        def failing_tick(conn: sqlite3.Connection, now: float) -> list:
            if not failed:
                failed.append(True)
                raise sqlite3.OperationalError("database or disk is full")  # after _act_on_rows
            return real_tick(conn, now)

        sup.lease.tick = failing_tick  # type: ignore[method-assign]
        sup._next_look = 0.0  # the look is due in this tick
        sup.tick()
        assert failed and sup.fault is not None
        assert sup.running[task_id].paused_since is None  # nothing was sent to the process
        assert (row()["is_paused"], row()["pause_wanted"]) == (0, 1)  # rolled back: the wish stays
        tick_until(lambda: sup.fault is None and (tmp_path / "state").exists()
                   and (tmp_path / "state").read_text() == "paused")
        tick_until(lambda: tuple(row()) == (1, None))
    finally:
        other.close()
        sup.idle.dismiss_all()
        for rt in list(sup.running.values()):
            rt.process.kill()


def test_a_run_cancelled_on_another_host_stops_its_task_running_there(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    """SPEC §7 (cancelling a run cancels all of its non-terminal tasks) with §16 (a cancel given
    on any host reaches the supervisor that runs the task)."""
    alpha = on_postgres("alpha", **SLOW).start()
    payload = {"n": 100000, "step": 0.02, "state_file": str(tmp_path / "state"), "count_file": str(tmp_path / "count")}
    task_id = alpha.submit("COUNT", payload=payload)
    wait_for((tmp_path / "count").exists, timeout=20)
    run_id = alpha.task(task_id)["workflow_run_id"]
    beta = on_postgres("beta", **SLOW).start()
    result = fredica(beta, "cancel", run_id)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert alpha.wait_task(task_id, "cancelled")["error_type"] == "CANCELLED"
