"""Workflow-run repository: creation, the status that follows its tasks, reconciliation.

A run's status is never written by callers. Its per-status task counters move in the same
transaction as every task transition (`shift_counts`), and the status is derived from them by
`scheduler.run_status`; `reconcile_non_terminal` rebuilds them from the task rows themselves.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import sqlite3
import uuid
from typing import Iterable

from daemon import scheduler
from daemon.errors import UnknownRun
from daemon.models import RunCounts, RunStatus, TaskStatus, WorkflowRun
from daemon.store import backend, db
from daemon.store.db import write

COUNT_COLUMN = {
    TaskStatus.PENDING: "pending_tasks",
    TaskStatus.CLAIMED: "claimed_tasks",
    TaskStatus.RUNNING: "running_tasks",
    TaskStatus.COMPLETED: "done_tasks",
    TaskStatus.FAILED: "failed_tasks",
    TaskStatus.CANCELLED: "cancelled_tasks",
}
NON_TERMINAL_RUN_STATUSES = (RunStatus.PENDING.value, RunStatus.RUNNING.value)

_NAMES_RUNS = re.compile(r"\bworkflow_run\b")


def _names_runs(sql: str) -> bool:
    """Whether `sql` reads or changes the runs' table (cached: a few dozen statements, each run
    thousands of times a second in a burst; a long one, a batch's, is searched each time rather
    than kept alive by the cache)."""
    return _names_runs_cached(sql) if len(sql) <= 2048 else _NAMES_RUNS.search(sql) is not None


@functools.lru_cache(maxsize=256)
def _names_runs_cached(sql: str) -> bool:
    return _NAMES_RUNS.search(sql) is not None

# A shift of `count` tasks of one run from one status to another.
Shift = tuple[str, TaskStatus, TaskStatus]


def create(conn: sqlite3.Connection, *, template: str, material_id: str | None, now: float, tasks: int = 0) -> str:
    """Insert a run counting `tasks` pending tasks (inserted next, in the same transaction): a run
    whose tasks are all pending is `pending` (SPEC §4), so nothing is left to derive. Tasks counted
    here that were never inserted are taken back with `add_tasks` (negative), an empty run with
    `delete_empty`."""
    run_id = str(uuid.uuid4())
    # Nothing can refuse it but what fails the whole transaction (a fresh uuid, no foreign key),
    # and its tasks' inserts come next: on PostgreSQL it goes with the first of them.
    db.execute_later(
        conn,
        "INSERT INTO workflow_run (id, material_id, template, status, created_at, total_tasks, pending_tasks)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (run_id, material_id, template, RunStatus.PENDING.value, now, tasks, tasks),
    )
    return run_id


def add_tasks(conn: sqlite3.Connection, run_id: str, count: int, now: float) -> None:
    """Count `count` freshly inserted pending tasks into the run (negative: take back tasks counted
    by `create` that were not inserted)."""
    conn.execute(
        "UPDATE workflow_run SET total_tasks = total_tasks + ?, pending_tasks = pending_tasks + ? WHERE id = ?",
        (count, count, run_id),
    )
    refresh_status(conn, [run_id], now)


def delete_empty(conn: sqlite3.Connection, run_id: str) -> None:
    """Drop a run that received no task (every task of its submission was a duplicate)."""
    conn.execute(
        "DELETE FROM workflow_run WHERE id = ? AND NOT EXISTS (SELECT 1 FROM task WHERE workflow_run_id = ?)",
        (run_id, run_id),
    )


def find(conn: sqlite3.Connection, run_id: str) -> WorkflowRun | None:
    row = conn.execute("SELECT * FROM workflow_run WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else WorkflowRun.from_row(row)


def get(conn: sqlite3.Connection, run_id: str) -> WorkflowRun:
    run = find(conn, run_id)
    if run is None:
        raise UnknownRun(f"no workflow run has id {run_id}")
    return run


def list_runs(
    conn: sqlite3.Connection, *, status: str | None = None, limit: int | None = None
) -> list[WorkflowRun]:
    """Runs, newest first; runs created at the very same time in the order of their ids (an order
    both backends have: SQLite's rowid, which VACUUM may renumber, has no PostgreSQL counterpart)."""
    sql, params = "SELECT * FROM workflow_run", []
    if status is not None:
        sql += " WHERE status = ?"
        params.append(status)
    sql += " ORDER BY created_at DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [WorkflowRun.from_row(row) for row in conn.execute(sql, params)]


def shift_counts(conn: sqlite3.Connection, shifts: Iterable[Shift], now: float) -> None:
    """Move task counters for transitions just applied, and the runs' statuses with them.

    On the store's own connections the move is kept back (`DeferredShifts`) and written once per
    run at the end of the transaction, or before the first statement that looks at a run: a tick
    that claims, starts and completes thousands of a run's tasks moves its counters once, not
    three times per task. Any other connection moves them at once.
    """
    if not hasattr(conn, "deferred"):
        deltas = _deltas(shifts)
        _apply_shifts(conn, deltas, dict.fromkeys(deltas, now))
        return
    deferred = conn.deferred
    if deferred is None:
        deferred = conn.deferred = DeferredShifts()
    assert isinstance(deferred, DeferredShifts)
    deferred.add(list(shifts), now)


class DeferredShifts:
    """The counter moves of one transaction not written yet (see `shift_counts`; the contract is
    `db.Deferred`). A log of batches rather than one sum, so that a savepoint that is rolled back
    takes exactly its own batches back, and also undoes a flush made inside it: SQLite (and
    PostgreSQL) roll that UPDATE back too, so the batches it wrote are unwritten again."""

    def __init__(self) -> None:
        self._log: list[tuple[list[Shift], float]] = []
        self._flushed = 0  # the batches before this index are written

    @property
    def pending(self) -> bool:
        return bool(self._log)

    @property
    def unflushed(self) -> bool:
        return self._flushed < len(self._log)

    def add(self, shifts: list[Shift], now: float) -> None:
        if shifts:
            self._log.append((shifts, now))

    def needs_flush(self, sql: str) -> bool:
        # Reads a run, or changes one: it must see every move so far (a task's `workflow_run_id`
        # column is not the table).
        return _names_runs(sql)

    def flush(self, conn: object) -> None:
        batches = self._log[self._flushed:]
        self._flushed = len(self._log)  # first: the statements below go through `db.before` too
        # Each run as of its own last move: the one that ended it sets its `completed_at`, not a
        # later move of another run (attempts recorded as of when they ended, then claims as of now).
        moved_at: dict[str, float] = {}
        for shifts, now in batches:
            for run_id, _, _ in shifts:
                moved_at[run_id] = max(now, moved_at.get(run_id, now))
        try:
            _apply_shifts(conn, _deltas(shift for shifts, _ in batches for shift in shifts), moved_at)
        except BaseException:
            self._flushed -= len(batches)  # written by none, or undone with the transaction
            raise

    def mark(self) -> tuple[int, int]:
        return len(self._log), self._flushed

    def undo_to(self, mark: object) -> None:
        length, flushed = mark  # type: ignore[misc]
        del self._log[length:]
        self._flushed = min(self._flushed, flushed)

    def discard(self) -> None:
        self._log.clear()
        self._flushed = 0


def _deltas(shifts: Iterable[Shift]) -> dict[str, collections.Counter[str]]:
    deltas: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for run_id, source, target in shifts:
        deltas[run_id][COUNT_COLUMN[source]] -= 1
        deltas[run_id][COUNT_COLUMN[target]] += 1
    return deltas


def _apply_shifts(
    conn: object, deltas: dict[str, collections.Counter[str]], moved_at: dict[str, float]
) -> None:
    """Write each run's counter moves and the status they imply, as of `moved_at[run_id]`."""
    # In one order (by id): on PostgreSQL each UPDATE locks its run's row until commit, and two
    # transactions that locked the same runs in different orders would deadlock.
    for run_id, delta in sorted(deltas.items()):
        changes = {column: n for column, n in delta.items() if n}
        if not changes:
            continue
        # One statement per run: the counters move and the row comes back to derive the status.
        set_sql = ", ".join(f"{column} = {column} + ?" for column in changes)
        row = conn.execute(  # type: ignore[attr-defined]
            f"UPDATE workflow_run SET {set_sql} WHERE id = ? RETURNING *", (*changes.values(), run_id)
        ).fetchone()
        if row is not None:
            run = WorkflowRun.from_row(row)
            _write_status(conn, run, run.counts, moved_at[run_id])  # type: ignore[arg-type]


def refresh_status(conn: sqlite3.Connection, run_ids: Iterable[str], now: float) -> None:
    """Write each run's status and `completed_at` as its counters say (skipping unchanged rows)."""
    for run_id in run_ids:
        row = conn.execute("SELECT * FROM workflow_run WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            continue
        run = WorkflowRun.from_row(row)
        _write_status(conn, run, run.counts, now)


def _derived(run: WorkflowRun, counts: RunCounts, now: float) -> tuple[RunStatus, float | None]:
    """The status and `completed_at` that `counts` imply; `completed_at` is set once the run has no
    active task left, and kept from then on."""
    completed_at = (now if run.completed_at is None else run.completed_at) if counts.active == 0 else None
    return scheduler.run_status(counts), completed_at


def _write_status(conn: sqlite3.Connection, run: WorkflowRun, counts: RunCounts, now: float) -> None:
    status, completed_at = _derived(run, counts, now)
    if status is not run.status or completed_at != run.completed_at:
        # Nobody reads its result, and the row is locked by the counters' UPDATE already: on
        # PostgreSQL it goes with the next statement (the COMMIT, mostly), not a round trip of its own.
        db.execute_later(
            conn, "UPDATE workflow_run SET status = ?, completed_at = ? WHERE id = ?",
            (status.value, completed_at, run.id),
        )


def counts_from_tasks(conn: sqlite3.Connection, run_id: str) -> RunCounts:
    """The run's counters computed from scratch from its task rows."""
    rows = conn.execute(
        "SELECT status, count(*) FROM task WHERE workflow_run_id = ? GROUP BY status", (run_id,)
    ).fetchall()
    by_status = {TaskStatus(status).value: count for status, count in rows}
    return RunCounts(**by_status)


def _apply_counts(conn: sqlite3.Connection, run: WorkflowRun, counts: RunCounts, now: float) -> WorkflowRun:
    """Store `counts` and the status they imply, if they differ from what the row holds."""
    status, completed_at = _derived(run, counts, now)
    if counts == run.counts and status is run.status and completed_at == run.completed_at:
        return run
    conn.execute(
        """
        UPDATE workflow_run SET total_tasks = ?, pending_tasks = ?, claimed_tasks = ?, running_tasks = ?,
            done_tasks = ?, failed_tasks = ?, cancelled_tasks = ?, status = ?, completed_at = ?
        WHERE id = ?
        """,
        (counts.total, counts.pending, counts.claimed, counts.running, counts.completed, counts.failed,
         counts.cancelled, status.value, completed_at, run.id),
    )
    return dataclasses.replace(
        run, counts=counts, status=status, total_tasks=counts.total, done_tasks=counts.completed,
        completed_at=completed_at,
    )


def lock_counters(conn: sqlite3.Connection) -> None:
    """Inside a transaction, on PostgreSQL: keep other supervisors from moving any run's counters
    until it ends (they read on), so that `reconcile_non_terminal` counts tasks that stay as
    counted. Before the transaction locks any task row: a supervisor that holds one and waits for
    a run's row must not be waited for in turn. SQLite's writers are serialized already."""
    if backend.of(conn) == backend.POSTGRESQL:
        conn.execute("LOCK TABLE workflow_run IN EXCLUSIVE MODE")


def reconcile_non_terminal(conn: sqlite3.Connection, now: float) -> list[WorkflowRun]:
    """Recompute every run whose stored status is not terminal (SPEC §9 step 6); returns them as
    they are afterwards. One grouped scan of their tasks, then writes only where the row was wrong."""
    placeholders = ", ".join("?" * len(NON_TERMINAL_RUN_STATUSES))
    with write(conn):
        by_run: dict[str, dict[str, int]] = {}
        for run_id, task_status, count in conn.execute(
            f"""
            SELECT workflow_run.id, task.status, count(task.seq)
            FROM workflow_run LEFT JOIN task ON task.workflow_run_id = workflow_run.id
            WHERE workflow_run.status IN ({placeholders})
            GROUP BY workflow_run.id, task.status
            """,
            NON_TERMINAL_RUN_STATUSES,
        ):
            counts = by_run.setdefault(run_id, {})
            if task_status is not None:
                counts[TaskStatus(task_status).value] = count
        stored = conn.execute(
            f"SELECT * FROM workflow_run WHERE status IN ({placeholders})", NON_TERMINAL_RUN_STATUSES
        ).fetchall()
        return [
            _apply_counts(conn, run, RunCounts(**by_run.get(run.id, {})), now)
            for run in map(WorkflowRun.from_row, stored)
        ]
