"""The store's side of recovery: the tasks a supervisor left in flight, found and moved on at
its next start (SPEC §9) or by the supervisor that rescues its expired lease (SPEC §16), and the
tasks whose run is gone.

Apart from the task repository (`tasks`) because only recovery and a rescue run these, once per
start or rescue, on every task a supervisor owned. Each status change is the one guarded
transition (`tasks._transition`), on the rows read here.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Sequence

from daemon import models
from daemon.models import Task, TaskStatus
from daemon.store import backend, statuses
from daemon.store.db import write
from daemon.store.tasks import _transition


# --- startup recovery (SPEC §9) -----------------------------------------------------------------


def _rows(conn: sqlite3.Connection, where: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
    return conn.execute(
        f"SELECT seq, id, status, workflow_run_id FROM task WHERE {where} ORDER BY seq{backend.for_update(conn)}", params
    ).fetchall()


def owned_by(supervisor: str | None, *, unnamed: bool = False) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) that keeps the tasks claimed by `supervisor` (None:
    by anyone, the one daemon of a SQLite file); `unnamed`: and those that name no supervisor,
    claimed before supervisors were named (schema 10): a start's recovery takes them."""
    if supervisor is None:
        return "1 = 1", []
    if unnamed:
        return "(supervisor = ? OR supervisor IS NULL)", [supervisor]
    return "supervisor = ?", [supervisor]


def in_flight(
    conn: sqlite3.Connection, *, supervisor: str | None = None, unnamed: bool = False, lock: bool = False
) -> list[Task]:
    """The `running` and `claimed` tasks of `supervisor` (`owned_by`), in submission order: what
    a start's recovery, or a rescue, finds left in flight. `lock`: their rows locked until the
    transaction ends, on PostgreSQL (a rescue's, which moves them next)."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    locked = backend.for_update(conn) if lock else ""
    return [Task.from_row(row) for row in conn.execute(
        f"SELECT * FROM task WHERE status IN ({statuses.IN_FLIGHT}) AND {where} ORDER BY seq{locked}", params)]


def fail_interrupted(
    conn: sqlite3.Connection, *, now: float, supervisor: str | None = None, unnamed: bool = False
) -> list[Task]:
    """Every `running` task (of `supervisor`: `owned_by`) → failed (INTERRUPTED): its outcome is
    unknown after a crash. So is that of a `claimed` task with a recorded executor process: it was
    sent ahead (prefetch, SPEC §15) to a process that may have started it."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    with write(conn):
        failed = _transition(
            conn,
            _rows(conn, f"status = {statuses.RUNNING} AND {where}", params),
            TaskStatus.FAILED,
            now=now,
            fields={"error": "interrupted: the supervisor stopped while the task ran", "error_type": models.INTERRUPTED},
        )
        return failed + _transition(
            conn,
            _rows(conn, f"status = {statuses.CLAIMED} AND executor_pid IS NOT NULL AND {where}", params),
            TaskStatus.FAILED,
            now=now,
            fields={"error": "interrupted: the supervisor stopped while the task was sent ahead to its executor "
                             "process, which may have started it", "error_type": models.INTERRUPTED},
        )


def requeue_claimed(
    conn: sqlite3.Connection, *, now: float, supervisor: str | None = None, unnamed: bool = False
) -> list[Task]:
    """Every `claimed` task (of `supervisor`: `owned_by`) → pending: it never started, so it can
    safely run again."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    with write(conn):
        return _transition(conn, _rows(conn, f"status = {statuses.CLAIMED} AND {where}", params), TaskStatus.PENDING,
                           now=now)


def fail_orphans(conn: sqlite3.Connection, *, now: float) -> list[Task]:
    """Every active task whose workflow run does not exist → failed (ORPHANED)."""
    with write(conn):
        rows = _rows(
            conn,
            f"status IN ({statuses.ACTIVE}) AND NOT EXISTS (SELECT 1 FROM workflow_run WHERE workflow_run.id = task.workflow_run_id)",
        )
        return _transition(
            conn,
            rows,
            TaskStatus.FAILED,
            now=now,
            fields={"error": "its workflow run does not exist", "error_type": models.ORPHANED},
        )
