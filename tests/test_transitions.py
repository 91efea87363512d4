"""Task transitions (SPEC §3) through `tasks.transition` on a real database: every allowed pair
works and has its side effects; every other pair is refused and changes nothing at all."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from daemon import models
from daemon.errors import InvalidTransition, UnknownTask
from daemon.models import TaskStatus as S
from daemon.store import attempts, cancels, runs, tasks
from daemon.submission import parse_spec
from tests import store_steps
from tests.conformance import conn  # noqa: F401 (every test on every backend)

# SPEC §3 written out again, so the table in models.py is checked against the contract, not itself.
SPEC_ALLOWED = {
    (S.PENDING, S.CLAIMED),
    (S.PENDING, S.CANCELLED),
    (S.PENDING, S.FAILED),
    (S.CLAIMED, S.RUNNING),
    (S.CLAIMED, S.COMPLETED),
    (S.CLAIMED, S.PENDING),
    (S.CLAIMED, S.CANCELLED),
    (S.CLAIMED, S.FAILED),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
}
ALL_PAIRS = set(itertools.product(S, S))
DISALLOWED = ALL_PAIRS - SPEC_ALLOWED

T0 = 1_000.0  # submission time; every later step passes a larger `now`


def _pair_id(pair: tuple[S, S]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def snapshot(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    """Every row of every table the store writes, for before/after comparisons."""
    return {
        table: [tuple(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]
        for table in ("task", "workflow_run", "task_dependency", "restart_task_log")
    }


def task_in(conn: sqlite3.Connection, status: S) -> tuple[str, str]:
    """Submit a task with one pending dependent and bring it to `status` through the repository.

    The dependent makes a wrongly applied transition visible (it would be unblocked or cancelled).
    Returns (task id, dependent id).
    """
    sub = tasks.submit(
        conn,
        [parse_spec({"type": "MAIN", "key": "main"}), parse_spec({"type": "DOWN", "depends_on": ["main"]})],
        now=T0,
    )
    task_id, dependent_id = (t.id for t in sub.tasks)
    if status is S.CANCELLED:
        cancels.cancel(conn, task_id, now=T0 + 1)
    elif status is not S.PENDING:
        claimed = store_steps.claim_next(conn, T0 + 1)
        assert claimed is not None and claimed.id == task_id
        if status is not S.CLAIMED:
            tasks.start(conn, task_id, now=T0 + 2, executor_pid=4242, executor_started_at=T0 + 2)
            if status is S.COMPLETED:
                tasks.complete(conn, task_id, {"out": 1}, now=T0 + 3)
            elif status is S.FAILED:
                tasks.fail(conn, task_id, error="boom", error_type="EXCEPTION", now=T0 + 3)
    assert tasks.get(conn, task_id).status is status
    return task_id, dependent_id


def assert_counters_match_rows(conn: sqlite3.Connection, run_id: str) -> None:
    run = runs.get(conn, run_id)
    assert run.counts == runs.counts_from_tasks(conn, run_id)
    assert run.total_tasks == run.counts.total


def test_model_table_is_the_spec_table() -> None:
    model_pairs = {(src, dst) for src, targets in models.ALLOWED_TRANSITIONS.items() for dst in targets}
    assert model_pairs == SPEC_ALLOWED
    assert len(DISALLOWED) == 36 - 12


@pytest.mark.parametrize("pair", sorted(SPEC_ALLOWED), ids=_pair_id)
def test_allowed_transition(conn: sqlite3.Connection, pair: tuple[S, S]) -> None:
    source, target = pair
    task_id, dependent_id = task_in(conn, source)
    before = tasks.get(conn, task_id)
    now = T0 + 10

    returned = tasks.transition(conn, task_id, target, now=now)

    after = tasks.get(conn, task_id)
    assert returned == after
    assert after.status is target
    assert_counters_match_rows(conn, after.workflow_run_id)
    dependent = tasks.get(conn, dependent_id)

    if target is S.CLAIMED:
        assert after.claimed_at == now
    if target is S.RUNNING:
        assert after.started_at == now  # first start
        assert after.heartbeat_at == now
    if target.is_terminal:
        assert after.completed_at == now
    else:
        assert after.completed_at is None
    if target is S.COMPLETED:
        assert after.progress == 100
        # The dependent is unblocked: it is the next task claimed.
        assert dependent.status is S.PENDING
        assert store_steps.claim_next(conn, now + 1).id == dependent_id
    elif target in (S.FAILED, S.CANCELLED):
        assert dependent.status is S.CANCELLED
        assert dependent.error_type == models.DEPENDENCY_FAILED
        assert dependent.completed_at == now
        assert store_steps.claim_next(conn, now + 1) is None
    elif target is S.PENDING:
        # Back in the queue, claimable again; its dependent still waits.
        assert after.is_paused is False
        assert after.executor_pid is None
        assert dependent.status is S.PENDING
        assert store_steps.claim_next(conn, now + 1).id == task_id
        assert after.started_at == before.started_at
    else:
        assert dependent.status is S.PENDING
        assert store_steps.claim_next(conn, now + 1) is None


@pytest.mark.parametrize("pair", sorted(DISALLOWED), ids=_pair_id)
def test_disallowed_transition_changes_nothing(conn: sqlite3.Connection, pair: tuple[S, S]) -> None:
    source, target = pair
    task_id, _ = task_in(conn, source)
    before = snapshot(conn)

    with pytest.raises(InvalidTransition) as refused:
        tasks.transition(conn, task_id, target, now=T0 + 10, error="x", error_type="X")

    assert refused.value.task_id == task_id
    assert refused.value.current == source.value
    assert refused.value.target == target.value
    assert not conn.in_transaction
    assert snapshot(conn) == before


@pytest.mark.parametrize("status", list(S), ids=str)
def test_unknown_task_is_reported_and_nothing_changes(conn: sqlite3.Connection, status: S) -> None:
    task_in(conn, S.PENDING)
    before = snapshot(conn)
    with pytest.raises(UnknownTask):
        tasks.transition(conn, "00000000-0000-0000-0000-000000000000", status, now=T0 + 10)
    assert not conn.in_transaction
    assert snapshot(conn) == before


def test_start_refuses_a_task_that_is_not_claimed(conn: sqlite3.Connection) -> None:
    # pending → running is not in the table, and `start` also insists on `claimed`.
    task_id, _ = task_in(conn, S.PENDING)
    before = snapshot(conn)
    with pytest.raises(InvalidTransition):
        tasks.start(conn, task_id, now=T0 + 10)
    assert snapshot(conn) == before


def test_retry_refuses_a_pending_task(conn: sqlite3.Connection) -> None:
    task_id, _ = task_in(conn, S.PENDING)
    before = snapshot(conn)
    with pytest.raises(InvalidTransition):
        tasks.retry(conn, task_id, error="e", error_type="EXCEPTION", not_before=T0, now=T0 + 10)
    assert snapshot(conn) == before


def test_a_stale_snapshot_is_refused_and_changes_nothing(conn: sqlite3.Connection) -> None:
    # `known` saves reading the row first; the UPDATE must then insist on the snapshot's status,
    # not on any allowed source of the target, or the run's counters would move from the wrong one.
    task_id, dependent_id = task_in(conn, S.CLAIMED)
    claimed = tasks.get(conn, task_id)
    tasks.start(conn, task_id, now=T0 + 10)  # the row moves on; the snapshot does not
    before = snapshot(conn)
    with pytest.raises(InvalidTransition):
        tasks.fail(conn, task_id, error="e", error_type="EXCEPTION", now=T0 + 20, known=claimed)
    assert snapshot(conn) == before
    assert tasks.get(conn, task_id).status is S.RUNNING
    assert tasks.get(conn, dependent_id).status is S.PENDING  # no cascade from a failure refused
    assert_counters_match_rows(conn, claimed.workflow_run_id)


@pytest.mark.parametrize("back_to_pending", ["retry", "requeue"])
def test_started_at_keeps_the_first_start_across_a_retry(
    conn: sqlite3.Connection, back_to_pending: str
) -> None:
    task_id = tasks.submit(conn, [parse_spec({"type": "T", "max_retries": 3})], now=T0).tasks[0].id
    assert store_steps.claim_next(conn, T0 + 1).id == task_id
    first = tasks.start(conn, task_id, now=T0 + 2)
    assert first.started_at == T0 + 2
    if back_to_pending == "retry":
        again = tasks.retry(conn, task_id, error="flaky", error_type="EXCEPTION", not_before=T0 + 3, now=T0 + 3)
        assert again.retry_count == 1
        assert again.not_before == T0 + 3
    else:
        again = tasks.requeue(conn, task_id, now=T0 + 3)
        assert again.retry_count == 0
    assert again.status is S.PENDING
    assert again.started_at == T0 + 2
    assert again.completed_at is None

    reclaimed = store_steps.claim_next(conn, T0 + 4)
    assert reclaimed.id == task_id
    assert reclaimed.claimed_at == T0 + 4
    restarted = tasks.start(conn, task_id, now=T0 + 5)
    assert restarted.started_at == T0 + 2
    assert restarted.heartbeat_at == T0 + 5
    assert restarted.completed_at is None

    done = tasks.complete(conn, task_id, {"ok": True}, now=T0 + 6)
    assert done.started_at == T0 + 2
    assert done.completed_at == T0 + 6


@pytest.mark.parametrize("terminal", [S.COMPLETED, S.FAILED, S.CANCELLED], ids=str)
def test_completed_at_set_on_entering_a_terminal_state(conn: sqlite3.Connection, terminal: S) -> None:
    task_id, _ = task_in(conn, S.RUNNING)
    attempts.record_progress(conn, [(task_id, 40, "halfway")])
    running = tasks.get(conn, task_id)
    assert running.completed_at is None
    assert running.progress == 40

    ended = tasks.transition(conn, task_id, terminal, now=T0 + 7)

    assert ended.completed_at == T0 + 7
    assert ended.progress == (100 if terminal is S.COMPLETED else 40)
    # Terminal states never change again, so `completed_at` is set once.
    for target in S:
        with pytest.raises(InvalidTransition):
            tasks.transition(conn, task_id, target, now=T0 + 8)
    assert tasks.get(conn, task_id).completed_at == T0 + 7


def test_completed_from_claimed_sets_progress_and_result(conn: sqlite3.Connection) -> None:
    # claimed → completed is the "skipped" path (can_skip).
    task_id, _ = task_in(conn, S.CLAIMED)
    done = tasks.complete(conn, task_id, {"skipped": True}, now=T0 + 5)
    assert done.status is S.COMPLETED
    assert done.progress == 100
    assert done.result == {"skipped": True}
    assert done.started_at is None
    assert done.completed_at == T0 + 5


def test_leaving_running_clears_the_pause_flag(conn: sqlite3.Connection) -> None:
    task_id, _ = task_in(conn, S.RUNNING)
    assert attempts.set_paused(conn, task_id, True)
    assert tasks.get(conn, task_id).display_status == "paused"
    requeued = tasks.requeue(conn, task_id, now=T0 + 5)
    assert requeued.is_paused is False
    assert requeued.display_status == "waiting"
