"""Claiming (SPEC §5): order, readiness (dependencies, not-before), failure propagation, atomicity."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

from daemon import models
from daemon.models import TaskStatus as S
from daemon.store import db, runs, task_reads, tasks
from daemon.submission import parse_spec
from tests import store_steps
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 5_000.0


def submit(conn: sqlite3.Connection, *lines: dict[str, Any], now: float = T0) -> list[str]:
    """Submit `lines` as one batch; the ids in order."""
    return [t.id for t in tasks.submit(conn, [parse_spec(line) for line in lines], now=now).tasks]


def claim_all(conn: sqlite3.Connection, now: float) -> list[str]:
    """Claim until nothing is ready; the ids in claim order."""
    claimed = []
    while (task := store_steps.claim_next(conn, now)) is not None:
        assert task.status is S.CLAIMED
        claimed.append(task.id)
    return claimed


def finish(conn: sqlite3.Connection, task_id: str, now: float) -> None:
    """Run a claimed task to completion."""
    tasks.start(conn, task_id, now=now)
    tasks.complete(conn, task_id, {"done": task_id}, now=now)


def rows_of(conn: sqlite3.Connection, ids: list[str]) -> list[tuple]:
    marks = ", ".join("?" * len(ids))
    return [tuple(r) for r in conn.execute(f"SELECT * FROM task WHERE id IN ({marks}) ORDER BY seq", ids)]


def run_row(conn: sqlite3.Connection, run_id: str) -> tuple:
    return tuple(conn.execute("SELECT * FROM workflow_run WHERE id = ?", (run_id,)).fetchone())


# --- order --------------------------------------------------------------------------------------


def test_higher_priority_first_then_strict_submission_order(conn: sqlite3.Connection) -> None:
    # 60 tasks with interleaved priorities, all submitted in the same second: some one per
    # submission, some in batches. Random UUIDs and equal created_at make any other order visible.
    priorities = [(i * 7) % 5 - 2 for i in range(60)]
    submitted: list[tuple[int, str]] = []
    index = 0
    while index < len(priorities):
        size = 1 if index % 3 else 4
        chunk = priorities[index : index + size]
        ids = submit(conn, *({"type": "T", "priority": p} for p in chunk), now=T0)
        submitted += zip(chunk, ids)
        index += size
    expected = [task_id for _, task_id in sorted(submitted, key=lambda pi: -pi[0])]  # stable sort

    assert claim_all(conn, T0) == expected


def test_several_tasks_are_claimed_at_once_in_claim_order(conn: sqlite3.Connection) -> None:
    ids = submit(conn, *({"type": "T", "priority": p} for p in (0, 5, 1, 5, 0)))
    assert tasks.claim_ready(conn, T0, 0) == []
    first = tasks.claim_ready(conn, T0, 3)
    assert [t.id for t in first] == [ids[1], ids[3], ids[2]]
    assert all(t.status is S.CLAIMED and t.claimed_at == T0 for t in first)
    run = runs.get(conn, first[0].workflow_run_id)
    assert (run.counts.claimed, run.counts.pending) == (3, 2)
    assert [t.id for t in tasks.claim_ready(conn, T0, 10)] == [ids[0], ids[4]]  # only what is left
    assert tasks.claim_ready(conn, T0, 10) == []


def test_claim_returns_none_when_nothing_is_ready(conn: sqlite3.Connection) -> None:
    assert store_steps.claim_next(conn, T0) is None  # empty database
    first, second = submit(conn, {"type": "A", "key": "a"}, {"type": "B", "depends_on": ["a"]})
    assert store_steps.claim_next(conn, T0).id == first
    tasks.start(conn, first, now=T0)
    # One task running, its dependent blocked: nothing is ready.
    assert store_steps.claim_next(conn, T0 + 1) is None
    assert tasks.get(conn, second).status is S.PENDING


def test_a_claimed_task_is_never_claimed_again(conn: sqlite3.Connection) -> None:
    (only,) = submit(conn, {"type": "T"})
    claimed = store_steps.claim_next(conn, T0)
    assert claimed.id == only
    assert claimed.claimed_at == T0
    assert store_steps.claim_next(conn, T0 + 1) is None
    # Still the first claim's record.
    assert tasks.get(conn, only).claimed_at == T0


def test_claim_skips_a_task_until_its_not_before_time(conn: sqlite3.Connection) -> None:
    urgent, routine = submit(conn, {"type": "U", "priority": 10, "max_retries": 2}, {"type": "R"})
    assert store_steps.claim_next(conn, T0).id == urgent
    tasks.start(conn, urgent, now=T0)
    tasks.retry(conn, urgent, error="flaky", error_type="EXCEPTION", not_before=T0 + 60, now=T0 + 1)
    assert tasks.next_ready_at(conn) == T0 + 60  # when the delayed retry becomes claimable

    # The higher-priority retry waits; the lower-priority task goes first.
    assert store_steps.claim_next(conn, T0 + 2).id == routine
    assert store_steps.claim_next(conn, T0 + 59.9) is None
    assert tasks.next_ready_at(conn) == T0 + 60
    again = store_steps.claim_next(conn, T0 + 60)
    assert again.id == urgent
    assert again.retry_count == 1
    assert tasks.next_ready_at(conn) is None  # nothing waits out a delay any more


def test_delayed_retries_are_not_in_the_ready_index(conn: sqlite3.Connection) -> None:
    # Claiming reads only the partial index of claimable tasks: a task waiting out its retry delay
    # is kept in another index until its time comes, so many of them cannot slow claiming down.
    (task_id,) = submit(conn, {"type": "U", "max_retries": 1})
    store_steps.claim_next(conn, T0)
    tasks.start(conn, task_id, now=T0)
    tasks.retry(conn, task_id, error="e", error_type="EXCEPTION", not_before=T0 + 5, now=T0)
    in_ready = conn.execute("SELECT count(*) FROM task INDEXED BY task_ready "
                            "WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0 AND is_held = 0").fetchone()[0]
    assert in_ready == 0
    assert store_steps.claim_next(conn, T0 + 5).id == task_id


# --- dependencies -------------------------------------------------------------------------------


def test_dependency_across_runs(conn: sqlite3.Connection) -> None:
    (upstream,) = submit(conn, {"type": "A"})
    (downstream,) = submit(conn, {"type": "B", "depends_on": [upstream], "priority": 100})
    run1, run2 = tasks.get(conn, upstream).workflow_run_id, tasks.get(conn, downstream).workflow_run_id
    assert run1 != run2

    assert claim_all(conn, T0) == [upstream]
    tasks.start(conn, upstream, now=T0 + 1)
    assert store_steps.claim_next(conn, T0 + 2) is None
    tasks.complete(conn, upstream, {"n": 1}, now=T0 + 3)
    assert store_steps.claim_next(conn, T0 + 4).id == downstream
    assert task_reads.results_of(conn, list(tasks.get(conn, downstream).depends_on)) == {upstream: {"n": 1}}


def test_dependency_across_runs_failure_cancels_the_other_run(conn: sqlite3.Connection) -> None:
    (upstream,) = submit(conn, {"type": "A"})
    (downstream,) = submit(conn, {"type": "B", "depends_on": [upstream]})
    store_steps.claim_next(conn, T0)
    tasks.fail(conn, upstream, error="no", error_type="EXCEPTION", now=T0 + 1)
    cancelled = tasks.get(conn, downstream)
    assert cancelled.status is S.CANCELLED
    assert cancelled.error_type == models.DEPENDENCY_FAILED
    assert runs.get(conn, cancelled.workflow_run_id).status.value == "cancelled"


def test_diamond(conn: sqlite3.Connection) -> None:
    a, b, c, d = submit(
        conn,
        {"type": "A", "key": "a"},
        {"type": "B", "key": "b", "depends_on": ["a"]},
        {"type": "C", "key": "c", "depends_on": ["a"]},
        {"type": "D", "depends_on": ["b", "c"], "priority": 50},
    )
    assert claim_all(conn, T0) == [a]
    finish(conn, a, T0 + 1)
    assert claim_all(conn, T0 + 2) == [b, c]
    finish(conn, b, T0 + 3)
    assert store_steps.claim_next(conn, T0 + 4) is None  # C is not done yet
    tasks.start(conn, c, now=T0 + 5)
    assert store_steps.claim_next(conn, T0 + 6) is None
    tasks.complete(conn, c, {}, now=T0 + 7)
    assert claim_all(conn, T0 + 8) == [d]


def test_chain_failure_cancels_everything_downstream_in_the_same_call(conn: sqlite3.Connection) -> None:
    chain = [{"type": "STEP", "key": "s0"}] + [
        {"type": "STEP", "key": f"s{i}", "depends_on": [f"s{i - 1}"]} for i in range(1, 50)
    ]
    ids = submit(conn, *chain)
    # Lower priority, so that the chain's ready task is always the one claimed below.
    unrelated = submit(
        conn, {"type": "X", "key": "x", "priority": -1}, {"type": "Y", "depends_on": ["x"]}, now=T0 + 0.5
    )
    middle = 25
    now = T0 + 1
    for i in range(middle):
        assert store_steps.claim_next(conn, now).id == ids[i]
        finish(conn, ids[i], now)
        now += 1
    assert store_steps.claim_next(conn, now).id == ids[middle]
    tasks.start(conn, ids[middle], now=now)
    upstream_before = rows_of(conn, ids[:middle])
    unrelated_before = rows_of(conn, unrelated)
    unrelated_run = tasks.get(conn, unrelated[0]).workflow_run_id
    unrelated_run_before = run_row(conn, unrelated_run)

    failed = tasks.fail(conn, ids[middle], error="bad input", error_type="EXCEPTION", now=now + 1)

    assert failed.status is S.FAILED
    for task_id in ids[middle + 1 :]:
        task = tasks.get(conn, task_id)
        assert task.status is S.CANCELLED, task_id
        assert task.error_type == models.DEPENDENCY_FAILED
        assert task.completed_at == now + 1
    assert rows_of(conn, ids[:middle]) == upstream_before
    assert rows_of(conn, unrelated) == unrelated_before
    assert run_row(conn, unrelated_run) == unrelated_run_before
    run = runs.get(conn, failed.workflow_run_id)
    assert run.status.value == "failed"
    assert run.counts == models.RunCounts(completed=middle, failed=1, cancelled=50 - middle - 1)
    assert run.completed_at == now + 1
    # Only the unrelated run's first task is left to claim.
    assert claim_all(conn, now + 2) == [unrelated[0]]


# --- atomicity across connections ---------------------------------------------------------------


def test_two_connections_never_claim_the_same_task(database: str | Path, conn: sqlite3.Connection) -> None:
    ids = submit(conn, *({"type": "T", "priority": i % 3} for i in range(40)))
    other = db.open_database(database)
    try:
        seen: list[str] = []
        for turn in range(50):
            claimer = conn if turn % 2 == 0 else other
            task = store_steps.claim_next(claimer, T0)
            if task is not None:
                seen.append(task.id)
        assert sorted(seen) == sorted(ids)
        assert len(set(seen)) == len(seen)
    finally:
        other.close()


def _claim_worker(path: str, barrier: Any, results: Any) -> None:
    conn = db.open_database(path)
    barrier.wait(timeout=30)
    claimed = []
    while (task := store_steps.claim_next(conn, T0)) is not None:
        claimed.append(task.id)
    conn.close()
    results.put(claimed)


def test_processes_never_claim_the_same_task(database: str | Path, conn: sqlite3.Connection) -> None:
    # Four processes rather than two: with two, a claim that is not atomic slips through too often.
    ids = submit(conn, *({"type": "T"} for _ in range(400)))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    workers = [ctx.Process(target=_claim_worker, args=(str(database), barrier, results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        claimed = [results.get(timeout=60) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():  # a stuck worker must not outlive the test
                worker.kill()
    assert [worker.exitcode for worker in workers] == [0] * 4
    everything = [task_id for ids_of_one in claimed for task_id in ids_of_one]
    assert len(set(everything)) == len(everything), "a task was claimed twice"
    assert sorted(everything) == sorted(ids)
    assert {t.status for t in task_reads.list_tasks(conn)} == {S.CLAIMED}
