"""The live feed's producer (`daemon.web.events.TaskChanges.look`) and the page's reads
(`daemon.store.live`), stepped against a real SQLite file, no daemon; and on PostgreSQL, where
writers on other hosts commit their rows' seqs out of order."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from daemon.store import attempts, cancels, db, live, tasks
from daemon.submission import parse_spec
from daemon.web import events
from tests.postgres_cluster import url  # noqa: F401 (a PostgreSQL database of the test's own)

T0 = 1_000.0


def submit(conn: sqlite3.Connection, count: int, task_type: str = "ECHO") -> list[str]:
    specs = [parse_spec({"type": task_type, "payload": {"i": i}}) for i in range(count)]
    return [t.id for t in tasks.submit(conn, specs, now=T0).tasks]


def feed(db_path: Path | str) -> events.TaskChanges:
    return events.TaskChanges(db_path, commits=lambda: 0, wait_for_commit=lambda seen, timeout: 0)


def look(changes: events.TaskChanges, conn: sqlite3.Connection, now: float) -> dict[str, Any] | None:
    data = changes.look(conn, now)
    if data is None:
        return None
    head, body = data.decode().split("\n", 1)
    assert head == "event: tasks" and body.startswith("data: ") and body.endswith("\n\n")
    return json.loads(body[len("data: "):])


def ids_of(message: dict[str, Any]) -> list[str]:
    return [t["id"] for t in message.get("tasks", [])]


def test_a_look_sends_only_what_changed(conn: sqlite3.Connection, db_path: Path) -> None:
    changes = feed(db_path)
    first, second, third = submit(conn, 3)
    message = look(changes, conn, now=0)
    assert ids_of(message) == [first, second, third]  # new rows
    assert message["counts"]["pending"] == 3
    assert "payload" not in message["tasks"][0] and message["tasks"][0]["status"] == "pending"
    assert look(changes, conn, now=0.5) is None  # nothing changed: nothing sent

    claimed = tasks.claim_ready(conn, T0, 1)
    assert [t.id for t in claimed] == [first]
    tasks.start(conn, first, now=T0, is_pausable=True)
    message = look(changes, conn, now=0.6)
    assert ids_of(message) == [first] and message["tasks"][0]["status"] == "running"
    assert "counts" not in message  # read at most once per COUNTS_INTERVAL
    attempts.record_progress(conn, [(first, 40, "frame 40")])
    message = look(changes, conn, now=0.7)
    assert [(t["id"], t["progress"], t["status_text"]) for t in message["tasks"]] == [(first, 40, "frame 40")]
    assert look(changes, conn, now=0.8) is None

    tasks.complete(conn, first, {"ok": True}, now=T0 + 1)  # leaves the active set: sent once more
    message = look(changes, conn, now=1.2)
    assert [(t["id"], t["status"]) for t in message["tasks"]] == [(first, "completed")]
    assert message["counts"]["completed"] == 1 and message["counts"]["pending"] == 2
    assert look(changes, conn, now=1.3) is None

    cancels.cancel(conn, third, now=T0 + 2)  # a waiting task's change shows in the counts
    assert look(changes, conn, now=1.4) is None
    message = look(changes, conn, now=2.5)
    assert "tasks" not in message and message["counts"]["cancelled"] == 1
    assert changes.looks == 9


def test_a_flood_of_new_rows_asks_the_pages_to_load_again(conn: sqlite3.Connection, db_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "ADDED_MAX", 5)
    changes = feed(db_path)
    submit(conn, 7)
    message = look(changes, conn, now=0)
    assert message["resync"] is True and "tasks" not in message
    assert look(changes, conn, now=0.1) is None  # past the flood: its rows are not sent later
    newer = submit(conn, 1)
    assert ids_of(look(changes, conn, now=0.2)) == newer


class Aborted(Exception):
    """Raised to roll a writer's transaction back."""


def test_a_row_committed_after_a_newer_one_is_sent_all_the_same(url: str) -> None:
    # Two supervisors' submits: the first takes its seq, the second a greater one and commits
    # first. "Rows after the greatest seq seen" would never send the first.
    first, second, reader = db.open_database(url), db.open_database(url), db.connect_reader(url)
    try:
        changes = feed(url)
        with db.write(first):
            [early] = submit(first, 1)
            [late] = submit(second, 1)
            assert ids_of(look(changes, reader, now=0)) == [late]
            assert look(changes, reader, now=0.2) is None  # read again while the gap is open: not sent twice
        assert ids_of(look(changes, reader, now=0.4)) == [early]
        assert look(changes, reader, now=0.6) is None
        [newer] = submit(second, 1)
        assert ids_of(look(changes, reader, now=0.8)) == [newer]
    finally:
        for conn in (first, second, reader):
            conn.close()


def test_a_seq_never_committed_is_given_up_after_a_while(url: str) -> None:
    # A rolled-back submit (or an idempotent one that met its key) leaves a seq no row will have.
    writer, reader = db.open_database(url), db.connect_reader(url)
    try:
        changes = feed(url)
        with pytest.raises(Aborted), db.write(writer):
            submit(writer, 1)
            raise Aborted
        [after] = submit(writer, 1)
        assert ids_of(look(changes, reader, now=0)) == [after]
        assert look(changes, reader, now=events.GAP_WAIT - 0.1) is None
        assert look(changes, reader, now=events.GAP_WAIT + 0.1) is None
        assert changes.arrivals.horizon == live.last_seq(reader)  # nothing read again from now on
    finally:
        writer.close()
        reader.close()


def test_newest_tasks_by_page(conn: sqlite3.Connection) -> None:
    ids = submit(conn, 5) + submit(conn, 2, "SHELL")
    rows, total = live.newest(conn, limit=3)
    assert [r["id"] for r in rows] == ids[::-1][:3] and total == 7
    older, _ = live.newest(conn, limit=3, before=rows[-1]["seq"])
    assert [r["id"] for r in older] == ids[::-1][3:6]
    echo, total = live.newest(conn, task_type="echo", limit=50)
    assert [r["id"] for r in echo] == ids[:5][::-1] and total == 5
    tasks.claim_ready(conn, T0, 1)
    waiting, total = live.newest(conn, status="waiting", limit=50)
    assert total == 7 and len(waiting) == 7
    claimed, total = live.newest(conn, status="claimed", limit=50)
    assert [r["id"] for r in claimed] == [ids[0]] and total == 1
    run = tasks.get(conn, ids[5]).workflow_run_id
    in_run, total = live.newest(conn, run_id=run, limit=50)
    assert [r["id"] for r in in_run] == [ids[6], ids[5]] and total == 2


def test_tallies(conn: sqlite3.Connection) -> None:
    submit(conn, 2)
    tasks.claim_ready(conn, T0, 1)
    assert sorted(live.tasks_by_status_and_queue(conn)) == [("claimed", "default", 1), ("pending", "default", 1)]
    assert live.restart_entries_by_disposition(conn) == {}


def test_a_feed_that_cannot_open_its_reader_at_start_keeps_trying(
    conn: sqlite3.Connection, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a PostgreSQL server away when the daemon starts: the producer must not end for good.
    real, refused = db.connect_reader, []

    def away_twice(database: Any) -> sqlite3.Connection:
        if len(refused) < 2:
            refused.append(database)
            raise sqlite3.OperationalError("cannot reach the database: the server is away")
        return real(database)

    monkeypatch.setattr(events.db, "connect_reader", away_twice)
    monkeypatch.setattr(events, "RECONNECT_WAIT", 0.01)
    changes = feed(db_path)
    submit(conn, 1)

    async def first_look() -> bytes:
        changes.start(asyncio.get_running_loop())
        stream = changes.stream()
        try:
            assert (await stream.__anext__()).startswith(b"event: hello")
            event = await asyncio.wait_for(stream.__anext__(), 15)
            if event.startswith(b"event: resync"):  # its late horizon: the pages load again
                event = await asyncio.wait_for(stream.__anext__(), 15)
            return event  # the first look: its counts
        finally:
            changes.stop()

    event = asyncio.run(first_look())
    assert len(refused) == 2 and event.startswith(b"event: tasks") and b'"pending":1' in event

