"""Workflow-run status (SPEC §4): the five rules, and the counters kept on the run row."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from daemon import models, scheduler
from daemon.errors import UnknownRun
from daemon.models import RunCounts, RunStatus
from daemon.models import TaskStatus as S
from daemon.store import cancels, db, runs, tasks
from tests import store_steps
from tests.conformance import conn  # noqa: F401 (every test on every backend)
from daemon.submission import TaskSpec

T0 = 4_000.0
ACTIVE = (S.PENDING, S.CLAIMED, S.RUNNING)


def spec_status(statuses: list[S]) -> RunStatus:
    """SPEC §4 read literally, over the list of the run's task statuses."""
    if not statuses:
        return RunStatus.FAILED  # "A run with no tasks ... becomes failed"
    if any(s is S.FAILED for s in statuses):
        return RunStatus.FAILED
    if all(s is S.COMPLETED for s in statuses):
        return RunStatus.COMPLETED
    finished = (S.COMPLETED, S.CANCELLED)
    if any(s in (S.CLAIMED, S.RUNNING) for s in statuses) or (
        any(s is S.PENDING for s in statuses) and any(s in finished for s in statuses)
    ):
        return RunStatus.RUNNING
    if all(s is S.PENDING for s in statuses):
        return RunStatus.PENDING
    assert set(statuses) <= {S.COMPLETED, S.CANCELLED}
    return RunStatus.CANCELLED


ORDER = (S.PENDING, S.CLAIMED, S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED)


@pytest.mark.parametrize("pending", range(3))
def test_run_status_every_mix_up_to_two_of_each(pending: int) -> None:
    checked = 0
    for claimed, running, completed, failed, cancelled in itertools.product(range(3), repeat=5):
        counts = RunCounts(pending, claimed, running, completed, failed, cancelled)
        numbers = (pending, claimed, running, completed, failed, cancelled)
        statuses = [status for status, n in zip(ORDER, numbers) for _ in range(n)]
        assert scheduler.run_status(counts) is spec_status(statuses), counts
        checked += 1
    assert checked == 3**5


# --- on the database -----------------------------------------------------------------------------


def run_row(conn: sqlite3.Connection, run_id: str) -> tuple:
    """The whole stored row, every counter included."""
    return tuple(conn.execute("SELECT * FROM workflow_run WHERE id = ?", (run_id,)).fetchone())


def build_run(conn: sqlite3.Connection, statuses: list[S]) -> tuple[str, list[str], float | None]:
    """A run of independent tasks driven into `statuses`, one task after the other.

    Returns the run id, the task ids, and the `now` at which its last active task ended (None if
    one is left).
    """
    sub = tasks.submit(conn, [TaskSpec(type=f"T{i}") for i in range(len(statuses))], now=T0)
    ids = [t.id for t in sub.tasks]
    now = T0
    for task_id, status in zip(ids, statuses):
        steps = {
            S.PENDING: [],
            S.CLAIMED: [S.CLAIMED],
            S.RUNNING: [S.CLAIMED, S.RUNNING],
            S.COMPLETED: [S.CLAIMED, S.RUNNING, S.COMPLETED],
            S.FAILED: [S.CLAIMED, S.RUNNING, S.FAILED],
            S.CANCELLED: [S.CANCELLED],
        }[status]
        for step in steps:
            now += 1
            tasks.transition(conn, task_id, step, now=now)
    ended_at = now if not any(s in ACTIVE for s in statuses) else None
    return sub.run_id, ids, ended_at


MIXES = {
    "all pending": [S.PENDING, S.PENDING],
    "one claimed": [S.PENDING, S.CLAIMED],
    "one running": [S.RUNNING, S.PENDING],
    "running alone": [S.RUNNING],
    "pending beside completed": [S.COMPLETED, S.PENDING],
    "pending beside cancelled": [S.CANCELLED, S.PENDING],
    "all completed": [S.COMPLETED, S.COMPLETED, S.COMPLETED],
    "completed and cancelled": [S.COMPLETED, S.CANCELLED],
    "all cancelled": [S.CANCELLED, S.CANCELLED],
    "failed beside running": [S.FAILED, S.RUNNING],
    "failed beside pending": [S.PENDING, S.FAILED],
    "failed beside completed": [S.COMPLETED, S.FAILED, S.CANCELLED],
    "everything": [S.PENDING, S.CLAIMED, S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED],
}


@pytest.mark.parametrize("statuses", MIXES.values(), ids=MIXES.keys())
def test_stored_run_follows_its_tasks(conn: sqlite3.Connection, statuses: list[S]) -> None:
    run_id, _, ended_at = build_run(conn, statuses)
    run = runs.get(conn, run_id)

    assert run.status is spec_status(statuses)
    assert run.total_tasks == len(statuses)
    assert run.done_tasks == statuses.count(S.COMPLETED)
    assert run.counts == RunCounts(*(statuses.count(s) for s in ORDER))
    assert run.completed_at == ended_at

    # Recomputing from the task rows finds exactly what was maintained step by step, and a
    # `completed_at` once set does not move.
    incremental = run_row(conn, run_id)
    store_steps.recompute(conn, run_id, now=T0 + 999)
    assert run_row(conn, run_id) == incremental


def test_completed_at_is_set_when_the_last_active_task_ends(conn: sqlite3.Connection) -> None:
    run_id, (a, b), _ = build_run(conn, [S.RUNNING, S.RUNNING])
    tasks.fail(conn, a, error="x", error_type="EXCEPTION", now=T0 + 10)
    run = runs.get(conn, run_id)
    assert run.status is RunStatus.FAILED
    assert run.completed_at is None  # b still runs
    tasks.complete(conn, b, {}, now=T0 + 11)
    run = runs.get(conn, run_id)
    assert run.status is RunStatus.FAILED
    assert run.completed_at == T0 + 11


def test_retry_keeps_the_run_running(conn: sqlite3.Connection) -> None:
    run_id, (a,), _ = build_run(conn, [S.RUNNING])
    tasks.retry(conn, a, error="x", error_type="EXCEPTION", not_before=T0 + 50, now=T0 + 10)
    run = runs.get(conn, run_id)
    assert run.status is RunStatus.PENDING  # its only task waits again
    assert run.completed_at is None
    assert run.counts == RunCounts(pending=1)


def test_cascade_moves_the_counters_of_every_run_it_touches(conn: sqlite3.Connection) -> None:
    (up,) = tasks.submit(conn, [TaskSpec(type="UP")], now=T0).tasks
    down = tasks.submit(conn, [TaskSpec(type="DOWN", depends_on=(up.id,)), TaskSpec(type="FREE")], now=T0)
    cancels.cancel(conn, up.id, now=T0 + 1)
    run = runs.get(conn, down.run_id)
    assert run.counts == RunCounts(pending=1, cancelled=1)
    assert run.status is RunStatus.RUNNING  # pending beside a finished task
    assert store_steps.recompute(conn, down.run_id, now=T0 + 2) == run


def test_reconcile_fixes_counters_corrupted_by_hand(conn: sqlite3.Connection) -> None:
    busy_id, _, _ = build_run(conn, [S.PENDING, S.RUNNING, S.COMPLETED])
    done_id, _, _ = build_run(conn, [S.COMPLETED, S.COMPLETED])
    finished_id, _, _ = build_run(conn, [S.COMPLETED])
    good = {run_id: run_row(conn, run_id) for run_id in (busy_id, done_id, finished_id)}
    conn.execute(
        """UPDATE workflow_run SET total_tasks = 9, pending_tasks = 0, running_tasks = 0, done_tasks = 7,
           failed_tasks = 2, status = 'pending', completed_at = 1 WHERE id = ?""",
        (busy_id,),
    )
    # Counters say nothing finished and the status says running, though every task completed.
    conn.execute(
        """UPDATE workflow_run SET done_tasks = 0, pending_tasks = 2, status = 'running',
           completed_at = NULL WHERE id = ?""",
        (done_id,),
    )

    with db.write(conn):
        reconciled = runs.reconcile_non_terminal(conn, now=T0 + 100)

    assert {run.id for run in reconciled} == {busy_id, done_id}  # terminal runs are left alone
    busy = runs.get(conn, busy_id)
    assert run_row(conn, busy_id) == good[busy_id]
    assert busy.status is RunStatus.RUNNING and busy.completed_at is None
    done = runs.get(conn, done_id)
    assert done.status is RunStatus.COMPLETED
    assert done.counts == RunCounts(completed=2)
    assert done.completed_at == T0 + 100
    assert run_row(conn, finished_id) == good[finished_id]


def test_run_without_tasks_becomes_failed(conn: sqlite3.Connection) -> None:
    with db.write(conn):
        run_id = runs.create(conn, template="adhoc", material_id=None, now=T0)
    assert runs.get(conn, run_id).status is RunStatus.PENDING

    with db.write(conn):
        (run,) = runs.reconcile_non_terminal(conn, now=T0 + 5)

    assert run.id == run_id
    assert run.status is RunStatus.FAILED
    assert run.total_tasks == 0
    assert run.completed_at == T0 + 5
    assert runs.get(conn, run_id) == run


def test_cancel_waiting_in_run(conn: sqlite3.Connection) -> None:
    specs = [
        TaskSpec(type="P"),
        TaskSpec(type="C"),
        TaskSpec(type="R", key="r"),
        TaskSpec(type="D"),
        TaskSpec(type="AFTER_R", depends_on=("r",)),
    ]
    sub = tasks.submit(conn, specs, now=T0)
    pending, claimed, running, done, after_running = (t.id for t in sub.tasks)
    (other,) = tasks.submit(conn, [TaskSpec(type="ELSEWHERE", depends_on=(claimed,))], now=T0).tasks
    tasks.transition(conn, claimed, S.CLAIMED, now=T0 + 1)
    tasks.transition(conn, running, S.CLAIMED, now=T0 + 1)
    tasks.start(conn, running, now=T0 + 2)
    tasks.transition(conn, done, S.CLAIMED, now=T0 + 1)
    tasks.complete(conn, done, {}, now=T0 + 2)

    outcome = cancels.cancel_waiting_in_run(conn, sub.run_id, now=T0 + 3)

    assert outcome.cancelled == (pending, claimed, after_running)
    assert outcome.running == (running,)
    for task_id in outcome.cancelled:
        task = tasks.get(conn, task_id)
        assert task.status is S.CANCELLED
        assert task.error_type == models.CANCELLED
        assert task.completed_at == T0 + 3
    assert tasks.get(conn, running).status is S.RUNNING
    assert tasks.get(conn, done).status is S.COMPLETED
    # A dependent in another run is cancelled because its upstream was.
    assert tasks.get(conn, other.id).status is S.CANCELLED
    assert tasks.get(conn, other.id).error_type == models.DEPENDENCY_FAILED

    run = runs.get(conn, sub.run_id)
    assert run.status is RunStatus.RUNNING  # the running task has yet to stop
    assert run.completed_at is None
    cancels.cancel(conn, running, now=T0 + 4)
    run = runs.get(conn, sub.run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.counts == RunCounts(completed=1, cancelled=4)
    assert run.completed_at == T0 + 4


def test_cancel_waiting_in_an_unknown_run(conn: sqlite3.Connection) -> None:
    with pytest.raises(UnknownRun):
        cancels.cancel_waiting_in_run(conn, "no-such-run", now=T0)


def test_runs_are_listed_newest_first_those_of_one_instant_by_id(conn: sqlite3.Connection) -> None:
    """On both backends: SQLite's rowid, the old tie-break, is no column on PostgreSQL."""
    at_first = [tasks.submit(conn, [TaskSpec(type="A")], now=T0).run_id for _ in range(3)]
    later = [tasks.submit(conn, [TaskSpec(type="B")], now=T0 + 1).run_id for _ in range(2)]
    store_steps.claim_next(conn, T0 + 2)  # one of the first runs is running now

    listed = [run.id for run in runs.list_runs(conn)]

    assert listed == sorted(later, reverse=True) + sorted(at_first, reverse=True)
    assert [run.id for run in runs.list_runs(conn, limit=3)] == listed[:3]
    pending = [run.id for run in runs.list_runs(conn, status=RunStatus.PENDING.value)]
    assert len(pending) == 4 and pending == [run_id for run_id in listed if run_id in pending]
