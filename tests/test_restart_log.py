"""The restart log keeps an entry until a user acts on it (SPEC §9 step 4)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from daemon.store import db, migrations, restarts, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 9_000.0


def interrupted_tasks(conn: sqlite3.Connection, count: int) -> list:
    submission = tasks.submit(conn, [TaskSpec(type="T") for _ in range(count)], now=T0)
    return [tasks.get(conn, t.id) for t in submission.tasks]


def dispositions(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return [(e.session_id, e.task_id, e.disposition) for e in restarts.list_entries(conn, include_resolved=True)]


def test_a_later_restart_supersedes_only_the_entries_of_tasks_it_interrupts_again(conn: sqlite3.Connection) -> None:
    first, second, third = interrupted_tasks(conn, 3)
    restarts.record(conn, "s1", [first, second], now=T0)
    restarts.record(conn, "s2", [second, third], now=T0 + 1)
    restarts.record(conn, "s3", [], now=T0 + 2)
    assert dispositions(conn) == [
        ("s1", first.id, "pending_review"),  # untouched by two later restarts
        ("s1", second.id, "superseded"),  # s2 wrote a newer entry for it
        ("s2", second.id, "pending_review"),
        ("s2", third.id, "pending_review"),
    ]
    assert [e.task_id for e in restarts.list_entries(conn)] == [first.id, second.id, third.id]


def test_an_entry_a_user_resolved_is_never_superseded(conn: sqlite3.Connection) -> None:
    (task,) = interrupted_tasks(conn, 1)
    restarts.record(conn, "s1", [task], now=T0)
    (entry,) = restarts.list_entries(conn)
    restarts.resolve(conn, entry.id, "dismissed", now=T0 + 1)
    restarts.record(conn, "s2", [task], now=T0 + 2)
    assert dispositions(conn) == [("s1", task.id, "dismissed"), ("s2", task.id, "pending_review")]


def test_migration_6_brings_back_what_the_old_rule_superseded(db_path: Path) -> None:
    conn = db.connect(db_path)
    migrations.migrate(conn, target=5)
    rows = [
        # session, task, disposition as the old rule left them
        ("s1", "a", "superseded"),  # a's only entry: superseded by s2, which did not name a
        ("s1", "b", "superseded"),  # b has a newer entry: stays superseded
        ("s1", "c", "dismissed"),
        ("s2", "b", "superseded"),  # superseded by s3 although s3 did not name b
        ("s3", "d", "pending_review"),
    ]
    conn.executemany(
        "INSERT INTO restart_task_log (session_id, task_id, task_type, workflow_run_id, status_at_restart,"
        " payload, progress, disposition, created_at, resolved_at) VALUES (?, ?, 'T', 'r', 'running', '{}', 0, ?, 0, 1)",
        rows,
    )
    conn.close()
    upgraded = db.open_database(db_path)
    try:
        got = [(r["session_id"], r["task_id"], r["disposition"], r["resolved_at"])
               for r in upgraded.execute("SELECT * FROM restart_task_log ORDER BY id")]
        assert got == [
            ("s1", "a", "pending_review", None),
            ("s1", "b", "superseded", 1.0),
            ("s1", "c", "dismissed", 1.0),
            ("s2", "b", "pending_review", None),
            ("s3", "d", "pending_review", 1.0),
        ]
    finally:
        upgraded.close()
