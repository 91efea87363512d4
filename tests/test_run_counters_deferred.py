"""A run's task counters move once per transaction (`runs.DeferredShifts`), never wrongly: every
read inside the transaction sees the moves so far, and a rolled-back savepoint or transaction
takes exactly its own moves with it. On both backends."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from daemon.models import RunCounts, RunStatus
from daemon.models import TaskStatus as S
from daemon.store import db, runs, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 9_000.0


class Boom(Exception):
    pass


def submit(conn: sqlite3.Connection, n: int) -> tuple[str, list[str]]:
    sub = tasks.submit(conn, [TaskSpec(type="T") for _ in range(n)], now=T0)
    assert sub.run_id is not None
    return sub.run_id, [t.id for t in sub.tasks]


def counted_moves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time the run counters are written: how many runs that statement batch moved."""
    calls: list[int] = []
    real = runs._apply_shifts

    def spy(conn: Any, deltas: Any, moved_at: Any) -> None:
        calls.append(len(deltas))
        real(conn, deltas, moved_at)

    monkeypatch.setattr(runs, "_apply_shifts", spy)
    return calls


def stored_matches_tasks(conn: sqlite3.Connection, run_id: str) -> RunCounts:
    stored = runs.get(conn, run_id).counts
    assert stored == runs.counts_from_tasks(conn, run_id)
    return stored


def test_claiming_starting_and_completing_a_whole_run_in_one_transaction_moves_its_counters_once(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, ids = submit(conn, 40)
    moves = counted_moves(monkeypatch)
    with db.write(conn):
        claimed = tasks.claim_ready(conn, T0 + 1, 40)
        for task in claimed:
            tasks.start(conn, task.id, known=task, now=T0 + 2, executor_pid=1, executor_started_at=1.0)
        for task_id in ids:
            tasks.complete(conn, task_id, {"ok": True}, now=T0 + 3)
    assert moves == [1]  # one write, for the one run, at the commit: not 120
    run = runs.get(conn, run_id)
    assert run.status is RunStatus.COMPLETED and run.completed_at == T0 + 3
    assert stored_matches_tasks(conn, run_id) == RunCounts(completed=40)


def test_a_read_of_the_run_inside_the_transaction_sees_every_move_so_far(conn: sqlite3.Connection) -> None:
    run_id, _ = submit(conn, 3)
    with db.write(conn):
        tasks.claim_ready(conn, T0 + 1, 2)
        inside = runs.get(conn, run_id)
        assert inside.counts == RunCounts(pending=1, claimed=2)
        assert inside.status is RunStatus.RUNNING
    assert stored_matches_tasks(conn, run_id) == RunCounts(pending=1, claimed=2)


def test_a_rolled_back_savepoint_takes_its_own_moves_back_even_after_a_write_inside_it(
    conn: sqlite3.Connection,
) -> None:
    run_id, ids = submit(conn, 3)
    with db.write(conn):
        tasks.transition(conn, ids[0], S.CLAIMED, now=T0 + 1)  # kept back, before the savepoint
        with pytest.raises(Boom):
            with db.savepoint(conn):
                tasks.transition(conn, ids[1], S.CLAIMED, now=T0 + 2)
                # A read writes what was kept back (both moves) inside the savepoint...
                assert runs.get(conn, run_id).counts == RunCounts(pending=1, claimed=2)
                raise Boom
        # ...and its rollback undoes that write: the first move is kept back again, not lost.
        assert runs.get(conn, run_id).counts == RunCounts(pending=2, claimed=1)
        with pytest.raises(Boom):
            with db.savepoint(conn):
                tasks.transition(conn, ids[2], S.CANCELLED, now=T0 + 3)
                raise Boom  # nothing written inside: only its own move goes
    assert stored_matches_tasks(conn, run_id) == RunCounts(pending=2, claimed=1)


def test_a_rolled_back_transaction_leaves_nothing_kept_back_for_the_next(conn: sqlite3.Connection) -> None:
    first, first_ids = submit(conn, 2)
    second, second_ids = submit(conn, 1)
    with pytest.raises(Boom):
        with db.write(conn):
            tasks.transition(conn, first_ids[0], S.CLAIMED, now=T0 + 1)
            raise Boom
    with db.write(conn):
        tasks.transition(conn, second_ids[0], S.CLAIMED, now=T0 + 2)
    assert stored_matches_tasks(conn, first) == RunCounts(pending=2)
    assert stored_matches_tasks(conn, second) == RunCounts(claimed=1)


def test_a_transaction_committed_by_hand_writes_what_was_kept_back(conn: sqlite3.Connection) -> None:
    run_id, ids = submit(conn, 2)
    conn.execute("BEGIN IMMEDIATE")
    tasks.transition(conn, ids[0], S.CANCELLED, now=T0 + 1)
    conn.execute("COMMIT")
    conn.execute("BEGIN IMMEDIATE")
    tasks.transition(conn, ids[1], S.CLAIMED, now=T0 + 2)
    conn.execute("ROLLBACK")
    assert stored_matches_tasks(conn, run_id) == RunCounts(pending=1, cancelled=1)


def test_a_rolled_back_savepoint_takes_back_the_first_moves_ever_made_on_its_connection(
    conn: sqlite3.Connection,
) -> None:
    # A fresh connection has kept nothing back yet: the savepoint opens before the first move.
    run_id, ids = submit(conn, 2)
    with db.write(conn):
        with pytest.raises(Boom):
            with db.savepoint(conn):
                tasks.transition(conn, ids[0], S.CANCELLED, now=T0 + 1)
                raise Boom  # undoes the task's cancel: its move must go too
        tasks.transition(conn, ids[1], S.CLAIMED, now=T0 + 2)
    assert stored_matches_tasks(conn, run_id) == RunCounts(pending=1, claimed=1)


def test_a_run_ends_at_its_own_last_move_not_at_a_later_move_of_another_run(conn: sqlite3.Connection) -> None:
    # As the supervisor's tick after a full disk: attempts that ended long ago are recorded as of
    # when they ended, then other runs' tasks are claimed as of now, in the same transaction.
    ended, ended_ids = submit(conn, 1)
    other, other_ids = submit(conn, 1)
    with db.write(conn):
        tasks.transition(conn, ended_ids[0], S.CANCELLED, now=T0 + 1)
        tasks.transition(conn, other_ids[0], S.CLAIMED, now=T0 + 60)
    run = runs.get(conn, ended)
    assert run.status is RunStatus.CANCELLED
    assert run.completed_at == tasks.get(conn, ended_ids[0]).completed_at == T0 + 1
    assert runs.get(conn, other).completed_at is None
