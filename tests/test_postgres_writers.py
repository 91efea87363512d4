"""Writers on PostgreSQL that do not wait for each other as SQLite's do: what must not be lost."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from daemon.errors import InvalidTransition
from daemon.models import TaskStatus as S
from daemon.store import db, runs, tasks
from daemon.submission import parse_spec
from tests.conftest import wait_for

T0 = 7_000.0
on_postgres = pytest.mark.parametrize("database", ["postgresql"], indirect=True)


@on_postgres
def test_a_dependent_submitted_while_its_dependency_completes_becomes_ready(
    database: str | Path, store: sqlite3.Connection
) -> None:
    upstream = tasks.submit(store, [parse_spec({"type": "UP"})], now=T0).tasks[0].id
    tasks.claim_ready(store, T0, 1)
    tasks.start(store, upstream, now=T0)
    submitted: list[str] = []
    other = db.open_database(database)
    submitter = threading.Thread(target=lambda: submitted.append(
        tasks.submit(other, [parse_spec({"type": "DOWN", "depends_on": [upstream]})], now=T0 + 1).tasks[0].id
    ))
    try:
        with db.write(store):  # the completion, and its unblocking of dependents, not yet committed
            tasks.complete(store, upstream, {}, now=T0 + 1)
            submitter.start()
            # The submission waits for the completion's transaction (it reads the dependency's
            # status under a lock): without that it would be stored now, counting a dependency
            # whose completion has already unblocked everything it knew of.
            wait_for(lambda: _waiting_for_a_lock(store) or not submitter.is_alive(), timeout=10)
        submitter.join(timeout=30)
    finally:
        other.close()
    (dependent,) = submitted
    claimed = tasks.claim_ready(store, T0 + 2, 5)
    assert [t.id for t in claimed] == [dependent], "the dependent never became ready"
    assert tasks.get(store, dependent).status is S.CLAIMED


def _waiting_for_a_lock(conn: sqlite3.Connection) -> bool:
    """Whether another backend of this database is waiting for a lock (seen from `conn`)."""
    # A read that does not disturb `conn`'s open transaction.
    return bool(conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid != pg_backend_pid()"
    ).fetchone()[0])


@on_postgres
def test_a_transition_of_rows_read_in_several_statuses_refuses_one_moved_since(
    database: str | Path, store: sqlite3.Connection
) -> None:
    ids = [t.id for t in tasks.submit(store, [parse_spec({"type": "T"})] * 3, now=T0).tasks]
    tasks.transition(store, ids[1], S.CLAIMED, now=T0)
    other = db.open_database(database)
    try:
        with db.write(store):
            rows = store.execute(
                "SELECT seq, id, status, workflow_run_id FROM task WHERE id IN (?, ?) ORDER BY seq", ids[:2]
            ).fetchall()  # pending and claimed, as read in this transaction
            # Another supervisor claims the pending one and commits, between the read and the write.
            tasks.transition(other, ids[0], S.CLAIMED, now=T0 + 1)
            with pytest.raises(InvalidTransition), db.savepoint(store):
                tasks._transition(store, rows, S.CANCELLED, now=T0 + 2)
    finally:
        other.close()
    assert [tasks.get(store, i).status for i in ids] == [S.CLAIMED, S.CLAIMED, S.PENDING]
    run_id = tasks.get(store, ids[0]).workflow_run_id
    assert runs.get(store, run_id).counts == runs.counts_from_tasks(store, run_id)
