"""The real daemon on PostgreSQL (SPEC §16), through its CLI and client: a task runs and names its
supervisor, cancel and pause act on a running task, kill -9 and a restart recover only this
supervisor's own tasks, SIGTERM gives the lease up, a second supervisor of one name is refused,
reads answer with no daemon, and an outage of the server is ridden out (its errors known by their
SQLSTATE), as is a server that stops answering with its connections open. A SQLite daemon never
loads the driver."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from daemon import client, faults, models
from daemon.errors import DatabaseFault
from daemon.store import db, supervisors, tasks
from tests.conftest import wait_for
from tests.daemon_harness import REPO, Daemon
from tests.postgres_cluster import Cluster, HeldConnect
from tests.postgres_daemons import fredica, hang, ok, on_postgres, url  # noqa: F401 (fixtures)
from tests.stalling_proxy import StallingProxy
from tests.web_harness import free_port

def lease_of(url: str, name: str) -> supervisors.SupervisorRow | None:
    conn = db.connect_read_only(url)
    try:
        return supervisors.find(conn, name)
    finally:
        conn.close()


def test_a_task_runs_to_completion_and_names_its_supervisor(on_postgres: Callable[..., Daemon], url: str) -> None:
    d = on_postgres("alpha").start()
    task_id = ok(d, "submit", "ECHO", "--payload", '{"x": 1}').strip()
    assert d.wait_task(task_id, "completed")["result"]["echo"] == {"x": 1}
    shown = json.loads(ok(d, "show", task_id, "--json"))
    assert (shown["supervisor"], shown["attempt"]) == ("alpha", 1)
    assert "supervisor:" in ok(d, "show", task_id) and " alpha" in ok(d, "show", task_id)
    held = lease_of(url, "alpha")
    assert held is not None and (held.pid, held.expired) == (d.process.pid, False)
    status = json.loads(ok(d, "status", "--json"))
    assert status["pid"] == d.process.pid and status["database"] == url


def test_cancel_pause_and_resume_act_on_a_running_task(on_postgres: Callable[..., Daemon], tmp_path: Path) -> None:
    d = on_postgres().start()
    state, count = tmp_path / "state", tmp_path / "count"
    with client.Client(d.config) as fredica_client:
        task_id = fredica_client.submit("COUNT", {"n": 100000, "step": 0.02, "state_file": str(state),
                                                  "count_file": str(count)})
        wait_for(count.exists)
        fredica_client.pause(task_id)
        wait_for(lambda: state.exists() and state.read_text() == "paused")
        assert fredica_client.get(task_id)["is_paused"]
        fredica_client.resume(task_id)
        wait_for(lambda: state.read_text() == "running")
        assert not fredica_client.get(task_id)["is_paused"]
        fredica_client.cancel(task_id)
        (done,) = fredica_client.wait(task_id, timeout=30)
    assert (done["status"], done["error_type"]) == ("cancelled", models.CANCELLED)


def test_kill9_and_restart_recover_this_supervisors_tasks_only(
    on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    alpha = on_postgres("alpha", max_workers=1).start()
    mine = alpha.submit("HANG", payload=hang(tmp_path, "mine"))
    wait_for((tmp_path / "mine.ready").exists)
    beta = on_postgres("beta", max_workers=1).start()
    theirs = beta.submit("HANG", payload=hang(tmp_path, "theirs"))  # alpha's only worker is busy
    wait_for((tmp_path / "theirs.ready").exists)
    assert alpha.task(theirs)["supervisor"] == "beta"
    leftover = int((tmp_path / "mine.ready").read_text())

    alpha.kill9()
    alpha.start()  # at once: its lease has not expired, but its process is known dead on this host
    interrupted = alpha.task(mine)
    assert (interrupted["status"], interrupted["error_type"]) == ("failed", models.INTERRUPTED)
    assert [e["task_id"] for e in alpha.data("restarts")] == [mine]
    wait_for(lambda: not psutil.pid_exists(leftover) or psutil.Process(leftover).status() == psutil.STATUS_ZOMBIE)
    # beta's task was none of alpha's recovery's business.
    assert beta.task(theirs)["status"] == "running"
    assert lease_of(url, "alpha").pid == alpha.process.pid
    beta.data("cancel", ids=[theirs])
    assert beta.wait_task(theirs, "cancelled")["error_type"] == models.CANCELLED


def test_sigterm_puts_running_tasks_back_and_gives_the_lease_up(
    on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    d = on_postgres(shutdown_grace=0.2).start()
    task_id = d.submit("GATED", payload={"ready_file": str(tmp_path / "ready"), "gate_file": str(tmp_path / "gate")})
    wait_for((tmp_path / "ready").exists)
    assert d.stop(signal.SIGTERM) == 0
    assert lease_of(url, "alpha") is None
    d.start()
    assert d.data("restarts") == []  # put back at the stop: nothing was interrupted
    (tmp_path / "gate").touch()
    done = d.wait_task(task_id, "completed", timeout=30)
    assert (done["attempt"], done["retry_count"]) == (2, 0)


def test_a_second_live_supervisor_of_the_same_name_is_refused_in_one_line(
    on_postgres: Callable[..., Daemon], url: str
) -> None:
    first = on_postgres("alpha").start()
    second = on_postgres("alpha-again", supervisor="alpha")
    second.start(wait=False)
    assert second.process is not None and second.process.wait(30) == 1
    lines = second.output.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fredica: another supervisor named 'alpha' (host {lease_of(url, 'alpha').host}, pid {first.process.pid})"
        " holds a lease on this database"), lines
    assert not second.socket.exists()  # refused before it bound anything
    assert first.request("status")["ok"]


def test_reads_answer_from_postgresql_with_no_daemon_running(on_postgres: Callable[..., Daemon], url: str) -> None:
    d = on_postgres().start()
    task_id = d.submit("ECHO", payload={"y": 2})
    d.wait_task(task_id, "completed")
    assert d.stop() == 0
    listed = fredica(d, "ls", "--json")
    assert listed.exit_code == 0 and listed.stderr.strip() == f"daemon not running: read from {url}", listed.output
    assert [(t["id"], t["supervisor"]) for t in json.loads(listed.stdout)] == [(task_id, "alpha")]
    status = fredica(d, "status", "--json")  # 3: what a script asks status for, said from the database
    assert status.exit_code == 3 and json.loads(status.stdout)["counts"]["completed"] == 1


def test_a_server_outage_is_ridden_out_and_requests_meanwhile_get_one_line(
    on_postgres: Callable[..., Daemon], postgres_cluster: Cluster, tmp_path: Path
) -> None:
    d = on_postgres().start()
    gate = {"ready_file": str(tmp_path / "ready"), "gate_file": str(tmp_path / "gate")}
    running = d.submit("GATED", payload=gate)
    wait_for((tmp_path / "ready").exists)
    postgres_cluster.stop_server()
    try:
        refusal = fredica(d, "submit", "ECHO")
        assert refusal.exit_code == 1
        assert refusal.stderr.strip() == "error: the database is unavailable (connection lost): nothing was changed"
        (tmp_path / "gate").touch()  # the attempt ends while its outcome cannot be written: kept in memory
        with client.Client(d.config) as fredica_client:
            with pytest.raises(DatabaseFault, match="^the database is unavailable"):
                fredica_client.submit("ECHO")
        assert d.process is not None and d.process.poll() is None
    finally:
        postgres_cluster.start_server()
    after = wait_for(lambda: _submitted(d), timeout=30)
    assert d.wait_task(after, "completed")["status"] == "completed"
    assert d.wait_task(running, "completed")["result"]["blob"] == ""
    events = [e["event"] for e in d.log_events()]
    assert "database_fault" in events and "database_reconnected" in events and "database_fault_ended" in events


def _submitted(d: Daemon) -> str | None:
    reply = d.request("submit", tasks=[{"type": "ECHO"}])
    return reply["data"]["tasks"][0]["id"] if reply["ok"] else None


def test_a_sqlite_daemon_never_loads_the_postgresql_driver(tmp_path: Path) -> None:
    # A SQLite file's supervisor, its recovery, a claim and an attempt's writes, in a process of
    # their own: psycopg costs ~30 ms of import that SQLite users must never pay.
    script = f"""
import os, sys, time
from daemon import config, recovery
from daemon.store import attempts, tasks
from daemon.supervisor import Supervisor
from daemon.submission import TaskSpec
settings = config.from_mapping({{"daemon": {{"database": "q.db", "socket": "s.sock", "log_dir": "logs"}},
                                 "executors": {{"ECHO": "tests.sample_executors:Echo"}}}},
                               source=config.Path({str(tmp_path / "c.toml")!r}))
sup = Supervisor(settings)
now = time.time()
recovery.recover(sup.conn, now=now)
tasks.submit(sup.conn, [TaskSpec(type="ECHO")], now=now)
(claimed,) = tasks.claim_ready(sup.conn, now, 1, supervisor=settings.name)
started = tasks.start(sup.conn, claimed.id, now=now, known=claimed)
attempts.heartbeat(sup.conn, [tasks.AttemptRef.of(started)], now)
tasks.complete(sup.conn, claimed.id, {{}}, now=now, known=started)
assert sup.lease is None
loaded = sorted(m for m in sys.modules if m.startswith("psycopg"))
print(loaded, flush=True)
os._exit(1 if loaded else 0)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip().splitlines()[-1]) == (0, "[]"), done.stderr


@pytest.mark.parametrize("sqlstate, kind", [
    ("08006", faults.Kind.UNAVAILABLE), ("08003", faults.Kind.UNAVAILABLE), ("57P01", faults.Kind.UNAVAILABLE),
    ("57P03", faults.Kind.UNAVAILABLE), ("53100", faults.Kind.FULL), ("58030", faults.Kind.IO),
    ("25006", faults.Kind.READ_ONLY), ("XX001", faults.Kind.CORRUPT), ("40P01", faults.Kind.LOCKED),
    ("23505", None), ("42P01", None),  # a unique index, a missing table: a bug or a refusal, not a fault
])
def test_postgresql_errors_are_known_by_their_sqlstate(sqlstate: str, kind: faults.Kind | None) -> None:
    error = sqlite3.OperationalError("from the server")
    error.sqlstate = sqlstate  # type: ignore[attr-defined]
    assert faults.classify(error) is kind


def lose_session(postgres_cluster: Cluster, url: str, conn: sqlite3.Connection) -> sqlite3.OperationalError:
    """The server ends `conn`'s session: the error its next statement meets."""
    postgres_cluster.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                           f"'{url.split('?')[0].rsplit('/', 1)[1]}'")
    with pytest.raises(sqlite3.OperationalError) as lost:
        conn.execute("SELECT 1")
    return lost.value


def test_a_server_that_ends_the_session_makes_a_lost_connection(postgres_cluster: Cluster, url: str) -> None:
    conn = db.open_database(url)
    try:
        lost = lose_session(postgres_cluster, url, conn)
        assert faults.classify(lost) is faults.Kind.UNAVAILABLE and db.is_lost(conn)
        # A connect slower than `connecting.FIRST_WAIT` (a loaded machine) is looked at again.
        wait_for(lambda: _reconnected(conn), 30)
        assert not db.is_lost(conn) and conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        conn.close()


def _sessions_of(url: str, *, idle: bool = False) -> list[int]:
    """The server processes of every session of `url`'s database but the caller's own; with
    `idle`, none unless every one is between statements, outside a transaction."""
    conn = db.connect_read_only(url)
    try:
        rows = conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        ).fetchall()
    finally:
        conn.close()
    if idle and any(row[1] != "idle" for row in rows):
        return []
    return [row[0] for row in rows]


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """Those server processes stopped (SIGSTOP), as a frozen host or a network dropping every
    packet leaves a session: the connection open, no answer coming. Thawed at the end."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _statement_in_a_thread(conn: sqlite3.Connection, sql: str) -> BaseException | None:
    """Run `sql` on another thread; what it raised (None: it succeeded). The test fails, rather
    than hang, if it is still waiting after 30 s."""
    outcome: list[BaseException | None] = []

    def statement() -> None:
        try:
            conn.execute(sql)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (looked at by the caller)
            outcome.append(exc)

    waiting = threading.Thread(target=statement, daemon=True)
    waiting.start()
    waiting.join(30)  # without the watch: libpq waits as long as no answer comes
    assert not waiting.is_alive(), f"{sql!r} still waits for a server that does not answer"
    return outcome[0]


@contextlib.contextmanager
def answer_limit(seconds: float) -> Iterator[None]:
    """This process's sessions wait `seconds` for an answer (the daemon's database_answer_timeout)."""
    from daemon.store.postgres import answer_watch

    before, answer_watch.WATCH.limit = answer_watch.WATCH.limit, seconds
    try:
        yield
    finally:
        answer_watch.WATCH.limit = before


def test_a_session_whose_server_stops_answering_is_given_up_as_lost(url: str) -> None:
    conn = db.open_database(url)
    try:
        server_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with frozen([server_pid]), answer_limit(0.5):
            lost = _statement_in_a_thread(conn, "SELECT 1")
        assert isinstance(lost, sqlite3.OperationalError), lost
        assert str(lost) == "cannot reach the database: the server did not answer within 0.5 s", lost
        assert faults.classify(lost) is faults.Kind.UNAVAILABLE and db.is_lost(conn)
        wait_for(lambda: _reconnected(conn), 30)
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        conn.close()


@pytest.mark.parametrize("pooled", [False, True])
def test_a_lost_session_counts_as_ended_only_once_gone_from_the_server(url: str, pooled: bool) -> None:
    # A frozen server process may still run the COMMIT in its buffer once it runs again: until it
    # is gone, what its COMMIT did is not known. Behind a pooler (notify = false) the server
    # process is not the session's, and none is waited for.
    conn = db.open_database(url)
    conn.notify_wakeups = not pooled  # type: ignore[attr-defined]  # as the supervisor sets it
    try:
        server_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with frozen([server_pid]):
            with answer_limit(0.5):
                assert isinstance(_statement_in_a_thread(conn, "SELECT 1"), sqlite3.OperationalError)
            wait_for(lambda: _reconnected(conn), 30)
            assert db.lost_sessions_ended(conn) is pooled  # still on the server, stopped
        if not pooled:  # its end was asked for: it goes as soon as it runs again
            wait_for(lambda: db.lost_sessions_ended(conn), 30)
    finally:
        conn.close()


@pytest.mark.parametrize("in_url", [False, True])
def test_a_connect_waits_for_its_timeout_and_one_the_url_sets_is_kept(url: str, in_url: bool) -> None:
    from daemon.store.postgres import connection

    raw = connection._raw_connection(url + ("&connect_timeout=7" if in_url else ""), read_only=True)
    try:
        assert f"connect_timeout={7 if in_url else 60}" in raw.info.dsn, raw.info.dsn
    finally:
        raw.close()


def test_a_session_cut_off_by_the_network_is_given_up_and_its_transaction_ended(
    postgres_cluster: Cluster, url: str, tmp_path: Path
) -> None:
    # A network that drops every packet: the server's session lives on, in its transaction, with
    # its row locks, and never hears that its client has gone. Once the client has a new session
    # it ends the old one: otherwise every writer of those rows (the next heartbeat, the lease)
    # would wait for it until the server's keepalives give up, hours by default.
    import psycopg

    proxy = StallingProxy(tmp_path, Path(postgres_cluster.socket_dir))
    conn = db.open_database(proxy.url(url))
    try:
        conn.execute("INSERT INTO queue_state (name, paused, changed_at) VALUES ('q', 0, 0)")
        conn.execute("BEGIN")
        conn.execute("UPDATE queue_state SET paused = 1 WHERE name = 'q'")  # the row is locked
        proxy.cut_all()
        with answer_limit(0.5):
            lost = _statement_in_a_thread(conn, "SELECT 1")
            assert isinstance(lost, sqlite3.OperationalError) and "did not answer within 0.5 s" in str(lost), lost
            wait_for(lambda: _reconnected(conn), 30)
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SET lock_timeout = '20s'")  # an error, not a hang, if the old session lives on
            other.execute("UPDATE queue_state SET paused = 2 WHERE name = 'q'")
        assert conn.execute("SELECT paused FROM queue_state WHERE name = 'q'").fetchone()[0] == 2
    finally:
        conn.close()
        proxy.close()


def _reconnected(conn: sqlite3.Connection) -> bool:
    try:
        db.reconnect(conn)
    except sqlite3.OperationalError:
        return False
    return True


def test_a_server_that_stops_answering_is_ridden_out_and_tasks_go_on_meanwhile(
    on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    d = on_postgres(database_answer_timeout=1).start()
    gate = {"ready_file": str(tmp_path / "ready"), "gate_file": str(tmp_path / "gate")}
    running = d.submit("GATED", payload=gate)
    wait_for((tmp_path / "ready").exists)

    def given_up() -> list[dict[str, object]]:
        return [e for e in d.log_events()
                if e["event"] == "database_fault" and "did not answer within 1 s" in str(e.get("error"))]

    before = len(given_up())
    # Frozen between statements (a process stopped in the middle of one could hold the server's
    # internal locks, and stall every session of the cluster): the loop's session, its readers'
    # and its listener's.
    sessions = wait_for(lambda: _sessions_of(url, idle=True), timeout=30)
    with frozen(sessions):
        # The loop's next round trip (the look at its running attempt's row, within a second)
        # waits in vain: given up after 1 s, the outage is ridden out on new sessions.
        wait_for(lambda: len(given_up()) > before, timeout=30)
        # While the old sessions still hang, the daemon works: a task submitted now runs, the one
        # running ends and is recorded, and reads answer.
        after = wait_for(lambda: _submitted(d), timeout=30)
        assert d.wait_task(after, "completed")["status"] == "completed"
        (tmp_path / "gate").touch()
        assert d.wait_task(running, "completed")["status"] == "completed"
        assert "completed" in ok(d, "status")
    assert d.process is not None and d.process.poll() is None


def _losing_a_commit_answer(conn: sqlite3.Connection, carries: Callable[[str], bool]) -> list[str]:
    """Make the first COMMIT of a transaction with a statement that `carries` says so reach the
    server and commit, and then lose its answer with the connection. The list it returns gets
    that COMMIT once it has happened."""
    import psycopg

    real_send = conn._send  # type: ignore[attr-defined]
    sent: list[str] = []  # this transaction's statements
    lost: list[str] = []

    def send(text: str, params: object) -> object:
        answer = real_send(text, params)
        sent.append(text)
        if text == "COMMIT":
            marked = any(carries(earlier) for earlier in sent)
            sent.clear()
            if marked and not lost:
                lost.append(text)
                conn.raw.close()  # type: ignore[attr-defined]  # committed; its answer goes with the connection
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        return answer

    conn._send = send  # type: ignore[attr-defined]
    return lost


def _in_process_supervisor(url: str, tmp_path: Path, executors: dict[str, str], **options: Any) -> Any:
    from daemon.config import Settings
    from daemon.supervisor import Supervisor

    return Supervisor(Settings(
        database=url, name="alpha", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
        executors=executors, notify=False, warm_spare=False, **options,
    ))


@pytest.mark.parametrize("meanwhile", ["nothing", "cancelled on another host"])
def test_a_start_whose_commit_answer_was_lost_is_put_back_and_runs_once(url: str, tmp_path: Path, meanwhile: str) -> None:
    """A tick claims and starts a task, and its COMMIT reaches the server, but the answer is lost
    with the connection: the loop takes the tick for rolled back, and the task never goes to a
    process. After the reconnect the loop puts the row of that attempt back: it then runs, once.
    A row that moved on meanwhile (cancelled on another host) is left as it is."""
    from daemon.models import TaskStatus
    from daemon.submission import parse_spec

    sup = _in_process_supervisor(url, tmp_path, {"PRINT": "tests.sample_executors:Printer"})
    lost = _losing_a_commit_answer(sup.conn, lambda sql: sql.startswith("UPDATE task") and "executor_pid" in sql)
    other = db.open_database(url)

    def status() -> str:
        return other.execute("SELECT status FROM task WHERE id = ?", (task_id,)).fetchone()[0]

    try:
        task_id = sup.submit([parse_spec({"type": "PRINT"})]).tasks[0].id
        wait_for(lambda: sup.tick() is not None and lost, timeout=30)
        assert sup.fault is not None and task_id not in sup.running  # taken for rolled back
        assert status() == "running" and [t.id for t in sup.in_doubt] == [task_id]
        if meanwhile == "cancelled on another host":
            tasks.transition(other, task_id, TaskStatus.CANCELLED, now=time.time(), expect=[TaskStatus.RUNNING])
        wait_for(lambda: sup.tick() is not None and sup.fault is None and not sup.in_doubt, timeout=30)
        attempt = other.execute("SELECT attempt FROM task WHERE id = ?", (task_id,)).fetchone()[0]
        task_log = tmp_path / "logs" / "tasks" / f"{task_id}.log"
        if meanwhile == "cancelled on another host":
            assert (status(), attempt) == ("cancelled", 1)  # left as it is: never run
            assert not task_log.exists() or "hello on stdout" not in task_log.read_text()
        else:
            wait_for(lambda: sup.tick() is not None and status() == "completed", timeout=30)
            attempt = other.execute("SELECT attempt FROM task WHERE id = ?", (task_id,)).fetchone()[0]
            assert attempt == 2  # the claim in doubt, and the one after it was put back
            assert task_log.read_text().count("hello on stdout") == 1  # it ran once
    finally:
        other.close()
        sup.idle.dismiss_all()
        sup.conn.close()


def test_an_ending_whose_commit_answer_was_lost_has_its_hook_run_once(url: str, tmp_path: Path) -> None:
    """The COMMIT that records a failure is made, its answer lost: recording the attempt again
    finds the row failed already, and the executor's on_task_failed, which was to follow that
    commit, runs then, once."""
    from daemon.submission import parse_spec

    sup = _in_process_supervisor(url, tmp_path, {"RECORDING_RAISE": "tests.hook_executors:RecordingRaise"})
    lost = _losing_a_commit_answer(sup.conn, lambda sql: sql.startswith("UPDATE task") and "error_type" in sql)
    hook_file = tmp_path / "hook.jsonl"
    try:
        task_id = sup.submit([parse_spec({"type": "RECORDING_RAISE", "payload": {"hook_file": str(hook_file)}})]).tasks[0].id
        wait_for(lambda: sup.tick() is not None and lost, timeout=30)
        assert sup.fault is not None and not hook_file.exists()  # taken for rolled back: no hook yet
        wait_for(lambda: sup.tick() is not None and sup.fault is None and hook_file.exists(), timeout=30)
        sup.tick()
        lines = [json.loads(line) for line in hook_file.read_text().splitlines()]
        assert [(line["task_id"], line["status"]) for line in lines] == [(task_id, "failed")]
        assert tasks.get(sup.conn, task_id).status.value == "failed"
    finally:
        sup.idle.dismiss_all()
        sup.conn.close()


def test_a_start_sent_ahead_recorded_by_a_commit_in_doubt_runs_on(url: str, tmp_path: Path) -> None:
    """A task sent ahead starts in its process, and the COMMIT that records its start (with the
    ending of the task before it) is made but its answer lost. Recording the start again finds the
    row running at that very attempt, in that very process: the task runs on and is recorded, not
    taken for cancelled. Each runs once."""
    from daemon.queues import QueueConfig
    from daemon.submission import parse_spec

    sup = _in_process_supervisor(url, tmp_path, {"TALLY": "tests.prefetch_executors:Tally"}, max_workers=1,
                                 tasks_per_process=50, queues={"default": QueueConfig("default", 1, prefetch=1)})
    tally, go, go_on = tmp_path / "tally", tmp_path / "go", tmp_path / "go on"
    try:
        first = sup.submit([parse_spec({"type": "TALLY", "payload": {"tally": str(tally), "go_file": str(go)}})])
        second = sup.submit([parse_spec({"type": "TALLY", "payload": {"tally": str(tally), "go_file": str(go_on)}})])
        first_id, second_id = first.tasks[0].id, second.tasks[0].id
        wait_for(lambda: sup.tick() is not None and first_id in sup.running and second_id in sup.ahead, timeout=30)
        lost = _losing_a_commit_answer(sup.conn, lambda sql: sql.startswith("UPDATE task") and "executor_pid" in sql)
        go.touch()  # the first ends, and the second starts in the same process
        wait_for(lambda: sup.tick() is not None and lost, timeout=30)
        other = db.connect_read_only(url)
        try:
            assert sup.fault is not None and tasks.get(other, second_id).status.value == "running"  # it was made
            wait_for(lambda: sup.tick() is not None and sup.fault is None and not sup._starts, timeout=30)
            go_on.touch()
            wait_for(lambda: sup.tick() is not None
                     and all(tasks.get(other, t).status.value == "completed" for t in (first_id, second_id)), timeout=30)
        finally:
            other.close()
        assert sorted(line.split()[0] for line in tally.read_text().splitlines()) == sorted([first_id, second_id])
    finally:
        sup.idle.dismiss_all()
        sup.conn.close()


def test_a_commit_whose_connection_is_lost_is_refused_as_in_doubt_not_as_undone(
    postgres_cluster: Cluster, url: str
) -> None:
    conn = db.open_database(url)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO queue_state (name, paused, changed_at) VALUES ('q', 0, 0)")
        lost_before_commit = lose_session(postgres_cluster, url, conn)  # a statement before the COMMIT
        assert not getattr(lost_before_commit, "in_doubt", False)
        assert str(faults.refusal(faults.Kind.UNAVAILABLE, lost_before_commit)).endswith("nothing was changed")
        wait_for(lambda: _reconnected(conn), 30)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO queue_state (name, paused, changed_at) VALUES ('q', 0, 0)")
        postgres_cluster.admin(f"SELECT pg_terminate_backend({conn.raw.info.backend_pid})")  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.OperationalError) as lost:
            conn.execute("COMMIT")
        assert getattr(lost.value, "in_doubt", False) and faults.classify(lost.value) is faults.Kind.UNAVAILABLE
        assert str(faults.refusal(faults.Kind.UNAVAILABLE, lost.value)) == (
            "the connection to the database was lost as the change was being committed: it may have been made; "
            "look before asking again")
    finally:
        conn.close()


@pytest.fixture
def held_reconnect(
    postgres_cluster: Cluster, url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[sqlite3.Connection, HeldConnect]]:
    """A connection whose session the server ended, and whose reconnect meets a host that does
    not answer (libpq would wait for its connect_timeout): until the test's `answer`."""
    from daemon.store.postgres import connection

    conn = db.open_database(url)
    lose_session(postgres_cluster, url, conn)
    held = HeldConnect(connection._raw_connection)
    monkeypatch.setattr(connection, "_raw_connection", held)
    yield conn, held
    held.answer.set()  # whatever the test left waiting ends
    conn.close()


def test_a_reconnect_to_a_server_that_does_not_answer_never_holds_up_its_caller(
    held_reconnect: tuple[sqlite3.Connection, HeldConnect],
) -> None:
    conn, held = held_reconnect
    for _ in range(3):  # each look returns while the one connect is under way
        with pytest.raises(sqlite3.OperationalError, match="still connecting") as still:
            db.reconnect(conn)
        assert faults.classify(still.value) is faults.Kind.UNAVAILABLE and db.is_lost(conn)
    held.answer.set()

    def reconnected() -> bool:
        try:
            db.reconnect(conn)
        except sqlite3.OperationalError:
            return False
        return True

    wait_for(reconnected, 30)
    assert held.calls == 1  # one connect, however many looks
    assert not db.is_lost(conn) and conn.execute("SELECT 1").fetchone()[0] == 1


def test_a_connection_closed_while_it_reconnects_closes_the_session_that_comes_late(
    held_reconnect: tuple[sqlite3.Connection, HeldConnect],
) -> None:
    conn, held = held_reconnect
    with pytest.raises(sqlite3.OperationalError, match="still connecting"):
        db.reconnect(conn)
    conn.close()
    held.answer.set()
    wait_for(lambda: held.made and held.made[0].closed, 30)  # no session left open on the server


def test_export_of_a_postgresql_queue_reads_it_with_the_daemon_up_or_down(on_postgres: Callable[..., Daemon]) -> None:
    d = on_postgres().start()
    task_id = ok(d, "submit", "ECHO", "--payload", '{"x": 1}').strip()
    d.wait_task(task_id, "completed")
    up = fredica(d, "export")
    assert up.exit_code == 0 and up.stderr == "1 tasks exported\n", up.output
    [row] = [json.loads(line) for line in up.stdout.splitlines()]
    assert (row["id"], row["status"], row["result"]["echo"]) == (task_id, "completed", {"x": 1})
    d.stop()
    down = fredica(d, "export")
    assert (down.exit_code, down.stdout) == (0, up.stdout)


def test_the_http_token_of_a_postgresql_daemon_is_made_in_its_state_directory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside a SQLite file its directory exists; a URL names none, and the state directory that
    # holds the token by default may not exist yet on this host.
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_STATE_HOME", "STATE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    d = Daemon(tmp_path / "d", database=url, name="web", extra_toml=f'[http]\nlisten = "127.0.0.1:{free_port()}"')
    try:
        d.start()
        token_file = home / ".local" / "state" / "fredica" / "http-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token_file.read_text().strip()) >= 32
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    finally:
        d.kill_if_running()


def test_a_task_another_host_submits_wakes_the_supervisor_at_once(
    on_postgres: Callable[..., Daemon], url: str
) -> None:
    # Every timer of the loop is far away: only the NOTIFY of the other host's commit can wake
    # it within the wait below (without it, the next poll is a minute away).
    d = on_postgres("alpha", idle_poll_interval=60, poll_interval=60, heartbeat_interval=30,
                    lease_timeout=90).start()
    from daemon.store import tasks as task_store
    from daemon.submission import TaskSpec

    other_host = db.open_database(url)
    try:
        other_host.notify_wakeups = True  # type: ignore[attr-defined]  # as a supervisor's connection
        [task] = task_store.submit(other_host, [TaskSpec("ECHO", payload={"x": 2})], now=time.time()).tasks
    finally:
        other_host.close()
    # Read in the database, not asked of the daemon: a request would wake its loop itself.
    reader = db.connect_read_only(url)
    try:
        def completed() -> bool:
            return task_store.get(reader, task.id).status is models.TaskStatus.COMPLETED

        wait_for(completed, timeout=15, interval=0.05)
    finally:
        reader.close()


def test_a_cancel_given_on_another_host_stops_the_attempt_at_once_not_at_the_next_heartbeat(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    slow = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}
    alpha = on_postgres("alpha", **slow).start()
    task_id = alpha.submit("HANG", payload=hang(tmp_path, "h"))
    wait_for((tmp_path / "h.ready").exists, timeout=20)  # alpha runs it
    beta = on_postgres("beta", **slow).start()
    ok(beta, "cancel", task_id)
    # Its heartbeat is 30 s away: only beta's wake-up makes alpha look at its row now.
    wait_for(lambda: any(e["event"] == "attempt_no_longer_current" and e["task_id"] == task_id
                         for e in alpha.log_events()), timeout=15)
    assert alpha.wait_task(task_id, "cancelled")["supervisor"] == "alpha"


def test_status_shows_every_supervisor_with_its_host_lease_age_and_busy_workers(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    alpha = on_postgres("alpha").start()
    task_id = alpha.submit("HANG", payload=hang(tmp_path, "h"))
    wait_for((tmp_path / "h.ready").exists, timeout=20)
    beta = on_postgres("beta").start()
    shown = json.loads(ok(beta, "status", "--json"))["supervisors"]  # asked of the other host
    assert [(s["name"], s["pid"], s["busy"], s["expired"]) for s in shown] == [
        ("alpha", alpha.process.pid, 1, False), ("beta", beta.process.pid, 0, False)]
    assert all(s["host"] and 0 <= s["lease_age"] < s["lease_timeout"] for s in shown)
    lines = ok(beta, "status").splitlines()
    assert any(line.startswith("supervisor alpha") and f"pid {alpha.process.pid}, 1 busy, lease " in line
               for line in lines), lines
    alpha.data("cancel", ids=[task_id])
