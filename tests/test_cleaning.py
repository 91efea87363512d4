"""Removing finished runs (SPEC §14 `fredica clean`), in the store, on each backend (a real
SQLite file, the real PostgreSQL server): what goes (the run, its tasks, their edges and
restart-log entries) and what stays (an unfinished run, a run younger than the cutoff, a run whose
task an unfinished task depends on), in chunks."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from daemon import durations
from daemon.errors import BadDuration
from daemon.models import TaskStatus
from daemon.store import cancels, cleaning, db, restarts, runs, task_reads, tasks
from daemon.submission import parse_spec
from tests import store_steps
from tests.conformance import conn  # noqa: F401 (every test on every backend)

DAY = 86400.0
T0 = 1_000_000.0


def submit(conn: sqlite3.Connection, *specs: dict[str, Any], now: float = T0) -> list[str]:
    """One run of `specs`; the new tasks' ids."""
    submission = tasks.submit(conn, [parse_spec({"type": "ECHO", **spec}) for spec in specs], now=now)
    return [task.id for task in submission.tasks]


def finish(conn: sqlite3.Connection, now: float, status: TaskStatus = TaskStatus.COMPLETED, count: int = 1) -> None:
    """Claim the next `count` ready tasks and end each with `status`."""
    for _ in range(count):
        task = store_steps.claim_next(conn, now)
        assert task is not None
        tasks.start(conn, task.id, now=now)
        if status is TaskStatus.COMPLETED:
            tasks.complete(conn, task.id, {"ok": True}, now=now)
        elif status is TaskStatus.FAILED:
            tasks.fail(conn, task.id, error="boom", error_type="EXCEPTION", now=now)
        else:
            cancels.cancel(conn, task.id, now=now)


def run_of(conn: sqlite3.Connection, task_id: str) -> str:
    return tasks.get(conn, task_id).workflow_run_id


def rows(conn: sqlite3.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_finished_run_goes_with_its_tasks_edges_and_restart_log_entries(conn: sqlite3.Connection) -> None:
    first, second = submit(conn, {"key": "a"}, {"key": "b", "depends_on": ["a"]})
    finish(conn, T0 + 1, count=2)
    entry_task = tasks.get(conn, first)
    restarts.record(conn, "session-1", [entry_task], now=T0 + 1)
    assert rows(conn, "task_dependency") == 1

    removed = cleaning.remove_chunk(conn, cutoff=T0 + 2)

    assert (removed.runs, set(removed.task_ids), removed.more) == (1, {first, second}, False)
    for table in ("task", "workflow_run", "task_dependency", "restart_task_log"):
        assert rows(conn, table) == 0, table


def test_unfinished_and_younger_runs_stay(conn: sqlite3.Connection) -> None:
    [old] = submit(conn, {})
    finish(conn, T0 + 1)
    [young] = submit(conn, {}, now=T0 + 5)
    finish(conn, T0 + 10)
    # Failed already (one task failed), but its other task still waits: not finished.
    failed_first, waiting = submit(conn, {}, {}, now=T0 + 11)
    finish(conn, T0 + 12, TaskStatus.FAILED)
    assert runs.get(conn, run_of(conn, waiting)).status.value == "failed"

    removed = cleaning.remove_chunk(conn, cutoff=T0 + 5)

    assert removed.task_ids == (old,)
    assert {t.id for t in task_reads.list_tasks(conn)} == {young, failed_first, waiting}
    assert cleaning.remove_chunk(conn, cutoff=T0 + 100).task_ids == (young,)  # the failed run is not finished


def test_a_run_an_unfinished_task_of_another_run_depends_on_stays_until_that_task_ends(
    conn: sqlite3.Connection,
) -> None:
    upstream, blocker = submit(conn, {}, {})
    finish(conn, T0 + 1, count=1)  # `upstream` completed; the run waits on `blocker`
    [downstream] = submit(conn, {"depends_on": [upstream, blocker]}, now=T0 + 2)
    finish(conn, T0 + 3, TaskStatus.CANCELLED)  # `blocker`: its run ends; `downstream` is cancelled with it
    assert tasks.get(conn, downstream).status is TaskStatus.CANCELLED

    # A third run depends on `upstream` and has not run yet: its run must stay.
    [later] = submit(conn, {"depends_on": [upstream]}, now=T0 + 4)
    assert cleaning.remove_chunk(conn, cutoff=T0 + 100).task_ids == (downstream,)
    assert tasks.find(conn, upstream) is not None

    finish(conn, T0 + 5)  # `later` ends: nothing unfinished depends on `upstream` now
    removed = cleaning.remove_chunk(conn, cutoff=T0 + 100)
    assert set(removed.task_ids) == {upstream, blocker, later}
    assert rows(conn, "task") == rows(conn, "task_dependency") == rows(conn, "workflow_run") == 0


def test_status_limits_the_runs_cleaned_to_those_that_ended_so(conn: sqlite3.Connection) -> None:
    [done] = submit(conn, {})
    finish(conn, T0)
    [broke] = submit(conn, {})
    finish(conn, T0, TaskStatus.FAILED)
    [stopped] = submit(conn, {})
    finish(conn, T0, TaskStatus.CANCELLED)

    assert cleaning.remove_chunk(conn, cutoff=T0 + 1, status="failed").task_ids == (broke,)
    assert cleaning.remove_chunk(conn, cutoff=T0 + 1, status="cancelled").task_ids == (stopped,)
    assert cleaning.remove_chunk(conn, cutoff=T0 + 1, status="completed").task_ids == (done,)
    with pytest.raises(ValueError):
        cleaning.remove_chunk(conn, cutoff=T0 + 1, status="running")


def test_chunks_hold_at_most_the_limit_and_a_large_run_goes_over_several_its_row_last(
    conn: sqlite3.Connection,
) -> None:
    big = submit(conn, *[{} for _ in range(7)])
    small = [submit(conn, {})[0] for _ in range(3)]
    finish(conn, T0 + 1, count=10)
    big_run = run_of(conn, big[0])

    chunks = []
    while True:
        removed = cleaning.remove_chunk(conn, cutoff=T0 + 2, limit=3)
        chunks.append(removed)
        assert removed.tasks <= 3
        if not removed.more:
            break
        if runs.find(conn, big_run) is not None:
            assert task_reads.list_tasks(conn, run_id=big_run), "a run's row goes with its last tasks, not before"

    assert sorted(t for c in chunks for t in c.task_ids) == sorted(big + small)
    assert sum(c.runs for c in chunks) == 4
    assert rows(conn, "task") == rows(conn, "workflow_run") == 0


def test_preview_counts_what_the_chunks_remove_and_changes_nothing(conn: sqlite3.Connection) -> None:
    submit(conn, {}, {})
    submit(conn, {})
    finish(conn, T0, count=3)
    submit(conn, {})  # waiting

    found = cleaning.preview(conn, cutoff=T0 + 1)

    assert (found.runs, found.tasks) == (2, 3)
    assert rows(conn, "task") == 4


def test_the_idempotency_key_of_a_cleaned_task_is_free(conn: sqlite3.Connection) -> None:
    # Free already while the task was kept (it had ended, SPEC §10); removing it changes nothing.
    [first] = submit(conn, {"idempotency_key": "k"})
    finish(conn, T0)
    cleaning.remove_chunk(conn, cutoff=T0 + 1)
    [again] = submit(conn, {"idempotency_key": "k"}, now=T0 + 2)
    assert again != first and tasks.get(conn, again).status is TaskStatus.PENDING


def worst_chunk_work(path: Any, total: int, per_run: int | None) -> int:
    """Finished tasks in runs of `per_run` (None: one run of all), written directly (submitting
    them would take most of the test), the first half of the runs finished before the cutoff and
    the rest after; clean to the cutoff chunk by chunk. The most SQLite virtual-machine steps one
    chunk took (in thousands): the work itself, which a loaded machine does not change."""
    conn = db.open_database(path)
    per_run = per_run or total
    count = total // per_run
    conn.execute("BEGIN IMMEDIATE")
    for number in range(count):
        run_id = runs.create(conn, template="adhoc", material_id=None, now=T0, tasks=0)
        conn.executemany(
            "INSERT INTO task (id, type, workflow_run_id, status, created_at, completed_at)"
            " VALUES (?, 'ECHO', ?, 'completed', ?, ?)",
            [(f"{number:06d}-{n:06d}", run_id, T0, T0) for n in range(per_run)],
        )
        conn.execute(
            "UPDATE workflow_run SET status = 'completed', total_tasks = ?, pending_tasks = 0,"
            " done_tasks = ?, completed_at = ? WHERE id = ?", (per_run, per_run, T0 + number, run_id),
        )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    steps = [0]
    conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 1000)
    worst, removed = 0, 0
    while True:
        steps[0] = 0
        chunk = cleaning.remove_chunk(conn, cutoff=T0 + count / 2)
        worst = max(worst, steps[0])
        removed += chunk.tasks
        if not chunk.more:
            break
    assert removed == (count + 1) // 2 * per_run and rows(conn, "task") == total - removed
    conn.close()
    return worst


# Not one run of them all: a chunk of a run's tasks checks that no active task depends on any task
# of that run, which reads all of the run's tasks (2.5x the work at 4x the run).
@pytest.mark.parametrize("per_run", [1, 100], ids=["runs of 1", "runs of 100"])
def test_a_chunk_does_the_same_work_however_many_tasks_are_kept(tmp_path: Any, per_run: int | None) -> None:
    # The note measures the time of a chunk at 100,000 tasks; here its work, counted in SQLite's
    # steps (a time would only measure the machine's load): four times the finished tasks, and no
    # chunk does more than a little more work, where one that looked at every run would do 4x.
    small = worst_chunk_work(tmp_path / "small.db", 5_000, per_run)
    large = worst_chunk_work(tmp_path / "large.db", 20_000, per_run)
    print(f"runs of {per_run}: worst chunk of {cleaning.CHUNK} tasks: {small}k steps at 5,000, {large}k at 20,000")
    assert large < 1.5 * small + 10


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 7 * DAY),
                                           ("2w", 14 * DAY), ("0", 0), ("1.5h", 5400), ("45", 45)])
def test_durations_as_people_write_them(text: str, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("text", ["", "7x", "-1d", "d", "1e9", "inf", "100000w"])
def test_a_bad_duration_is_refused_in_one_line_naming_it(text: str) -> None:
    with pytest.raises(BadDuration) as caught:
        durations.parse(text)
    assert repr(text) in caught.value.message and "\n" not in caught.value.message
