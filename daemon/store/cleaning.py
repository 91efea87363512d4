"""Removing finished workflow runs: their tasks, dependency edges and restart-log entries (SPEC §14).

A run may go once every one of its tasks has ended, since before the cutoff (its `completed_at`,
set when its last active task ended, SPEC §4), and only if no unfinished task depends on one of
its tasks. Its own tasks have all ended, so such a task is in another run: a task may depend on
any task that exists (SPEC §5). A run goes whole or not at all, so that what is left is never a
run whose status and counters no longer match its tasks.

The work comes in chunks of at most `limit` tasks, each a short part of one transaction of the
loop (the only writer), so that removing 100,000 tasks never stalls it: a run larger than a chunk
goes over several, its row last. Log files are the caller's, once the chunk is committed.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Sequence

from daemon.models import RunStatus
from daemon.store import statuses
from daemon.store.db import write

# Tasks removed in one chunk. Measured at 100,000 finished tasks on a shared 2-core machine (load
# 7-9): 20-45 ms a chunk (median), at worst 60-210 ms, the slowest being runs of one task each.
CHUNK = 500
FINISHED = (RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value)

# The runs that may go, oldest first: finished (no active task of their own, whatever the status
# says: a run is `failed` as soon as one task fails) before the cutoff, and no task of theirs an
# active task depends on. Read along the index of finish times, so that a chunk looks at the runs
# it takes (and those it must pass over), not at every finished run to sort them first.
_REMOVABLE = f"""
    SELECT id, total_tasks FROM workflow_run AS run INDEXED BY workflow_run_finished
    WHERE completed_at IS NOT NULL AND completed_at < ? AND status IN ({{statuses}})
      AND NOT EXISTS (SELECT 1 FROM task WHERE task.workflow_run_id = run.id AND task.status IN ({statuses.ACTIVE}))
      AND NOT EXISTS (
          SELECT 1 FROM task AS upstream
          JOIN task_dependency AS edge ON edge.depends_on_seq = upstream.seq
          JOIN task AS downstream ON downstream.seq = edge.task_seq
          WHERE upstream.workflow_run_id = run.id AND downstream.status IN ({statuses.ACTIVE})
      )
    ORDER BY completed_at
"""


@dataclasses.dataclass(frozen=True)
class Removed:
    """What one chunk (or a whole clean) removed, or would remove."""

    runs: int = 0
    task_ids: tuple[str, ...] = ()
    more: bool = False  # the chunk was full: more may be removable

    @property
    def tasks(self) -> int:
        return len(self.task_ids)

    def __add__(self, other: Removed) -> Removed:
        return Removed(self.runs + other.runs, self.task_ids + other.task_ids, other.more)


def _statuses(status: str | None) -> tuple[str, ...]:
    if status is None:
        return FINISHED
    if status not in FINISHED:
        raise ValueError(f"not a finished run status: {status!r}")
    return (status,)


def _removable(conn: sqlite3.Connection, cutoff: float, status: str | None) -> sqlite3.Cursor:
    wanted = _statuses(status)
    sql = _REMOVABLE.format(statuses=", ".join("?" * len(wanted)))
    return conn.execute(sql, (cutoff, *wanted))


def preview(conn: sqlite3.Connection, *, cutoff: float, status: str | None = None) -> Removed:
    """What `remove_chunk` would remove, chunk after chunk, as things are now (a read only)."""
    run_ids = [run_id for run_id, _ in _removable(conn, cutoff, status)]
    return Removed(len(run_ids), tuple(task_id for _, task_id in _tasks_of(conn, run_ids)))


def _tasks_of(conn: sqlite3.Connection, run_ids: Sequence[str], limit: int | None = None) -> list[tuple[int, str]]:
    """(seq, id) of the runs' tasks (at most `limit`; None: all): one statement for all of them."""
    # No `LIMIT -1` for "all": SQLite reads it so, PostgreSQL refuses a negative limit.
    sql = "SELECT seq, id FROM task WHERE workflow_run_id IN (SELECT value FROM json_each(?))"
    if limit is None:
        return conn.execute(sql, (json.dumps(list(run_ids)),)).fetchall()
    return conn.execute(sql + " LIMIT ?", (json.dumps(list(run_ids)), limit)).fetchall()


def remove_chunk(
    conn: sqlite3.Connection, *, cutoff: float, status: str | None = None, limit: int = CHUNK
) -> Removed:
    """Remove removable runs (see the module's docstring) of at most `limit` tasks in all: whole
    runs while they fit, or else part of the first one (its row goes with its last tasks).
    `status`: only runs of this finished status."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    with write(conn):
        whole: list[str] = []
        budget = limit
        partial: str | None = None
        more = False  # some were left for the next chunk
        # At most `limit` runs are looked at: a run has at least one task, bar an empty one.
        for run_id, total in _removable(conn, cutoff, status).fetchmany(limit + 1):
            if total > budget or len(whole) >= limit:
                if not whole:
                    partial = run_id  # larger than a chunk: part of it now, the rest in later ones
                more = True
                break
            whole.append(run_id)
            budget -= total
        removed = _tasks_of(conn, whole)
        if partial is not None:
            removed += _tasks_of(conn, [partial], limit)
        _delete_tasks(conn, [seq for seq, _ in removed])
        if partial is not None and conn.execute(
            "SELECT 1 FROM task WHERE workflow_run_id = ? LIMIT 1", (partial,)
        ).fetchone() is None:
            whole.append(partial)  # that was the last of it
        conn.executemany("DELETE FROM workflow_run WHERE id = ?", [(run_id,) for run_id in whole])
        return Removed(len(whole), tuple(task_id for _, task_id in removed), more=more)


def _delete_tasks(conn: sqlite3.Connection, seqs: Sequence[int]) -> None:
    """Delete tasks with every row that names them. Their edges to tasks of runs that are kept
    go too: those dependents have ended (else the run would be kept), and only their JSON
    `depends_on` still names the task, as the record of what they waited for."""
    params = [(seq,) for seq in seqs]
    conn.executemany("DELETE FROM task_dependency WHERE task_seq = ?", params)
    conn.executemany("DELETE FROM task_dependency WHERE depends_on_seq = ?", params)
    conn.executemany(
        "DELETE FROM restart_task_log WHERE task_id = (SELECT id FROM task WHERE seq = ?)", params
    )
    conn.executemany("DELETE FROM task WHERE seq = ?", params)
