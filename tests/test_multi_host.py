"""Several supervisors sharing one PostgreSQL queue, as on several hosts, on one machine (SPEC
§16): real daemons of different names, each with its own config, socket and logs. One killed -9
while it runs tasks is rescued by the others once its lease expires (no task runs twice, none is
lost, every interruption is in the restart log); so is one cut off by a network partition, which
stops its attempts once it is back; a server restart under load is ridden out by every one of
them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from daemon import models
from daemon.store import db, supervisors
from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_cluster import Cluster, url  # noqa: F401 (url: a database of each test's own)
from tests.shared_queue_executors import tallied
from tests.stalling_proxy import StallingProxy

TERMINAL = {status.value for status in models.TERMINAL_STATUSES}
# Small, so that an expiry comes quickly: a lease of 2 s renewed every 0.5 s. Polling stands in
# for the wake-ups between supervisors (LISTEN/NOTIFY is not theirs to wait for here).
SHARED = {"lease_timeout": 2.0, "heartbeat_interval": 0.5, "poll_interval": 0.1, "idle_poll_interval": 0.1,
          "max_workers": 2, "cancel_grace": 0.5}


@pytest.fixture
def supervisor(url: str, tmp_path: Path) -> Iterator[Callable[[str], Daemon]]:
    """Starts a real daemon named `name` on the shared database (its own directory, socket, logs)."""
    made: list[Daemon] = []

    def start(name: str) -> Daemon:
        daemon = Daemon(tmp_path / name, database=url, name=name,
                        executors={"TALLY": "tests.shared_queue_executors:Tally"}, **SHARED)
        made.append(daemon)
        return daemon.start()

    yield start
    for daemon in made:
        daemon.kill_if_running()


def tally(tmp_path: Path) -> dict[str, Any]:
    return {"tally_file": str(tmp_path / "tally"), "gate_file": str(tmp_path / "gate")}


def tasks_of(d: Daemon, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {task_id: d.task(task_id) for task_id in ids}


def all_ended(d: Daemon, ids: list[str]) -> dict[str, dict[str, Any]] | None:
    found = tasks_of(d, ids)
    return found if all(t["status"] in TERMINAL for t in found.values()) else None


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lease_names(url: str) -> list[str]:
    conn = db.connect_read_only(url)
    try:
        return [row.name for row in supervisors.list_all(conn)]
    finally:
        conn.close()


def test_a_supervisor_killed_while_it_runs_tasks_is_rescued_by_the_others(
    supervisor: Callable[[str], Daemon], url: str, tmp_path: Path
) -> None:
    alpha, beta, gamma = (supervisor(name) for name in ("alpha", "beta", "gamma"))
    # Six workers among three supervisors, and two tasks more that wait for a free one.
    ids = [alpha.submit("TALLY", payload=tally(tmp_path)) for _ in range(8)]
    running = wait_for(lambda: (found := tasks_of(alpha, ids)) and [
        t for t in found.values() if t["status"] == "running"] if len(tallied(tmp_path / "tally")) == 6 else None,
        timeout=60)
    by = Counter(t["supervisor"] for t in running)
    assert by == {"alpha": 2, "beta": 2, "gamma": 2}, by
    beta_tasks = sorted(t["id"] for t in running if t["supervisor"] == "beta")

    beta.kill9()
    # Rescued once its lease (2 s) has expired, at a heartbeat (0.5 s) of alpha or gamma.
    rescued = wait_for(lambda: all((t := alpha.task(i))["status"] == "failed" for i in beta_tasks)
                       and [alpha.task(i) for i in beta_tasks], timeout=60)
    assert {(t["error_type"], t["supervisor"]) for t in rescued} == {(models.INTERRUPTED, "beta")}
    assert sorted(lease_names(url)) == ["alpha", "gamma"]
    entries = gamma.data("restarts")
    assert sorted((e["task_id"], e["status_at_restart"]) for e in entries) == [(i, "running") for i in beta_tasks]

    alive = next(t["id"] for t in running if t["supervisor"] == "alpha")
    # Asked of alpha, that runs it, a pause is refused by what alpha's row says of it (TALLY
    # cannot be paused): tests/test_cross_host_control.py has the pause that is taken.
    refused = gamma.request("pause", ids=[alive])
    assert f"task {alive} (TALLY) cannot be paused" in json.dumps(refused), refused
    # A cancel given on another host ends the row at once; its supervisor finds the row moved on
    # and stops the attempt.
    gamma.data("cancel", ids=[alive])
    wait_for(lambda: any(e["event"] == "attempt_no_longer_current" and e["task_id"] == alive
                         for e in alpha.log_events()), timeout=30)

    (tmp_path / "gate").touch()
    ended = wait_for(lambda: all_ended(gamma, ids), timeout=60)
    outcomes = Counter((t["status"], t["error_type"]) for t in ended.values())
    assert outcomes == {("completed", None): 5, ("cancelled", models.CANCELLED): 1,
                        ("failed", models.INTERRUPTED): 2}, outcomes
    runs = Counter(tallied(tmp_path / "tally"))
    assert set(runs) == set(ids) and set(runs.values()) == {1}, runs  # each ran once: none twice, none lost
    assert {t["supervisor"] for t in ended.values() if t["status"] == "completed"} <= {"alpha", "gamma"}
    assert gamma.task(alive)["supervisor"] == "alpha" and gamma.task(alive)["status"] == "cancelled"
    assert any(e["event"] == "supervisor_rescued" and e["supervisor"] == "beta"
               for e in alpha.log_events() + gamma.log_events())


def test_a_supervisor_cut_off_by_the_network_is_rescued_and_stops_its_attempts_once_back(
    supervisor: Callable[[str], Daemon], url: str, tmp_path: Path, postgres_cluster: Cluster
) -> None:
    """A network partition between one supervisor and the database: its connections stay open and
    nothing gets through them, nor through new ones. The others rescue its tasks once its lease
    has expired, as a dead one's. It gives its sessions up and keeps steering; once the network is
    back it reconnects, finds its attempts no longer current and stops them, and what they write
    changes nothing. Each task ran once and ends in one state, its interruption in the restart log."""
    relay = tmp_path / "relay"
    relay.mkdir()
    proxy = StallingProxy(relay, Path(postgres_cluster.socket_dir))
    alpha = Daemon(tmp_path / "alpha", database=proxy.url(url), name="alpha",
                   executors={"TALLY": "tests.shared_queue_executors:Tally"}, database_answer_timeout=1, **SHARED)
    try:
        alpha.start()
        ids = [alpha.submit("TALLY", payload=tally(tmp_path)) for _ in range(2)]
        wait_for(lambda: len(tallied(tmp_path / "tally")) == 2, timeout=60)  # both run in alpha
        beta = supervisor("beta")
        proxy.partition()
        rescued = wait_for(lambda: all((t := beta.task(i))["status"] == "failed" for i in ids)
                           and [beta.task(i) for i in ids], timeout=60)
        assert {(t["error_type"], t["supervisor"]) for t in rescued} == {(models.INTERRUPTED, "alpha")}
        assert sorted((e["task_id"], e["status_at_restart"]) for e in beta.data("restarts")) == sorted(
            (i, "running") for i in ids)
        wait_for(lambda: any(e["event"] == "database_fault" and "did not answer within 1 s" in str(e.get("error"))
                             for e in alpha.log_events()), timeout=30)
        proxy.heal()
        wait_for(lambda: {e["task_id"] for e in alpha.log_events() if e["event"] == "attempt_no_longer_current"}
                 >= set(ids), timeout=60)
        pids = [int(line.split()[1]) for line in (tmp_path / "tally").read_text().splitlines()]
        wait_for(lambda: all(_gone(pid) for pid in pids), timeout=30)  # stopped by alpha: the gate is still shut
        (tmp_path / "gate").touch()
        assert {(beta.task(i)["status"], beta.task(i)["error_type"]) for i in ids} == {("failed", models.INTERRUPTED)}
        assert Counter(tallied(tmp_path / "tally")) == Counter(ids)  # each ran once
        assert alpha.process is not None and alpha.process.poll() is None
    finally:
        alpha.kill_if_running()
        proxy.close()


def test_every_supervisor_rides_out_a_server_restart_under_load(
    supervisor: Callable[[str], Daemon], postgres_cluster: Cluster, tmp_path: Path
) -> None:
    alpha, beta = supervisor("alpha"), supervisor("beta")
    held = [alpha.submit("TALLY", payload=tally(tmp_path)) for _ in range(2)]
    held += [beta.submit("TALLY", payload=tally(tmp_path)) for _ in range(2)]
    wait_for(lambda: len(tallied(tmp_path / "tally")) == 4, timeout=60)  # every worker busy
    quick = [t["id"] for t in alpha.data("submit", tasks=[{"type": "ECHO"} for _ in range(30)])["tasks"]]

    postgres_cluster.restart()
    (tmp_path / "gate").touch()
    ids = held + quick
    ended = wait_for(lambda: _answered(alpha) and all_ended(alpha, ids), timeout=90)
    assert Counter(t["status"] for t in ended.values()) == {"completed": len(ids)}
    assert sorted(Counter(tallied(tmp_path / "tally")).values()) == [1, 1, 1, 1]  # none ran twice
    for d in (alpha, beta):
        assert d.process is not None and d.process.poll() is None
        assert "database_reconnected" in [e["event"] for e in d.log_events()]
        assert d.data("restarts") == []  # nobody was taken for dead
    after = beta.submit("ECHO")
    assert beta.wait_task(after, "completed")["supervisor"] in {"alpha", "beta"}


def _answered(d: Daemon) -> bool:
    """Whether a read answers again (the first after the restart may meet the lost session)."""
    return bool(d.request("status")["ok"])
