"""Claiming on PostgreSQL while another connection is claiming (daemon/store/postgres/claim.py)."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from daemon.models import TaskStatus as S
from daemon.store import backend, db, runs, task_reads, tasks
from daemon.submission import parse_spec

T0 = 5_000.0
on_postgres = pytest.mark.parametrize("database", ["postgresql"], indirect=True)


def _submit(conn: sqlite3.Connection, count: int, *, runs_of: int) -> list[str]:
    """`count` tasks of mixed priorities, `runs_of` to a workflow run."""
    ids: list[str] = []
    for start in range(0, count, runs_of):
        specs = [parse_spec({"type": "T", "priority": i % 3}) for i in range(start, min(count, start + runs_of))]
        ids += [t.id for t in tasks.submit(conn, specs, now=T0).tasks]
    return ids


@on_postgres
def test_a_claim_passes_over_the_tasks_another_is_claiming(database: str | Path, store: sqlite3.Connection) -> None:
    # A run of their own each: claims of one run's tasks wait for each other on its counters' row.
    ids = _submit(store, 10, runs_of=1)
    order = [t.id for t in sorted(task_reads.list_tasks(store), key=lambda t: (-t.priority, t.seq))]
    other = db.open_database(database)
    try:
        # Waiting for the first claimer's row locks would be a failure here, not a pause.
        other.execute("SET lock_timeout = '2s'")
        with db.write(store):  # the first claim's transaction stays open while the other claims
            first = [t.id for t in tasks.claim_ready(store, T0, 3)]
            second = [t.id for t in tasks.claim_ready(other, T0, 3)]
        assert first == order[:3]
        assert second == order[3:6]  # the next ones in claim order, taken without waiting
        rest = [t.id for t in tasks.claim_ready(other, T0, 10)]
    finally:
        other.close()
    assert sorted(first + second + rest) == sorted(ids)
    for task_id in ids:
        run = runs.get(store, tasks.get(store, task_id).workflow_run_id)
        assert (run.counts.claimed, run.counts.pending, run.status.value) == (1, 0, "running")


@on_postgres
def test_threads_claiming_at_once_never_claim_a_task_twice(database: str | Path, store: sqlite3.Connection) -> None:
    # Runs of 7 claimed in batches of 7 by four claimers: most claims move the counters of
    # several runs, each claimer locking rows that the others want.
    ids = _submit(store, 300, runs_of=7)
    barrier = threading.Barrier(4)
    claimed: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def claimer(mine: list[str]) -> None:
        conn = db.open_database(database)
        try:
            barrier.wait(timeout=30)
            while batch := tasks.claim_ready(conn, T0, 7):
                mine.extend(t.id for t in batch)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=claimer, args=(mine,)) for mine in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    everything = [task_id for mine in claimed for task_id in mine]
    assert len(everything) == len(set(everything)), "a task was claimed twice"
    assert sorted(everything) == sorted(ids)
    assert {t.status for t in task_reads.list_tasks(store)} == {S.CLAIMED}
    run_ids = {t.workflow_run_id for t in task_reads.list_tasks(store)}
    assert sum(runs.get(store, run_id).counts.claimed for run_id in run_ids) == 300


@on_postgres
def test_a_completion_finds_its_dependents_by_key_on_a_queue_loaded_before_any_analyze(
    store: sqlite3.Connection,
) -> None:
    # Without statistics (a queue just loaded in bulk) the planner took `status = 'pending'` for
    # the way in: it hashed or and-ed the status index's every pending entry at each completion.
    links = [str(uuid.uuid4()) for _ in range(2000)]
    specs = [parse_spec({"type": "T", "id": link, **({"depends_on": [links[i - 1]]} if i else {})})
             for i, link in enumerate(links)]
    tasks.submit(store, specs, now=T0)
    seq = tasks.get(store, links[10]).seq
    plan = " ".join(row[0] for row in store.execute(
        "EXPLAIN " + tasks._UNBLOCK[backend.POSTGRESQL], (seq,)).fetchall())
    assert "task_by_status" not in plan and "task_pkey" in plan and "Hash" not in plan, plan


@on_postgres
def test_column_names_are_read_in_the_clients_encoding(store: sqlite3.Connection) -> None:
    store.raw.execute("SET client_encoding TO 'LATIN1'")
    try:
        assert store.execute('SELECT 1 AS "é", 2 AS plain').fetchone()["é"] == 1
    finally:
        store.raw.execute("SET client_encoding TO 'UTF8'")
