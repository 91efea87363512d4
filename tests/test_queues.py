"""Queues (SPEC §15): routing and explicit queues stored, claims per queue, re-routing at start,
paused queues kept, and the real daemon running a queue of one worker beside `default`."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner, Result

from daemon import cli, queues, recovery, render, retry
from daemon.errors import SubmissionRefused
from daemon.store import db, migrations, restarts, tasks
from daemon.store import queues as queue_store
from daemon.submission import TaskSpec, parse_spec
from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests import store_steps
from tests.conformance import conn, sqlite_only  # noqa: F401 (conn: every test on every backend)

NOW = 1000.0
ROUTES = {"TRANSCODE_MP4": "media"}


# --- store: routing, claims per queue, waiting counts, re-routing, paused ------------------------


def _submit(conn: sqlite3.Connection, *specs: TaskSpec, routes: dict[str, str] = ROUTES) -> list[str]:
    return [t.id for t in tasks.submit(conn, list(specs), now=NOW, routes=routes).tasks]


def test_a_task_is_stored_in_its_routed_or_named_queue(conn: sqlite3.Connection) -> None:
    routed, named, other = _submit(
        conn, TaskSpec(type="TRANSCODE_MP4"), TaskSpec(type="TRANSCODE_MP4", queue="bulk"), TaskSpec(type="ECHO")
    )
    stored = {task_id: tasks.get(conn, task_id) for task_id in (routed, named, other)}
    assert (stored[routed].queue, stored[routed].queue_explicit) == ("media", False)
    assert (stored[named].queue, stored[named].queue_explicit) == ("bulk", True)
    assert (stored[other].queue, stored[other].queue_explicit) == ("default", False)
    assert stored[named].to_dict()["queue"] == "bulk"


def test_each_queue_claims_its_own_tasks_by_priority_then_submission_order(conn: sqlite3.Connection) -> None:
    # The media queue's tasks outrank default's: default still claims its own, in its own order.
    media = _submit(conn, *(TaskSpec(type="TRANSCODE_MP4", priority=9) for _ in range(3)))
    low, high, low2 = _submit(conn, TaskSpec(type="ECHO"), TaskSpec(type="ECHO", priority=5), TaskSpec(type="ECHO"))
    assert [t.id for t in tasks.claim_ready(conn, NOW, 10)] == [high, low, low2]
    assert tasks.claim_ready(conn, NOW, 10) == []
    assert [t.id for t in tasks.claim_ready(conn, NOW, 2, queue="media")] == media[:2]
    assert [t.id for t in tasks.claim_ready(conn, NOW, 2, queue="media")] == media[2:]
    assert store_steps.claim_next(conn, NOW, queue="nowhere") is None


@sqlite_only  # SQLite's query plan and statement trace
def test_the_claim_of_a_queue_is_a_lookup_in_the_ready_index_by_queue(conn: sqlite3.Connection) -> None:
    _submit(conn, *(TaskSpec(type="TRANSCODE_MP4", priority=9) for _ in range(50)), TaskSpec(type="ECHO"))
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    assert store_steps.claim_next(conn, NOW) is not None
    conn.set_trace_callback(None)
    select = next(sql for sql in traced if sql.lstrip().startswith("SELECT"))
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + select))
    assert "SEARCH task USING INDEX task_ready (queue=?)" in plan, plan


def test_waiting_counts_by_queue(conn: sqlite3.Connection) -> None:
    _submit(conn, TaskSpec(type="TRANSCODE_MP4"), TaskSpec(type="TRANSCODE_MP4"), TaskSpec(type="ECHO"))
    assert queue_store.waiting(conn) == {"media": 2, "default": 1}
    claimed = store_steps.claim_next(conn, NOW, queue="media")
    assert claimed is not None
    assert queue_store.waiting(conn) == {"media": 2, "default": 1}  # claimed still waits
    tasks.start(conn, claimed.id, now=NOW)
    assert queue_store.waiting(conn) == {"media": 1, "default": 1}


def test_rerouting_moves_routed_tasks_and_those_whose_named_queue_is_gone(conn: sqlite3.Connection) -> None:
    running = _submit(conn, TaskSpec(type="TRANSCODE_MP4"))[0]
    tasks.start(conn, tasks.claim_ready(conn, NOW, 1, queue="media")[0].id, now=NOW)
    routed, named_kept, named_gone, echo = _submit(
        conn, TaskSpec(type="TRANSCODE_MP4"), TaskSpec(type="ECHO", queue="media"),
        TaskSpec(type="ECHO", queue="bulk"), TaskSpec(type="ECHO"),
    )
    # The new config: TRANSCODE_MP4 goes to `video`, ECHO to `media`; `bulk` is gone.
    moved = queue_store.reroute(conn, {"TRANSCODE_MP4": "video", "ECHO": "media"}, ["default", "media", "video"],
                                "default")
    assert moved == {"video": 1, "media": 2}
    after = {task_id: tasks.get(conn, task_id) for task_id in (routed, named_kept, named_gone, echo, running)}
    assert (after[routed].queue, after[routed].queue_explicit) == ("video", False)
    assert (after[named_kept].queue, after[named_kept].queue_explicit) == ("media", True)
    assert (after[named_gone].queue, after[named_gone].queue_explicit) == ("media", False)
    assert after[echo].queue == "media"
    assert after[running].queue == "media"  # a running task is never moved
    # Again with the same config: nothing moves. With no routes at all, everything goes to default.
    assert queue_store.reroute(conn, {"TRANSCODE_MP4": "video", "ECHO": "media"}, ["default", "media", "video"],
                               "default") == {}
    assert queue_store.reroute(conn, {}, ["default"], "default") == {"default": 4}


def test_paused_queues_are_kept(database: str | Path) -> None:
    conn = db.open_database(database)
    assert queue_store.paused(conn) == set()
    assert queue_store.set_paused(conn, "media", True, now=NOW)
    assert not queue_store.set_paused(conn, "media", True, now=NOW)
    conn.close()
    conn = db.open_database(database)
    assert queue_store.paused(conn) == {"media"}
    assert queue_store.set_paused(conn, "media", False, now=NOW)
    assert queue_store.paused(conn) == set()
    conn.close()


def test_tasks_of_an_older_database_go_to_default(db_path: Path) -> None:
    conn = db.connect(db_path)
    migrations.migrate(conn, target=migrations.QUEUES.version - 1)
    conn.execute("INSERT INTO workflow_run (id, template, created_at) VALUES ('r', 'adhoc', 0)")
    conn.execute("INSERT INTO task (id, type, workflow_run_id, created_at) VALUES ('t', 'TRANSCODE_MP4', 'r', 0)")
    conn.commit()
    conn.close()
    conn = db.open_database(db_path)
    task = tasks.get(conn, "t")
    assert (task.queue, task.queue_explicit) == ("default", False)
    assert store_steps.claim_next(conn, NOW) is not None
    conn.close()


def test_a_recreated_task_keeps_a_named_queue_that_still_exists(conn: sqlite3.Connection) -> None:
    named, gone, routed = _submit(
        conn, TaskSpec(type="ECHO", queue="media"), TaskSpec(type="ECHO", queue="bulk"), TaskSpec(type="TRANSCODE_MP4")
    )
    for queue in ("media", "bulk", "media"):
        tasks.start(conn, tasks.claim_ready(conn, NOW, 1, queue=queue)[0].id, now=NOW)
    recovery.recover(conn, now=NOW)  # running → failed (INTERRUPTED), each with a restart-log entry
    copies = {}
    for entry in restarts.list_entries(conn):
        (result,) = retry.recreate_entries(conn, [str(entry.id)], now=NOW, routes=ROUTES,
                                           queue_names=["default", "media"])
        copies[entry.task_id] = tasks.get(conn, result.extra["new_id"])
    assert (copies[named].queue, copies[named].queue_explicit) == ("media", True)
    assert (copies[gone].queue, copies[gone].queue_explicit) == ("default", False)
    assert (copies[routed].queue, copies[routed].queue_explicit) == ("media", False)


def test_a_submission_naming_an_unknown_or_bad_queue_is_refused() -> None:
    known = queues.Queues(queues.with_default({"media": queues.QueueConfig("media", 1)}, 2))
    known.check_specs([TaskSpec(type="ECHO", queue="media"), TaskSpec(type="ECHO")])
    with pytest.raises(SubmissionRefused, match=r"^task 2: unknown queue 'nope'; configured: default, media$"):
        known.check_specs([TaskSpec(type="ECHO"), TaskSpec(type="ECHO", queue="nope")])
    with pytest.raises(SubmissionRefused, match="bad queue name 'a b'"):
        parse_spec({"type": "ECHO", "queue": "a b"})
    with pytest.raises(SubmissionRefused, match="a queue name must be a string, not 3"):
        parse_spec({"type": "ECHO", "queue": 3})


# --- rendering -----------------------------------------------------------------------------------


class AsyncOnly:
    """A registry stand-in: the types it knows, and which of them are event-loop executors."""

    def __init__(self, plain: set[str], in_event_loop: set[str]) -> None:
        self.plain, self.in_event_loop = plain, in_event_loop

    def __contains__(self, task_type: object) -> bool:
        return task_type in self.plain | self.in_event_loop

    def runs_in_event_loop(self, task_type: str) -> bool:
        return task_type in self.in_event_loop


def test_a_queue_of_thousands_of_workers_is_for_event_loop_executors_only() -> None:
    registry = AsyncOnly({"SHELL"}, {"HTTP_REQUEST"})
    big = {"web": queues.QueueConfig("web", 10_000, ("HTTP_REQUEST",), processes=2, loop_block_limit=3.0)}
    queues.check_task_types(queues.with_default(big, 4), registry)  # accepted
    mixed = {"web": queues.QueueConfig("web", 10_000, ("HTTP_REQUEST", "SHELL"))}
    with pytest.raises(queues.QueueError, match=r"more than 1024 only for event-loop executors \(type SHELL"):
        queues.check_task_types(queues.with_default(mixed, 4), registry)
    untyped = {"web": queues.QueueConfig("web", 2_000)}
    with pytest.raises(queues.QueueError, match="it may run any executor"):
        queues.check_task_types(untyped, registry)
    queues.check_task_types({"web": queues.QueueConfig("web", 1024)}, registry)  # a process each is allowed


def test_the_default_queue_takes_its_event_loop_settings_and_keeps_max_workers() -> None:
    parsed = queues.parse({"default": {"processes": 3, "loop_block_limit": 2}})
    default = queues.with_default(parsed, 7)["default"]
    assert (default.workers, default.processes, default.loop_block_limit) == (7, 3, 2.0)


def test_queue_table_and_status_line() -> None:
    rows = [
        {"name": "default", "workers": 2, "busy": 1, "waiting": 12, "held": 0, "paused": False},
        {"name": "media", "workers": 1, "busy": 1, "waiting": 3, "held": 2, "paused": True},
    ]
    assert render.queue_table(rows) == [
        "QUEUE    WORKERS  BUSY  WAITING  HELD  PAUSED",
        "default        2     1       12     0  -",
        "media          1     1        3     2  paused",
    ]
    status = {"pid": 1, "uptime": 3, "busy_workers": 2, "max_workers": 3, "counts": {},
              "queues": {r["name"]: {k: v for k, v in r.items() if k != "name"} for r in rows}}
    assert "queues   default 1/2 busy 12 waiting; media 1/1 busy 3 waiting 2 held paused" in render.status_lines(status)


def test_the_queue_table_shows_prefetch_once_a_queue_has_one() -> None:
    rows = [
        {"name": "default", "workers": 2, "busy": 1, "waiting": 12, "held": 0, "paused": False, "prefetch": 0},
        {"name": "bulk", "workers": 4, "busy": 4, "waiting": 30, "held": 0, "paused": False, "prefetch": 8},
    ]
    assert render.queue_table(rows) == [
        "QUEUE    WORKERS  PREFETCH  BUSY  WAITING  HELD  PAUSED",
        "default        2         0     1       12     0  -",
        "bulk           4         8     4       30     0  -",
    ]


# --- the real daemon -----------------------------------------------------------------------------

QUEUE_TOML = "[queues.slow]\nworkers = 1\ntypes = [\"GATED\"]\n"
GATED = {"GATED": "tests.fault_executors:Gated"}


def _make(daemons: Callable[..., Daemon], extra: str = QUEUE_TOML) -> Daemon:
    return daemons("q", executors=GATED, extra_toml=extra, max_workers=2)


def _gated(d: Daemon, tmp_path: Path, name: str, **fields: Any) -> tuple[str, Path, Path]:
    ready, gate = tmp_path / f"{name}.ready", tmp_path / f"{name}.gate"
    task_id = d.submit("GATED", payload={"ready_file": str(ready), "gate_file": str(gate)}, **fields)
    return task_id, ready, gate


def fredica(d: Daemon, *args: str) -> Result:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], catch_exceptions=False)


def _queues(d: Daemon) -> dict[str, dict[str, Any]]:
    return d.data("status")["queues"]


def test_a_queue_of_one_worker_runs_one_task_while_default_runs_the_rest(
    daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = _make(daemons).start()
    first, first_ready, first_gate = _gated(d, tmp_path, "first")
    # Running before the second is submitted: a tick that saw both would claim the second first
    # (higher priority), and submissions are answered fast enough for one to see both.
    wait_for(first_ready.exists)
    second, second_ready, second_gate = _gated(d, tmp_path, "second", priority=5)
    # The slow queue is full; default's tasks run all the same, and slow's second one waits.
    echoes = [d.submit("ECHO") for _ in range(4)]
    for echo in echoes:
        d.wait_task(echo, "completed")
    assert d.task(second)["status"] == "pending" and d.task(second)["queue"] == "slow"
    assert _queues(d) == {"default": {"workers": 2, "busy": 0, "waiting": 0, "held": 0, "paused": False, "prefetch": 0},
                          "slow": {"workers": 1, "busy": 1, "waiting": 1, "held": 0, "paused": False, "prefetch": 0}}
    status = d.data("status")
    assert (status["max_workers"], status["busy_workers"]) == (3, 1)

    # Two workers at runtime: the second starts beside the first.
    result = fredica(d, "queue", "workers", "slow", "2")
    assert result.exit_code == 0 and "the config sets it at the next start" in result.output
    wait_for(second_ready.exists)
    assert _queues(d)["slow"] == {"workers": 2, "busy": 2, "waiting": 0, "held": 0, "paused": False, "prefetch": 0}
    # Back to one: nothing is stopped, but nothing more is claimed until one ends.
    assert fredica(d, "queue", "workers", "slow", "1").exit_code == 0
    third, third_ready, third_gate = _gated(d, tmp_path, "third")
    d.wait_task(d.submit("ECHO"), "completed")  # a tick has claimed since
    assert d.task(third)["status"] == "pending"
    assert d.task(first)["status"] == d.task(second)["status"] == "running"
    first_gate.touch()
    d.wait_task(first, "completed")
    d.wait_task(d.submit("ECHO"), "completed")
    assert d.task(third)["status"] == "pending"  # one still runs: 1 busy of 1
    second_gate.touch()
    d.wait_task(second, "completed")
    wait_for(third_ready.exists)
    third_gate.touch()
    d.wait_task(third, "completed")

    # `submit --queue`: a named queue overrides the routing; an unknown one is refused, one line.
    named = fredica(d, "submit", "ECHO", "--queue", "slow")
    assert named.exit_code == 0
    assert d.wait_task(named.output.strip(), "completed")["queue"] == "slow"
    refused = fredica(d, "submit", "ECHO", "--queue", "nope")
    assert refused.exit_code == 1
    assert refused.output == "error: unknown queue 'nope'; configured: default, slow\n"
    line = '{"type": "ECHO"}\n{"type": "ECHO", "queue": "nope"}\n'
    batch = CliRunner().invoke(cli.main, ["submit", "--batch", "-", "--config", str(d.config)], input=line)
    assert batch.exit_code == 1 and batch.output.startswith("error: batch line 2: unknown queue 'nope'")
    for args in (["queue", "pause", "nope"], ["queue", "workers", "nope", "2"]):
        result = fredica(d, *args)
        assert (result.exit_code, result.output) == (1, "error: unknown queue 'nope'; configured: default, slow\n")
    assert fredica(d, "queue", "workers", "slow", "0").exit_code == 2
    assert d.stop() == 0


def test_a_paused_queue_claims_nothing_and_stays_paused_across_a_restart(
    daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = _make(daemons).start()
    running, running_ready, running_gate = _gated(d, tmp_path, "running")
    wait_for(running_ready.exists)
    result = fredica(d, "queue", "pause", "slow")
    assert result.exit_code == 0 and "kept across restarts" in result.output
    assert "kept in the database" in fredica(d, "queue", "pause", "--help").output
    # Its running task goes on and ends; what waits in it is not claimed, default's tasks are.
    waiting, waiting_ready, waiting_gate = _gated(d, tmp_path, "waiting")
    running_gate.touch()
    d.wait_task(running, "completed")
    d.wait_task(d.submit("ECHO"), "completed")
    assert d.task(waiting)["status"] == "pending"
    listed = fredica(d, "queues")
    assert listed.exit_code == 0
    assert listed.output.splitlines()[2].split() == ["slow", "1", "0", "1", "0", "paused"]
    assert "queues" in fredica(d, "status").output and "paused" in fredica(d, "status").output

    assert d.stop() == 0
    d.start()
    assert _queues(d)["slow"]["paused"] is True
    d.wait_task(d.submit("ECHO"), "completed")
    assert d.task(waiting)["status"] == "pending"
    result = fredica(d, "queue", "resume", "slow")
    assert result.exit_code == 0 and result.output == "resumed queue slow\n"
    wait_for(waiting_ready.exists)
    waiting_gate.touch()
    d.wait_task(waiting, "completed")
    assert fredica(d, "queue", "resume", "slow").output == "resumed queue slow (it was not paused)\n"
    json_rows = fredica(d, "queues", "--json")
    assert '"name": "slow"' in json_rows.output and '"paused": false' in json_rows.output
    assert d.stop() == 0


def test_waiting_tasks_are_rerouted_when_the_config_changes(daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = _make(daemons).start()
    assert fredica(d, "queue", "pause", "slow").exit_code == 0  # so that they wait
    routed = _gated(d, tmp_path, "routed")[0]
    named = d.submit("ECHO", queue="slow")
    assert d.stop() == 0
    # GATED now goes to `media`; `slow` is gone, so what named it goes by its type (ECHO: default).
    text = d.config.read_text().replace("[queues.slow]", "[queues.media]")
    d.config.write_text(text)
    d.start()
    assert d.task(routed)["queue"] == "media"
    assert d.task(named)["queue"] == "default" and d.task(named)["queue_explicit"] is False
    d.wait_task(named, "completed")
    events = [e for e in d.log_events() if e.get("event") == "tasks_rerouted"]
    assert len(events) == 1 and events[0]["tasks"] == 2 and events[0]["to_queues"] == {"media": 1, "default": 1}
    d.request("cancel", ids=[routed])
    assert d.stop(signal.SIGTERM) == 0


def test_a_queue_type_with_no_executor_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "d", extra_toml="[queues.media]\nworkers = 1\ntypes = [\"NO_SUCH_TYPE\"]\n")
    done = subprocess.run([sys.executable, "-m", "daemon", "daemon", "--config", str(d.config)],
                          env=d.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == "fredica: [queues.media] types: no executor for type NO_SUCH_TYPE\n"
