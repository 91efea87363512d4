"""Opening the database (SPEC §2): pragmas, upgrading an old schema, durability across kill -9."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daemon.errors import MigrationError
from daemon.models import RunCounts
from daemon.models import TaskStatus as S
from daemon.store import db, migrations, runs, task_reads, tasks
from daemon.submission import TaskSpec
from tests import store_steps

T0 = 6_000.0


def pragma(conn: sqlite3.Connection, name: str) -> object:
    return conn.execute(f"PRAGMA {name}").fetchone()[0]


def test_pragmas_by_default(conn: sqlite3.Connection, db_path: Path) -> None:
    assert pragma(conn, "journal_mode") == "wal"
    assert pragma(conn, "foreign_keys") == 1
    assert pragma(conn, "busy_timeout") == 10_000
    assert pragma(conn, "synchronous") == 1  # NORMAL
    assert migrations.current_version(conn) == migrations.LATEST
    # WAL is a property of the file: a plain connection sees it too.
    plain = sqlite3.connect(db_path)
    try:
        assert pragma(plain, "journal_mode") == "wal"
    finally:
        plain.close()


def test_pragmas_when_asked(db_path: Path) -> None:
    conn = db.open_database(db_path, synchronous="full", busy_timeout=2.5)
    try:
        assert pragma(conn, "synchronous") == 2  # FULL
        assert pragma(conn, "busy_timeout") == 2_500
        assert pragma(conn, "foreign_keys") == 1
    finally:
        conn.close()


def test_unknown_synchronous_level_is_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        db.open_database(db_path, synchronous="OFF")


def test_foreign_keys_are_enforced(conn: sqlite3.Connection) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO task (id, type, workflow_run_id, created_at) VALUES ('t', 'T', 'no-such-run', 0)"
        )


def test_reopening_an_up_to_date_database_changes_nothing(db_path: Path, conn: sqlite3.Connection) -> None:
    task_id = tasks.submit(conn, [TaskSpec(type="T")], now=T0).tasks[0].id
    again = db.open_database(db_path)
    try:
        assert migrations.current_version(again) == migrations.LATEST
        assert tasks.get(again, task_id) == tasks.get(conn, task_id)
    finally:
        again.close()


def test_newer_schema_is_refused(db_path: Path) -> None:
    conn = db.open_database(db_path)
    conn.execute(f"PRAGMA user_version = {migrations.LATEST + 1}")
    conn.close()
    with pytest.raises(MigrationError, match="newer"):
        db.open_database(db_path)


# --- upgrading a database of schema version 1 ---------------------------------------------------

# Seed-shaped data: two runs; dependencies as JSON arrays only (no edges, no counters yet).
SEED_RUNS = [
    # id, template, status, total_tasks, done_tasks (the seed's own, possibly stale, numbers)
    ("run-1", "download_and_transcode", "running", 3, 1),
    ("run-2", "adhoc", "pending", 0, 0),
]
SEED_TASKS = [
    # id, run, status, priority, depends_on, result, idempotency key
    ("dl-1", "run-1", "completed", 0, [], {"path": "/v.mp4"}, "m1:DOWNLOAD"),
    ("tc-1", "run-1", "pending", 0, ["dl-1"], None, None),
    ("up-1", "run-1", "pending", 0, ["tc-1"], None, None),
    ("a-2", "run-2", "pending", 0, [], None, "m2:A"),
    ("b-2", "run-2", "pending", 5, ["a-2", "dl-1"], None, None),
    ("c-2", "run-2", "cancelled", 0, [], None, None),
]
SEED_EDGES = {(dep, task_id) for task_id, _, _, _, deps, _, _ in SEED_TASKS for dep in deps}


def make_version_1_database(path: Path) -> None:
    conn = db.connect(path)
    assert migrations.migrate(conn, target=1) == 1
    assert migrations.current_version(conn) == 1
    for run_id, template, status, total, done in SEED_RUNS:
        conn.execute(
            """INSERT INTO workflow_run (id, material_id, template, status, total_tasks, done_tasks, created_at)
               VALUES (?, 'm', ?, ?, ?, ?, ?)""",
            (run_id, template, status, total, done, T0),
        )
    for task_id, run_id, status, priority, deps, result, key in SEED_TASKS:
        conn.execute(
            """INSERT INTO task (id, type, workflow_run_id, status, priority, depends_on, payload, result,
                   idempotency_key, created_at, completed_at)
               VALUES (?, 'SEED', ?, ?, ?, ?, '{"n": 1}', ?, ?, ?, ?)""",
            (
                task_id,
                run_id,
                status,
                priority,
                json.dumps(deps),
                None if result is None else json.dumps(result),
                key,
                T0,
                T0 if status in ("completed", "cancelled") else None,
            ),
        )
    conn.close()


V1_TASK_COLUMNS = (
    "seq, id, type, workflow_run_id, status, priority, depends_on, payload, result, idempotency_key, "
    "created_at, completed_at"
)
V1_RUN_COLUMNS = "id, material_id, template, created_at"


def test_version_1_database_is_upgraded_on_open(db_path: Path) -> None:
    make_version_1_database(db_path)
    old = sqlite3.connect(db_path)
    rows_before = old.execute(f"SELECT {V1_TASK_COLUMNS} FROM task ORDER BY seq").fetchall()
    runs_before = old.execute(f"SELECT {V1_RUN_COLUMNS} FROM workflow_run ORDER BY id").fetchall()
    old.close()

    conn = db.open_database(db_path)
    try:
        assert migrations.current_version(conn) == migrations.LATEST
        rows_after = conn.execute(f"SELECT {V1_TASK_COLUMNS} FROM task ORDER BY seq").fetchall()
        assert [tuple(r) for r in rows_after] == rows_before
        runs_after = conn.execute(f"SELECT {V1_RUN_COLUMNS} FROM workflow_run ORDER BY id").fetchall()
        assert [tuple(r) for r in runs_after] == runs_before

        edges = {
            (up, down)
            for up, down in conn.execute(
                """SELECT u.id, t.id FROM task_dependency AS d
                   JOIN task AS u ON u.seq = d.depends_on_seq JOIN task AS t ON t.seq = d.task_seq"""
            )
        }
        assert edges == SEED_EDGES
        unmet = dict(conn.execute("SELECT id, unmet_deps FROM task").fetchall())
        assert unmet == {"dl-1": 0, "tc-1": 0, "up-1": 1, "a-2": 0, "b-2": 1, "c-2": 0}

        run1, run2 = runs.get(conn, "run-1"), runs.get(conn, "run-2")
        assert run1.counts == RunCounts(pending=2, completed=1)
        assert (run1.total_tasks, run1.done_tasks) == (3, 1)
        assert run2.counts == RunCounts(pending=2, cancelled=1)
        assert (run2.total_tasks, run2.done_tasks) == (3, 0)

        # The old keys are held by their active tasks, and freed by finished ones.
        duplicate = tasks.submit(conn, [TaskSpec(type="SEED", idempotency_key="m2:A")], now=T0)
        assert duplicate.tasks == (tasks.SubmittedTask("a-2", created=False),)
        again_spec = TaskSpec(type="SEED", idempotency_key="m1:DOWNLOAD", depends_on=("up-1",))
        again = tasks.submit(conn, [again_spec], now=T0)
        assert again.tasks[0].created

        # Claims follow the old dependencies: only tc-1 and a-2 are ready.
        assert store_steps.claim_next(conn, T0 + 1).id == "tc-1"
        assert store_steps.claim_next(conn, T0 + 1).id == "a-2"
        assert store_steps.claim_next(conn, T0 + 1) is None
        tasks.complete(conn, "a-2", {}, now=T0 + 2)
        assert store_steps.claim_next(conn, T0 + 3).id == "b-2"  # its other dependency was completed
        tasks.complete(conn, "tc-1", {}, now=T0 + 4)
        assert store_steps.claim_next(conn, T0 + 5).id == "up-1"
        assert task_reads.results_of(conn, ["dl-1"]) == {"dl-1": {"path": "/v.mp4"}}

        # The migrated counters keep moving with the tasks.
        for run_id in ("run-1", "run-2"):
            assert runs.get(conn, run_id).counts == runs.counts_from_tasks(conn, run_id)
    finally:
        conn.close()


def test_version_1_database_with_duplicate_active_keys_is_upgraded(db_path: Path) -> None:
    # The seed checked keys before inserting, so two active tasks may share one; the unique index of
    # migration 2 must not make such a database impossible to open.
    conn = db.connect(db_path)
    migrations.migrate(conn, target=1)
    conn.execute("INSERT INTO workflow_run (id, template, created_at) VALUES ('r', 'adhoc', 0)")
    for task_id in ("first", "second"):
        conn.execute(
            """INSERT INTO task (id, type, workflow_run_id, status, idempotency_key, created_at)
               VALUES (?, 'DOWNLOAD', 'r', 'pending', 'm1:DOWNLOAD', 0)""",
            (task_id,),
        )
    conn.close()

    upgraded = db.open_database(db_path)
    try:
        assert migrations.current_version(upgraded) == migrations.LATEST
        assert {t.id for t in task_reads.list_tasks(upgraded)} == {"first", "second"}
        # The key stays with the older task, and still holds.
        duplicate = tasks.submit(upgraded, [TaskSpec(type="DOWNLOAD", idempotency_key="m1:DOWNLOAD")], now=T0)
        assert duplicate.tasks == (tasks.SubmittedTask("first", created=False),)
    finally:
        upgraded.close()


def test_active_template_tasks_keep_their_placeholders_filled_after_migration_5(db_path: Path) -> None:
    # Before 5 every payload was searched for "{@N.field}" at dispatch; an active task that may
    # come from a template keeps that, other tasks' text is left alone from now on.
    conn = db.connect(db_path)
    migrations.migrate(conn, target=4)
    conn.execute("INSERT INTO workflow_run (id, template, created_at) VALUES ('r', 't', 0)")
    rows = [
        ("templated", "pending", '["up"]', '{"input": "{@0.output}"}'),
        ("finished", "completed", '["up"]', '{"input": "{@0.output}"}'),
        ("no_deps", "pending", "[]", '{"text": "{@0.x}"}'),
        ("plain", "pending", '["up"]', '{"url": "http://a"}'),
    ]
    for task_id, status, depends_on, payload in rows:
        conn.execute(
            """INSERT INTO task (id, type, workflow_run_id, status, depends_on, payload, created_at)
               VALUES (?, 'ECHO', 'r', ?, ?, ?, 0)""",
            (task_id, status, depends_on, payload),
        )
    conn.close()
    upgraded = db.open_database(db_path)
    try:
        refs = {t.id: t.payload_refs for t in task_reads.list_tasks(upgraded)}
        assert refs == {"templated": True, "finished": False, "no_deps": False, "plain": False}
    finally:
        upgraded.close()


def test_failed_migration_leaves_the_previous_version(db_path: Path) -> None:
    # A table in the way of migration 2 makes it fail part-way: nothing of it may remain.
    conn = db.connect(db_path)
    migrations.migrate(conn, target=1)
    conn.execute("CREATE TABLE task_dependency (x)")
    conn.close()
    with pytest.raises(MigrationError, match="migration 2"):
        db.open_database(db_path)
    check = db.connect(db_path)
    try:
        assert migrations.current_version(check) == 1
        columns = {row["name"] for row in check.execute("PRAGMA table_info(task)")}
        assert "unmet_deps" not in columns
    finally:
        check.close()


# --- durability -----------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from daemon.store import db, task_reads, tasks
    from daemon.submission import TaskSpec

    conn = db.open_database(sys.argv[1])
    sub = tasks.submit(conn, [TaskSpec(type="DURABLE", payload={"n": 7})], now=6000.0)
    print(sub.tasks[0].id, flush=True)
    # A transaction that never commits: it must vanish, and must not leave the file locked.
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE task SET status = 'running'")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_committed_work_survives_kill_9(db_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    task_id = out.strip()
    assert task_id
    assert os.path.exists(f"{db_path}-wal")  # the commit lived only in the WAL when the process died

    conn = db.open_database(db_path, busy_timeout=2.0)
    try:
        task = tasks.get(conn, task_id)
        assert task.status is S.PENDING
        assert task.payload == {"n": 7}
        assert runs.get(conn, task.workflow_run_id).total_tasks == 1
        # The dead process's write lock is gone: writing works at once.
        assert store_steps.claim_next(conn, T0).id == task_id
    finally:
        conn.close()


def test_a_failed_savepoint_is_undone_alone_and_nested_writes_join(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE note (text TEXT)")
    with db.write(conn):
        conn.execute("INSERT INTO note VALUES ('outer, before')")
        with pytest.raises(RuntimeError):
            with db.savepoint(conn):
                conn.execute("INSERT INTO note VALUES ('in the savepoint')")
                with db.write(conn):  # joins: undone with the savepoint
                    conn.execute("INSERT INTO note VALUES ('nested in it')")
                raise RuntimeError("refused")
        with db.savepoint(conn):
            conn.execute("INSERT INTO note VALUES ('savepoint, kept')")
        conn.execute("INSERT INTO note VALUES ('outer, after')")
    assert [r[0] for r in conn.execute("SELECT text FROM note")] == ["outer, before", "savepoint, kept", "outer, after"]
    with db.savepoint(conn):  # outside a transaction: one of its own
        conn.execute("INSERT INTO note VALUES ('alone')")
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM note").fetchone()[0] == 4
