"""Store calls the supervisor makes that the other store suites reach only through the daemon:
counts, pause states, downstream counts, boot times; on every backend."""

from __future__ import annotations

import sqlite3

from daemon.models import TaskStatus as S
from daemon.store import attempts, boots, cancels, live, task_reads, tasks
from daemon.submission import parse_spec
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 9_000.0


def _chain(conn: sqlite3.Connection) -> list[str]:
    """head ← middle ← tail, and one unrelated task."""
    lines = [
        {"type": "T", "key": "head"},
        {"type": "T", "key": "middle", "depends_on": ["head"]},
        {"type": "T", "depends_on": ["middle"]},
        {"type": "T"},
    ]
    return [t.id for t in tasks.submit(conn, [parse_spec(line) for line in lines], now=T0).tasks]


def test_counts_by_status_include_every_status(conn: sqlite3.Connection) -> None:
    ids = _chain(conn)
    tasks.claim_ready(conn, T0, 1)
    tasks.start(conn, ids[0], now=T0)
    assert task_reads.count_by_status(conn) == {
        "pending": 3, "claimed": 0, "running": 1, "completed": 0, "failed": 0, "cancelled": 0,
        "held": 0,  # the held part of pending (SPEC §14)
    }


def test_active_downstream_counts_transitive_dependents_not_yet_ended(conn: sqlite3.Connection) -> None:
    ids = _chain(conn)
    assert tasks.active_downstream(conn, ids[0]) == 2
    cancels.cancel(conn, ids[2], now=T0)
    assert tasks.active_downstream(conn, ids[0]) == 1
    assert tasks.active_downstream(conn, ids[3]) == 0


def test_pause_states_are_recorded_for_running_tasks_only(conn: sqlite3.Connection) -> None:
    _chain(conn)
    claimed = tasks.claim_ready(conn, T0, 2)
    tasks.start(conn, claimed[0].id, now=T0)
    attempts.record_pause_states(conn, [(claimed[0].id, True, True, "need a human"), (claimed[1].id, True, True, "x")])
    running = tasks.get(conn, claimed[0].id)
    assert (running.is_paused, running.is_pausable, running.status_text) == (True, True, "need a human")
    waiting = tasks.get(conn, claimed[1].id)
    assert (waiting.status, waiting.is_paused, waiting.status_text) == (S.CLAIMED, False, None)
    assert [t.id for t in task_reads.list_tasks(conn, status="paused")] == [claimed[0].id]


def test_a_boot_time_is_kept_once(conn: sqlite3.Connection) -> None:
    assert boots.boot_time(conn, "boot-a", 100.5) == 100.5
    assert boots.boot_time(conn, "boot-a", 200.0) == 100.5
    assert boots.boot_time(conn, "boot-b", 300.0) == 300.0


def test_the_live_feed_and_the_page_read_alike_on_every_backend(conn: sqlite3.Connection) -> None:
    """daemon/store/live.py, which the web page's feed, its task pages and /metrics read."""
    ids = _chain(conn)
    [claimed] = tasks.claim_ready(conn, T0, 1)
    tasks.start(conn, claimed.id, now=T0 + 1)
    seqs = {task.id: task.seq for task in task_reads.list_tasks(conn)}

    [running] = live.active(conn)
    assert running["id"] == claimed.id and running["status"] == "running"
    assert "payload" not in running and "heartbeat_at" not in running and "is_held" in running
    assert [row["id"] for row in live.added_since(conn, seqs[ids[1]], 10)] == ids[2:]
    assert [row["id"] for row in live.by_ids(conn, [ids[3], "no-such-task"])] == [ids[3]]
    assert live.last_seq(conn) == max(seqs.values())
    page, total = live.newest(conn, limit=2)
    assert [row["id"] for row in page] == [ids[3], ids[2]] and total == 4
    page, total = live.newest(conn, status="waiting", before=seqs[ids[3]])
    assert [row["id"] for row in page] == [ids[2], ids[1]] and total == 3
    assert sorted(live.tasks_by_status_and_queue(conn)) == [("pending", "default", 3), ("running", "default", 1)]
    assert live.restart_entries_by_disposition(conn) == {}
