"""Database faults at runtime (SPEC §13): a full disk is ridden out with nothing lost; corruption
ends the daemon cleanly.

SQLite's own `PRAGMA max_page_count` makes writes that need a new page fail with SQLITE_FULL,
deterministically and in every environment; where the tests run as root (CI does), the real
daemon also meets a real full filesystem (a small tmpfs).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from daemon import faults, recovery
from daemon.engine.attempt import Phase
from daemon.config import Settings
from daemon.models import Task, TaskStatus
from daemon.store import db, restarts, task_reads
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor
from tests import mounts
from tests.conftest import wait_for
from tests.daemon_harness import REPO, Daemon

EXECUTORS = {"GATED": "tests.fault_executors:Gated", "COUNT": "tests.sample_executors:Counter"}
NO_LIMIT = 1_073_741_823  # SQLite's default max_page_count


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(Settings(
        database=tmp_path / "fredica.db", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
        executors=EXECUTORS, max_workers=2, cancel_grace=0.3, progress_interval=0.02,
    ))
    sup.start()
    yield sup
    sup.stop(grace=0, timeout=20)


def gated(tmp_path: Path, name: str, size: int = 0) -> dict[str, Any]:
    return {"type": "GATED", "payload": {"ready_file": str(tmp_path / f"{name}.ready"),
                                         "gate_file": str(tmp_path / f"{name}.gate"), "size": size}}


def stored(database: Path) -> dict[str, Task]:
    """The task rows as another process sees them (committed only)."""
    conn = db.connect(database)
    try:
        return {t.id: t for t in task_reads.list_tasks(conn)}
    finally:
        conn.close()


def cap_the_database(sup: Supervisor, pages: int) -> None:
    # The loop's own connection: the cap is per connection. SQLite serialises calls on it, and
    # the loop does not write while a request runs on another thread (there is none here).
    sup.conn.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_database_is_ridden_out_and_what_it_held_is_recorded_once_space_is_back(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    sup = supervisor
    big, small, waiting = (sup.submit([parse_spec(line)]).tasks[0].id for line in (
        gated(tmp_path, "big", size=300_000), gated(tmp_path, "small"), gated(tmp_path, "waiting")))
    wait_for(lambda: (tmp_path / "big.ready").exists() and (tmp_path / "small.ready").exists())
    if True:  # (the loop's loggers are cached: its events are read from its counters)
        cap_the_database(sup, 1)  # no new page: recording a 300 KB result needs ~75
        (tmp_path / "big.gate").touch()
        fault = wait_for(lambda: sup.fault)
        assert fault.kind is faults.Kind.FULL

        # Requests that would write are refused with one line, changing nothing.
        before = stored(sup.settings.database)
        with pytest.raises(faults.DatabaseFault, match="^the database's disk is full: nothing was changed$"):
            sup.submit([parse_spec({"type": "GATED", "payload": {}})])
        with pytest.raises(faults.DatabaseFault):
            sup.pause(small)
        # The ended attempt is held in memory; its row says running; the freed slot claims nothing.
        wait_for(lambda: [rt.task.id for rt in sup.unrecorded] == [big])
        wait_for(lambda: sup.fault is not None and sup.fault.failed_retries >= 2)  # retried, failed again
        assert stored(sup.settings.database)[big].status is TaskStatus.RUNNING
        assert list(sup.running) == [small] and stored(sup.settings.database)[waiting].status is TaskStatus.PENDING
        assert stored(sup.settings.database) == before
        progress_in_memory = sup.running[small].last_progress

        cap_the_database(sup, NO_LIMIT)  # space is back
        wait_for(lambda: sup.fault is None)
        done = wait_for(lambda: (t := stored(sup.settings.database)[big]).status is TaskStatus.COMPLETED and t)
    assert len(done.result["blob"]) == 300_000 and done.completed_at <= done.result["finished_at"] + 5
    assert progress_in_memory is not None and stored(sup.settings.database)[small].progress >= progress_in_memory[0]
    # The freed slot is used again, and requests are taken again.
    wait_for(lambda: (tmp_path / "waiting.ready").exists())
    extra = sup.submit([parse_spec(gated(tmp_path, "extra"))]).tasks[0].id
    for name in ("small", "waiting", "extra"):
        (tmp_path / f"{name}.gate").touch()
    for task_id in (small, waiting, extra):
        wait_for(lambda: stored(sup.settings.database)[task_id].status is TaskStatus.COMPLETED)
    # One fault, however many retries failed in it (one log line when it started, one when it ended).
    assert sup.database_faults == 1
    assert sup.finished_counts["completed"] >= 1


def test_a_request_in_the_tick_that_meets_the_fault_is_refused_and_did_nothing(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """The tick's transaction is rolled back whole: a request that ran in it is told nothing
    was changed, and indeed nothing was, in the database or in the running attempt."""
    sup = supervisor
    counting = sup.submit([parse_spec(gated(tmp_path, "a"))]).tasks[0].id
    wait_for(lambda: (tmp_path / "a.ready").exists())
    cap_the_database(sup, 1)
    # A submission needs new pages: it fails in its own savepoint, and takes its tick down with it
    # (the next retry, with nothing big to write, then succeeds).
    with pytest.raises(faults.DatabaseFault, match="disk is full"):
        sup.submit([parse_spec({"type": "GATED", "payload": {"pad": "y" * 100_000}})])
    wait_for(lambda: sup.database_faults == 1)  # the refusal may reach us before the loop counts
    rt = sup.running[counting]
    assert rt.phase is Phase.RUNNING and rt.stop_reason is None and rt.paused_since is None
    cap_the_database(sup, NO_LIMIT)
    wait_for(lambda: sup.fault is None)
    (tmp_path / "a.gate").touch()
    wait_for(lambda: stored(sup.settings.database)[counting].status is TaskStatus.COMPLETED)
    assert len(stored(sup.settings.database)) == 1  # the refused submission stored nothing


def test_a_pause_during_the_fault_is_refused_and_one_before_it_is_kept(supervisor: Supervisor, tmp_path: Path) -> None:
    """What the executor did while the database could not be written reaches the row afterwards:
    its pause state, its progress."""
    sup = supervisor
    task_id = sup.submit([parse_spec(gated(tmp_path, "p"))]).tasks[0].id
    wait_for(lambda: (tmp_path / "p.ready").exists())
    sup.pause(task_id)
    assert stored(sup.settings.database)[task_id].is_paused
    cap_the_database(sup, 1)
    with pytest.raises(faults.DatabaseFault):
        sup.submit([parse_spec({"type": "GATED", "payload": {"pad": "z" * 100_000}})])
    with pytest.raises(faults.DatabaseFault):
        sup.resume(task_id)
    assert sup.running[task_id].paused_since is not None  # the refused resume did nothing
    cap_the_database(sup, NO_LIMIT)
    wait_for(lambda: sup.fault is None)
    sup.resume(task_id)
    (tmp_path / "p.gate").touch()
    done = wait_for(lambda: (t := stored(sup.settings.database)[task_id]).status is TaskStatus.COMPLETED and t)
    assert not done.is_paused


# --- the real daemon ----------------------------------------------------------------------------


def cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon", "--config", str(d.config), *args],
                          capture_output=True, text=True, timeout=60, env=d.env(), cwd=REPO)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB filesystem of its own."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mounts.mount_tmpfs(mountpoint, "16m")
    try:
        yield mountpoint
    finally:
        mounts.unmount(mountpoint)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; the file, to delete when space must come back."""
    filler = directory / "filler"
    # Unbuffered: a buffered file's close would write again what the full disk refused, and raise.
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_the_real_daemon_on_a_full_filesystem_refuses_writes_answers_reads_and_recovers(
    daemons, small_filesystem: Path, tmp_path: Path
) -> None:
    d = daemons(database=small_filesystem / "fredica.db", max_workers=1)
    d.start()
    running = d.submit("HANG", payload={"ready_file": str(tmp_path / "hang.ready")})
    wait_for(lambda: (tmp_path / "hang.ready").exists())
    queued = [d.submit("ECHO", payload={"i": i}) for i in range(5)]
    filler = fill(small_filesystem)

    big = tmp_path / "big.jsonl"  # needs far more than the WAL has room for
    big.write_text(json.dumps({"type": "ECHO", "payload": {"blob": "b" * 600_000}}) + "\n")
    refused = cli(d, "submit", "--batch", str(big))
    assert refused.returncode == 1, refused
    assert refused.stderr.strip() == "error: the database's disk is full: nothing was changed"
    status = cli(d, "status", "--json")  # reads still answer, and say what is wrong
    assert status.returncode == 0, status
    assert json.loads(status.stdout)["database_faults"] >= 1
    assert d.process is not None and d.process.poll() is None
    assert psutil.pid_exists(int((tmp_path / "hang.ready").read_text()))  # running tasks run on

    filler.unlink()
    accepted = wait_for(lambda: (r := cli(d, "submit", "--batch", str(big))).returncode == 0 and r, timeout=60)
    new_id = accepted.stdout.strip()
    cli(d, "cancel", running)
    for task_id in [*queued, new_id]:
        d.wait_task(task_id, "completed", timeout=60)
    d.wait_task(running, "cancelled", timeout=60)
    events = [e["event"] for e in d.log_events()]
    assert events.count("database_fault") >= 1 and events.count("database_fault_ended") >= 1


def corrupt_under(database: Path) -> None:
    """Corrupt a database a daemon has open: every page into the main file, then all but the
    schema page overwritten; a write from another connection (a table of its own, on the schema
    page and a new one) makes the daemon's connection drop its cache and read the damage."""
    other = sqlite3.connect(database, isolation_level=None)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = database.stat().st_size
    with open(database, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 4096))
    other.execute("CREATE TABLE trigger_reload (x)")
    other.close()


def test_corruption_met_at_runtime_ends_the_daemon_and_its_attempts(daemons, tmp_path: Path) -> None:
    d = daemons(cancel_grace=2.0)
    d.start()
    gate = d.submit("HANG", payload={"ready_file": str(tmp_path / "hang.ready")})
    pid = int(wait_for(lambda: (tmp_path / "hang.ready").exists() and (tmp_path / "hang.ready").read_text()))
    lines = [json.dumps({"type": "ECHO", "payload": {"i": i, "pad": "p" * 300}, "depends_on": [gate]})
             for i in range(300)]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    assert cli(d, "submit", "--batch", str(batch)).returncode == 0

    corrupt_under(d.database)

    assert d.process is not None
    assert d.process.wait(30) == 1
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    events = [e for e in d.log_events() if e["event"] == "database_corrupt"]
    assert len(events) == 1, d.output.read_text()


def test_a_shutdown_during_the_fault_ends_and_recovery_records_what_was_held(tmp_path: Path) -> None:
    """No exit path waits for the database for ever: what could not be recorded before the
    shutdown's end is found by the next start's recovery, interrupted, with a restart-log entry."""
    settings = Settings(database=tmp_path / "fredica.db", socket=tmp_path / "control.sock",
                        log_dir=tmp_path / "logs", executors=EXECUTORS, max_workers=1, cancel_grace=0.3)
    sup = Supervisor(settings)
    sup.start()
    task_id = sup.submit([parse_spec(gated(tmp_path, "held", size=300_000))]).tasks[0].id
    wait_for(lambda: (tmp_path / "held.ready").exists())
    cap_the_database(sup, 1)
    (tmp_path / "held.gate").touch()
    wait_for(lambda: [rt.task.id for rt in sup.unrecorded] == [task_id])
    sup.stop(grace=0, timeout=20)
    assert sup._handoff.finished.is_set() and sup.exit_status == 0
    assert stored(settings.database)[task_id].status is TaskStatus.RUNNING

    conn = db.open_database(settings.database)
    try:
        report = recovery.recover(conn, now=1e10, kill_grace=0.1)
        assert [t.id for t in report.interrupted_tasks] == [task_id]
        assert [e.task_id for e in restarts.list_entries(conn)] == [task_id]
    finally:
        conn.close()


def test_corruption_a_reader_meets_first_ends_the_daemon_too(daemons, tmp_path: Path) -> None:
    """`ls` reads on a connection of its own: the loop may never touch the damaged pages, but the
    daemon must not go on answering from a database it cannot trust."""
    d = daemons(cancel_grace=2.0)
    d.start()
    ids = [d.submit("ECHO", payload={"i": i, "pad": "p" * 300}) for i in range(300)]
    for task_id in (ids[0], ids[-1]):
        d.wait_task(task_id, "completed", timeout=60)
    wait_for(lambda: d.data("status")["busy_workers"] == 0)
    corrupt_under(d.database)
    reply = d.request("ls")
    assert not reply["ok"] and "corrupt" in reply["error"]["message"], reply
    assert d.process is not None and d.process.wait(30) == 1


# --- found in review: a COMMIT that fails, several held attempts, a stepped loop ----------------


class FailingCommit:
    """The loop's connection, whose COMMIT fails (as a full disk makes it fail in WAL mode) while
    `failures` is above 0; only for a transaction that promoted a delayed retry, if `on_promote`."""

    def __init__(self, conn: sqlite3.Connection, *, on_promote: bool = False) -> None:
        self._conn, self.failures, self.on_promote, self._promoted = conn, 0, on_promote, False

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.failures > 0 and (self._promoted or not self.on_promote):
            self.failures -= 1
            self._promoted = False
            raise sqlite3.OperationalError("database or disk is full")
        cursor = self._conn.execute(sql, *args)
        if "SET not_before = 0" in sql and cursor.rowcount > 0:
            self._promoted = True
        elif sql in ("COMMIT", "ROLLBACK"):
            self._promoted = False
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def stepped(tmp_path: Path, **options: Any) -> Supervisor:
    """A supervisor whose loop the test steps with tick() (no thread of its own)."""
    return Supervisor(Settings(
        database=tmp_path / "fredica.db", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
        executors={**EXECUTORS, "RAISE": "tests.sample_executors:Raising"}, cancel_grace=0.3,
        progress_interval=0.02, **options,
    ))


def tick_until(sup: Supervisor, condition: Any, timeout: float = 20) -> Any:
    def step() -> Any:
        sup.tick()
        return condition()
    return wait_for(step, timeout)


def test_every_held_attempt_survives_a_retry_that_fails(supervisor: Supervisor, tmp_path: Path) -> None:
    sup = supervisor
    ids = [sup.submit([parse_spec(gated(tmp_path, name, size=200_000))]).tasks[0].id for name in ("a", "b")]
    wait_for(lambda: (tmp_path / "a.ready").exists() and (tmp_path / "b.ready").exists())
    cap_the_database(sup, 1)
    (tmp_path / "a.gate").touch()
    (tmp_path / "b.gate").touch()
    wait_for(lambda: sorted(rt.task.id for rt in sup.unrecorded) == sorted(ids))
    failed = sup.fault.failed_retries if sup.fault else 0
    wait_for(lambda: sup.fault is not None and sup.fault.failed_retries >= failed + 2)
    assert sorted(rt.task.id for rt in sup.unrecorded) == sorted(ids)
    cap_the_database(sup, NO_LIMIT)
    for task_id in ids:
        wait_for(lambda: stored(sup.settings.database)[task_id].status is TaskStatus.COMPLETED)


def test_a_retry_whose_promotion_was_rolled_back_is_still_claimed(tmp_path: Path) -> None:
    sup = stepped(tmp_path, backoff_base=0.05, max_workers=2)
    sup.conn = FailingCommit(sup.conn, on_promote=True)  # type: ignore[assignment]
    task_id = sup.submit([parse_spec({"type": "RAISE", "max_retries": 1})]).tasks[0].id
    try:
        tick_until(sup, lambda: stored(sup.settings.database)[task_id].retry_count == 1)
        sup.conn.failures = 1  # type: ignore[attr-defined]
        tick_until(sup, lambda: sup.conn.failures == 0)  # type: ignore[attr-defined]
        ended = tick_until(sup, lambda: (t := stored(sup.settings.database)[task_id]).status.is_terminal and t)
        assert ended.status is TaskStatus.FAILED and ended.retry_count == 1
    finally:
        sup.idle.dismiss_all()


def test_the_loop_sleeps_while_the_database_cannot_be_written(tmp_path: Path) -> None:
    """Progress that cannot be written is no reason to wake: the loop waits for the retry."""
    sup = stepped(tmp_path, max_workers=2)
    task_id, chatty = (sup.submit([parse_spec(gated(tmp_path, name, size=size))]).tasks[0].id
                       for name, size in (("s", 200_000), ("c", 0)))
    try:
        tick_until(sup, lambda: (tmp_path / "s.ready").exists() and (tmp_path / "c.ready").exists())
        cap_the_database(sup, 1)
        (tmp_path / "s.gate").touch()
        tick_until(sup, lambda: sup.unrecorded and sup.fault is not None)
        tick_until(sup, lambda: sup.running[chatty].progress is not None)  # progress waits to be written
        now = sup.clock()
        assert sup.tick(now) == pytest.approx(sup.fault.retry_at - now)
        cap_the_database(sup, NO_LIMIT)
        tick_until(sup, lambda: stored(sup.settings.database)[task_id].status is TaskStatus.COMPLETED)
        (tmp_path / "c.gate").touch()
        tick_until(sup, lambda: stored(sup.settings.database)[chatty].status is TaskStatus.COMPLETED)
    finally:
        sup.idle.dismiss_all()


def test_a_cancel_taken_in_the_tick_its_attempt_ends_is_recorded_as_a_cancel(tmp_path: Path) -> None:
    sup = stepped(tmp_path, max_workers=1)
    task_id = sup.submit([parse_spec({"type": "RAISE", "max_retries": 3})]).tasks[0].id
    try:
        tick_until(sup, lambda: task_id in sup.running)
        rt = sup.running[task_id]
        pid = rt.task.executor_pid
        assert pid is not None  # the attempt's process: it exits once it has sent its failure
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
        report = sup.cancel(task_id)  # no loop thread: taken at once, before the tick that ends it
        assert report.stopping == (task_id,)
        ended = tick_until(sup, lambda: (t := stored(sup.settings.database)[task_id]).status.is_terminal and t)
        assert ended.status is TaskStatus.CANCELLED and ended.retry_count == 0
    finally:
        sup.idle.dismiss_all()
