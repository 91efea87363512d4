"""Rescue of a dead supervisor's running tasks on PostgreSQL (SPEC §16; issue 15's target: its
1,000 running tasks handled <= 1 s after its lease expired).

Two measurements, each on a fresh database:

  transaction  the store alone: a supervisor row `dead` (a lease registered with a 1 ms
               lease_timeout, so expired at once by the database's clock), 1,000 tasks submitted,
               claimed by `dead` and started, directly with the store functions; then the time of
               `supervisors.rescue` (one transaction: lock the row, the 1,000 running tasks ->
               failed/INTERRUPTED, the restart log, the row deleted), wall clock and this
               process's CPU, with a cProfile (`time.thread_time`) of one more.
  daemon       end to end: two real daemons on the database, `dead` and `live` (lease_timeout and
               heartbeat_interval as given); `dead` runs the 1,000 tasks at once (an `async def`
               executor that waits for its cancel, in a queue of 1,000 workers served by 2
               event-loop processes that only `dead`'s config names); when all run, `dead` and
               its executor processes are killed with SIGKILL (a host that died). Measured: from
               the expiry of `dead`'s lease (its last heartbeat + lease_timeout, database clock)
               until its row is gone, which the rescue deletes last, in the transaction that
               handles its tasks (polled every 2 ms, database clock). `live` looks for expired
               leases twice a second (daemon/leases.py), whatever its heartbeat_interval: the
               time after expiry is up to half a second of waiting for that look, plus the
               rescue itself.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from daemon.client import Client
from daemon.models import TaskStatus
from daemon.store import db, supervisors, tasks
from daemon.store import recovery as recovery_store
from daemon.submission import TaskSpec

DEAD = "dead"


def _running_of_dead(url: str, n: int) -> Any:
    """A migrated database where the expired supervisor `dead` runs `n` tasks; its connection."""
    conn = db.open_database(url)
    supervisors.register(conn, DEAD, host="elsewhere", pid=1, pid_started_at=None, lease_timeout=0.001,
                         gone=lambda row: False)
    now = time.time()
    tasks.submit(conn, [TaskSpec(type="HANG") for _ in range(n)], now=now)
    claimed = tasks.claim_ready(conn, now, n, supervisor=DEAD)
    with db.write(conn):
        for task in claimed:
            tasks.start(conn, task.id, now=now, known=task)
    assert len(claimed) == n and supervisors.expired(conn, besides="live") == [DEAD], (len(claimed), n)
    return conn


def rescue_transaction(url: str, n: int, *, profile: bool = False) -> dict[str, Any]:
    """One timed `supervisors.rescue` of `n` running tasks (the database at `url` is filled here)."""
    conn = _running_of_dead(url, n)
    try:
        profiler = cProfile.Profile(time.thread_time) if profile else None
        cpu0, t0 = time.thread_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        rescue = supervisors.rescue(conn, DEAD, now=time.time(), session_id=str(uuid.uuid4()))
        if profiler:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        assert rescue is not None and len(rescue.interrupted) == n, rescue
        assert supervisors.find(conn, DEAD) is None and recovery_store.in_flight(conn, supervisor=DEAD) == []
        result: dict[str, Any] = {"wall": wall, "cpu": cpu}
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
            result["profile"] = out.getvalue()
        return result
    finally:
        conn.close()


def rescue_by_daemon(url: str, root: Path, n: int, *, lease_timeout: float, heartbeat: float) -> dict[str, float]:
    """Kill -9 a real daemon running `n` tasks; how long after its lease expired a live daemon
    had handled them all (seconds), and from the kill."""
    from tests.daemon_harness import Daemon

    options: dict[str, Any] = {"database": url, "lease_timeout": lease_timeout, "heartbeat_interval": heartbeat}
    hang = {"HANG": "benchmarks.peers.fredica_tasks:AsyncHang"}
    queue = f'[queues.hangs]\nworkers = {n}\nprocesses = 2\ntypes = ["HANG"]\n'
    dead = Daemon(root / DEAD, name=DEAD, executors=hang, extra_toml=queue, **options)
    live = Daemon(root / "live", name="live", **options)
    conn = db.open_database(url)
    try:
        live.start()
        dead.start()
        with Client(dead.config) as client:
            client.submit_batch([{"type": "HANG", "max_retries": 0}] * n)

        def busy() -> int:
            return next(s["busy"] for s in supervisors.overview(conn) if s["name"] == DEAD)

        _wait(lambda: busy() == n, timeout=120, what=f"{n} tasks running on {DEAD}")
        assert dead.process is not None
        executors = psutil.Process(dead.process.pid).children(recursive=True)
        dead.kill9()
        killed_at = supervisors.database_now(conn)
        for process in executors:  # the host is gone: its executor processes with it
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(executors, timeout=10)
        row = supervisors.find(conn, DEAD)
        assert row is not None
        expiry = row.heartbeat_at + row.lease_timeout
        _wait(lambda: supervisors.find(conn, DEAD) is None, timeout=lease_timeout + 10 * heartbeat + 30,
              what=f"{DEAD}'s rescue", interval=0.002)
        done = supervisors.database_now(conn)
        left = recovery_store.in_flight(conn, supervisor=DEAD)
        assert left == [], f"{len(left)} tasks of {DEAD} still in flight after its rescue"
        with Client(live.config) as client:
            failed = [t for t in client.list(status="failed") if t["type"] == "HANG"]
        assert len(failed) == n, f"{len(failed)} of {n} HANG tasks failed"
        assert all(t["status"] == TaskStatus.FAILED.value for t in failed)
        return {"after_expiry": done - expiry, "after_kill": done - killed_at}
    finally:
        conn.close()
        for daemon in (dead, live):
            daemon.kill_if_running()


def _wait(condition: Any, *, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)


def medians(results: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in results) for key in results[0] if key != "profile"}
