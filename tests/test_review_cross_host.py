"""Review of a9bb407 (SPEC §16): what the owner's look at its attempts' rows does while an attempt
cancelled on another host is still stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_daemons import hang, ok, on_postgres, url  # noqa: F401 (fixtures)

SLOW = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}


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


@pytest.mark.xfail(strict=True, reason="review: Supervisor._cancel's run path stops only its own running tasks")
def test_a_run_cancelled_on_another_host_stops_its_task_running_there(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    """SPEC §7 (cancelling a run cancels all of its non-terminal tasks) with §16 (a cancel given
    on any host reaches the supervisor that runs the task)."""
    from tests.postgres_daemons import fredica

    alpha = on_postgres("alpha", **SLOW).start()
    payload = {"n": 100000, "step": 0.02, "state_file": str(tmp_path / "state"), "count_file": str(tmp_path / "count")}
    task_id = alpha.submit("COUNT", payload=payload)
    wait_for((tmp_path / "count").exists, timeout=20)
    run_id = alpha.task(task_id)["workflow_run_id"]
    beta = on_postgres("beta", **SLOW).start()
    result = fredica(beta, "cancel", run_id)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert alpha.wait_task(task_id, "cancelled")["error_type"] == "CANCELLED"
