"""`fredica db copy SQLITE_FILE POSTGRES_URL` (SPEC §16): a real SQLite queue, made by the store's
own functions, copied into the real PostgreSQL server; every row read back equal through the
store on both backends, fresh keys after the copy, and each refusal writing nothing."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner, Result

from daemon import cli, service
from daemon.models import TaskStatus
from daemon.store import attempts, boots, cleaning, db, migrations, queues, restarts, runs, schema, task_reads, tasks, waiting
from daemon.submission import parse_spec
from tests import store_steps
from tests.postgres_cluster import Cluster

T0 = 1_700_000_000.0


def copy(*args: str | Path) -> Result:
    return CliRunner().invoke(cli.main, ["db", "copy", *map(str, args)])


def submit(conn: sqlite3.Connection, *specs: dict[str, Any], now: float = T0) -> list[str]:
    """One run of `specs`; the new tasks' ids."""
    submission = tasks.submit(conn, [parse_spec({"type": "ECHO", **spec}) for spec in specs], now=now)
    return [task.id for task in submission.tasks]


def start_next(conn: sqlite3.Connection, now: float) -> str:
    task = store_steps.claim_next(conn, now)
    assert task is not None
    tasks.start(conn, task.id, now=now, executor_pid=4242, executor_started_at=now - 0.25, is_pausable=True)
    return task.id


def make_queue(path: Path) -> dict[str, Any]:
    """A SQLite queue with something in every table: tasks completed with results, failed (its
    dependents cancelled), pending behind dependencies, held, waiting out a retry delay, left
    claimed and running, restart-log entries, a paused queue, a boot time; and a run cleaned away
    after the rest, so that the highest seq SQLite handed out is no longer in the table."""
    conn = db.open_database(path)
    made: dict[str, Any] = {}
    first, second, third = submit(
        conn,
        {"key": "a", "payload": {"n": 1, "text": "naïve ünïcode \\ % ? :name"}, "priority": 5, "material_id": "m-1"},
        {"key": "b", "depends_on": ["a"], "idempotency_key": "k-b", "timeout": 12.5},
        {"key": "c", "depends_on": ["b"], "max_retries": 2},
    )
    assert start_next(conn, T0 + 1) == first
    tasks.complete(conn, first, {"out": [1, 2.5, None], "ok": True}, now=T0 + 2.125)
    doomed, dependent = submit(conn, {"key": "x", "priority": 9}, {"key": "y", "depends_on": ["x"]}, now=T0 + 3)
    assert start_next(conn, T0 + 4) == doomed  # before `second`: a higher priority
    tasks.fail(conn, doomed, error="boom\nsecond line", error_type="EXCEPTION", now=T0 + 5)
    [held] = submit(conn, {"hold": True, "queue": "media"}, now=T0 + 6)
    [held_too] = submit(conn, {}, now=T0 + 6.5)
    waiting.hold(conn, [held_too])
    [retried] = submit(conn, {"max_retries": 3, "priority": 20}, now=T0 + 7)
    assert start_next(conn, T0 + 8) == retried
    tasks.retry(conn, retried, error="flaky", error_type="EXCEPTION", not_before=T0 + 60, now=T0 + 9)
    [running, claimed] = submit(conn, {"priority": 30}, {"priority": 29}, now=T0 + 10)
    assert start_next(conn, T0 + 11) == running
    attempts.record_progress(conn, [(running, 42, "downloading")])
    assert store_steps.claim_next(conn, T0 + 12).id == claimed  # type: ignore[union-attr]
    restarts.record(conn, "session-1", [tasks.get(conn, running)], now=T0 + 13)
    restarts.record(conn, "session-2", [tasks.get(conn, running), tasks.get(conn, claimed)], now=T0 + 14)
    queues.set_paused(conn, "media", True, now=T0 + 15)
    boots.boot_time(conn, "boot-1", T0 - 3600.5)
    [cleaned] = submit(conn, {"priority": 99}, now=T0 + 16)
    assert start_next(conn, T0 + 17) == cleaned
    tasks.complete(conn, cleaned, {}, now=T0 + 18)
    assert cleaning.remove_chunk(conn, cutoff=T0 + 18.5, status="completed").task_ids == (cleaned,)
    made.update(first=first, second=second, third=third, doomed=doomed, dependent=dependent, held=held,
                retried=retried, running=running, claimed=claimed, cleaned=cleaned)
    made["highest_seq"] = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'task'").fetchone()[0]
    conn.close()
    return made


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "queue.db"
    return path, make_queue(path)


@pytest.fixture
def target(postgres_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty PostgreSQL database (no schema at all: the copy migrates it)."""
    url = postgres_cluster.clone(request.node.name, template="template0")
    yield url
    postgres_cluster.drop(url)


def stored(conn: sqlite3.Connection) -> dict[str, Any]:
    """Everything the store reads back, the same way on both backends."""
    every = task_reads.list_tasks(conn)
    return {
        "tasks": sorted(every, key=lambda task: task.seq),
        "runs": runs.list_runs(conn),
        "restart log": restarts.list_entries(conn, include_resolved=True),
        "paused queues": queues.paused(conn),
        "counts": task_reads.count_by_status(conn),
        "downstream": {task.id: [t.id for t in tasks.downstream(conn, task.id)] for task in every},
        "next ready at": tasks.next_ready_at(conn),
    }


def table_rows(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table the schema describes, in one order on both backends."""
    names = [re.match(r"\s*CREATE TABLE (\w+)", s).group(1) for s in schema.SQLITE if "CREATE TABLE" in s]  # type: ignore[union-attr]
    return {name: sorted(tuple(row) for row in conn.execute(f"SELECT * FROM {name}")) for name in names}


def fingerprint(path: Path) -> dict[str, str]:
    """The database file and its companions, as bytes: a read-only copy changes none of them."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + "*"))}


def tables_of(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
        )]


def test_every_row_is_copied_and_reads_back_equal(source: tuple[Path, dict[str, Any]], target: str) -> None:
    path, made = source
    before = fingerprint(path)

    result = copy(path, target)

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("copied 10 tasks in 6 runs (")
    assert "3 restart-log entries" in result.stdout and result.stdout.count("\n") == 1
    assert fingerprint(path) == before  # opened read-only: not a byte changed, nothing left beside it
    with db.connect_read_only(path) as sqlite_conn, db.open_database(target) as pg_conn:
        assert stored(pg_conn) == stored(sqlite_conn)
        rows = table_rows(sqlite_conn)
        # Every table had rows, but the leases of live supervisors: a SQLite queue has none to copy.
        assert [name for name, found in rows.items() if not found] == ["supervisor"]
        del rows["supervisor"]
        copied_rows = table_rows(pg_conn)
        assert copied_rows.pop("supervisor") == [] and copied_rows == rows
        copied = {task.id: task for task in task_reads.list_tasks(pg_conn)}
    # What each was left as, copied as it is (the PostgreSQL daemon's recovery deals with these).
    assert copied[made["first"]].result == {"out": [1, 2.5, None], "ok": True}
    assert copied[made["doomed"]].status is TaskStatus.FAILED
    assert copied[made["dependent"]].status is TaskStatus.CANCELLED
    assert copied[made["running"]].status is TaskStatus.RUNNING and copied[made["running"]].progress == 42
    assert copied[made["claimed"]].status is TaskStatus.CLAIMED
    assert copied[made["retried"]].not_before == T0 + 60


def test_the_copied_tables_have_statistics_for_the_planner(source: tuple[Path, dict[str, Any]], target: str) -> None:
    # Never analyzed, a table is planned for as nearly empty until autovacuum comes round.
    path, _ = source
    assert copy(path, target).exit_code == 0
    with db.connect_read_only(target) as conn:
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'task'").fetchone()[0] == 10


def test_tasks_left_in_flight_are_copied_as_claimed_by_no_supervisor(
    source: tuple[Path, dict[str, Any]], target: str
) -> None:
    # The SQLite daemon that claimed them holds no lease on PostgreSQL: named, they would never be
    # rescued, nor taken by a start's recovery (it takes its own and the unnamed). Ended ones keep
    # the name of who ran them.
    path, made = source
    with db.open_database(path) as conn:
        conn.execute("UPDATE task SET supervisor = 'old-host' WHERE id IN (?, ?, ?)",
                     (made["running"], made["claimed"], made["first"]))
    assert copy(path, target).exit_code == 0
    with db.open_database(target) as conn:
        copied = {task.id: task for task in task_reads.list_tasks(conn)}
    assert copied[made["running"]].supervisor is None and copied[made["claimed"]].supervisor is None
    assert copied[made["first"]].supervisor == "old-host"


def test_new_rows_on_the_copy_get_fresh_keys(source: tuple[Path, dict[str, Any]], target: str) -> None:
    path, made = source
    assert copy(path, target).exit_code == 0
    with db.open_database(target) as conn:
        old = {task.id: task.seq for task in task_reads.list_tasks(conn)}
        [new] = submit(conn, {"depends_on": [made["second"]]}, now=T0 + 100)
        new_seq = tasks.get(conn, new).seq
        assert new_seq == made["highest_seq"] + 1  # not even the seq of the task cleaned away
        assert new_seq > max(old.values())
        assert [t.id for t in tasks.downstream(conn, made["second"])] == [made["third"], new]
        entry_ids = [entry.id for entry in restarts.list_entries(conn, include_resolved=True)]
        restarts.record(conn, "session-3", [tasks.get(conn, made["running"])], now=T0 + 101)
        assert max(e.id for e in restarts.list_entries(conn, include_resolved=True)) == max(entry_ids) + 1
        # The copied queue goes on: the dependency completed before the copy still counts.
        assert store_steps.claim_next(conn, T0 + 30).id == made["second"]  # type: ignore[union-attr]


def test_a_target_that_holds_tasks_is_refused_untouched(
    source: tuple[Path, dict[str, Any]], postgres_cluster: Cluster
) -> None:
    path, _ = source
    url = postgres_cluster.clone("copy_holds_tasks")  # migrated
    with db.open_database(url) as conn:
        [kept] = submit(conn, {})
        rows_before = table_rows(conn)

    result = copy(path, url)

    assert result.exit_code == 1
    assert re.fullmatch(r"error: the database \S+ already holds 1 task: .*\(nothing was written\)\n", result.stderr)
    with db.open_database(url) as conn:
        assert table_rows(conn) == rows_before
    postgres_cluster.drop(url)


def test_a_target_with_other_rows_is_refused_too(source: tuple[Path, dict[str, Any]], postgres_cluster: Cluster) -> None:
    path, _ = source
    url = postgres_cluster.clone("copy_holds_boot")
    with db.open_database(url) as conn:
        boots.boot_time(conn, "another-host", T0)

    result = copy(path, url)

    assert result.exit_code == 1 and "already holds 1 row in boot" in result.stderr
    with db.open_database(url) as conn:
        assert task_reads.list_tasks(conn) == [] and boots.boot_time(conn, "another-host", 0.0) == T0
    postgres_cluster.drop(url)


def test_a_file_a_daemon_owns_is_refused(source: tuple[Path, dict[str, Any]], target: str) -> None:
    path, _ = source
    lock = service.DatabaseLock(path)
    lock.acquire()  # what a running daemon holds
    try:
        result = copy(path, target)
    finally:
        lock.release()

    assert result.exit_code == 1
    assert re.fullmatch(rf"error: a fredica daemon \(pid \d+\) owns {re.escape(str(path))}: stop it first.*\n",
                        result.stderr)
    assert tables_of(target) == []  # not even migrated
    assert copy(path, target).exit_code == 0  # once it has stopped (the lock file stays behind)


def test_an_older_schema_is_refused_with_what_to_do(tmp_path: Path, target: str) -> None:
    path = tmp_path / "old.db"
    conn = db.connect(path)
    migrations.migrate(conn, target=migrations.LATEST - 1)
    conn.close()

    result = copy(path, target)

    assert result.exit_code == 1
    assert result.stderr == (
        f"error: the database {path} has schema version {migrations.LATEST - 1}, older than this "
        f"fredica-worker's ({migrations.LATEST}): start `fredica daemon` on it once (it migrates at start), "
        "stop it, then copy\n"
    )
    assert tables_of(target) == []


@pytest.mark.parametrize("content", ["missing", "text", "foreign sqlite", "directory"])
def test_what_is_not_a_fredica_database_is_refused(tmp_path: Path, target: str, content: str) -> None:
    path = tmp_path / "thing.db"
    if content == "text":
        path.write_text("not a database at all\n" * 100)
    elif content == "foreign sqlite":
        with sqlite3.connect(path) as other:
            other.execute("CREATE TABLE notes (body TEXT)")
    elif content == "directory":
        path.mkdir()

    result = copy(path, target)

    assert result.exit_code == (2 if content == "directory" else 1), result.output
    expected = {
        "missing": f"error: there is no database file {path}",
        "text": f"error: {path} is not a fredica database (file is not a database)",
        "foreign sqlite": f"error: {path} is not a fredica database (it has no task table)",
        "directory": "is a directory",
    }[content]
    assert expected in result.stderr
    if content != "directory":  # (that one is click's usage error)
        assert result.stderr.count("\n") == 1
    assert tables_of(target) == []


@pytest.mark.parametrize("url", [
    "mysql://localhost/queue",
    "postgresql://localhost:notaport/queue",
    "postgresql:///queue?host=/nonexistent/socket/dir",
])
def test_a_bad_or_unreachable_target_is_one_error_line(source: tuple[Path, dict[str, Any]], url: str) -> None:
    path, _ = source
    before = fingerprint(path)

    result = copy(path, url)

    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert ("postgresql:// URL" if url.startswith("mysql") else "cannot connect to the database") in result.stderr
    assert fingerprint(path) == before


def test_a_failed_copy_leaves_the_target_as_it_was(source: tuple[Path, dict[str, Any]], target: str) -> None:
    """A row PostgreSQL refuses (here a progress SQLite kept as text), met after the migration,
    rolls the whole copy back, the migration with it: not even an empty table is left."""
    path, _ = source
    conn = db.connect(path)
    conn.execute("UPDATE task SET progress = 'lots' WHERE seq = (SELECT max(seq) FROM task)")
    conn.close()

    result = copy(path, target)

    assert result.exit_code == 1
    assert result.stderr.startswith("error: the copy failed, nothing was written: ") and result.stderr.count("\n") == 1
    assert tables_of(target) == []  # unmigrated: no schema_version, no empty task table
    conn = db.connect(path)
    conn.execute("UPDATE task SET progress = 0 WHERE progress = 'lots'")
    conn.close()
    again = copy(path, target)  # the target is still an empty database, as before the first
    assert again.exit_code == 0, again.output
    with db.open_database(target) as pg_conn:
        assert len(task_reads.list_tasks(pg_conn)) == 10


def test_a_copy_whose_commit_answer_is_lost_says_it_may_have_been_made(
    source: tuple[Path, dict[str, Any]], target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its COMMIT sent and the connection then lost: the server may have committed it, and
    "nothing was written" could be untrue."""
    from daemon.store.postgres import copy as copying

    def lost(*args: Any, **kwargs: Any) -> Any:
        error = sqlite3.OperationalError("cannot reach the database: the server did not answer within 60 s")
        error.in_doubt = True  # type: ignore[attr-defined]  # as PostgresConnection marks such a COMMIT
        raise error

    monkeypatch.setattr(copying, "copy", lost)
    result = copy(source[0], target)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: the connection was lost as the copy was being committed: it may have "
                                    "been made (cannot reach the database: "), result.stderr


def test_the_help_says_what_it_does() -> None:
    result = CliRunner().invoke(cli.main, ["db", "copy", "--help"])
    assert result.exit_code == 0
    assert "db copy [OPTIONS] SQLITE_FILE POSTGRES_URL" in result.stdout.splitlines()[0]
    assert "Copy a SQLite queue into an empty PostgreSQL database." in result.stdout


def test_a_task_whose_error_holds_a_nul_byte_is_copied(tmp_path: Path, target: str) -> None:
    # An executor's error is any text it gives (or a crashed attempt's last log lines): a process
    # that printed a NUL byte leaves one in the SQLite queue.
    path = tmp_path / "queue.db"
    conn = db.open_database(path)
    [task_id] = submit(conn, {})
    start_next(conn, T0 + 1)
    tasks.fail(conn, task_id, error="bad output: \x00 then more", error_type="EXCEPTION", now=T0 + 2)
    conn.close()

    result = copy(path, target)

    assert result.exit_code == 0, result.output
    assert "1 text value with NUL bytes, copied with U+FFFD in their place" in result.stdout
    with db.open_database(target) as pg_conn:
        assert tasks.get(pg_conn, task_id).error == "bad output: \ufffd then more"
