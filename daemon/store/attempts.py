"""Updates of a task's attempt that do not change its status: its pause state, heartbeat and
progress as the supervisor that runs it writes them, what another supervisor asks of it, and the
look at its row that tells that supervisor what others did to it (SPEC §16).

Apart from the transitions (`tasks`) because none of these moves a status: each is an UPDATE of
a `running` row only, fenced to the attempt it names (`tasks.AttemptRef`), that changes nothing
when the row has moved on. The guarded transition stays the only place that changes a status.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Sequence

from daemon.models import IN_FLIGHT_STATUSES
from daemon.store import statuses
from daemon.store.db import write
from daemon.store.postgres import wakeups
from daemon.store.tasks import AttemptRef

# The fence of `tasks._FENCE` with positional parameters, for the executemany below.
_FENCE_QMARK = "COALESCE(supervisor, '') = ? AND attempt = ?"


# --- updates of a running task that do not change its status ------------------------------------
# Each names the task by id (whichever attempt runs it: a user's request, the store's tests) or by
# `AttemptRef` (only that attempt: the supervisor's writes about the attempts it runs). A write
# that matches no row changes nothing; each returns how many it wrote, for its caller to log the
# rest.


def _by_attempt(items: Sequence[tuple[Any, ...]], sql: str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The statements (`sql` with its WHERE completed) and their parameter rows for `items`, each
    (task id or AttemptRef, *values): an AttemptRef's row is fenced to its attempt."""
    plain, fenced = [], []
    for target, *values in items:
        if isinstance(target, AttemptRef):
            fenced.append((*values, target.task_id, target.supervisor or "", target.attempt))
        else:
            plain.append((*values, target))
    where = f" WHERE id = ? AND status = {statuses.RUNNING}"
    return [(statement, batch) for statement, batch in (
        (sql + where, plain), (sql + where + f" AND {_FENCE_QMARK}", fenced)) if batch]


def _update_running(conn: sqlite3.Connection, items: Sequence[tuple[Any, ...]], sql: str) -> int:
    with write(conn):
        return sum(conn.executemany(statement, batch).rowcount for statement, batch in _by_attempt(items, sql))


def set_paused(conn: sqlite3.Connection, task: str | AttemptRef, paused: bool) -> bool:
    """Record that a running task is paused or not; False if it is not running (at that attempt)."""
    return _update_running(conn, [(task, int(paused))], "UPDATE task SET is_paused = ?") == 1


def ask_pause(conn: sqlite3.Connection, ref: AttemptRef, paused: bool) -> bool:
    """Ask the supervisor that runs a task (at that attempt) to pause or resume it: the request of
    a user on another host of a shared queue (SPEC §16), which wakes the supervisors at the
    commit. False if the task is not running at that attempt any more."""
    asked = _update_running(conn, [(ref, int(paused))], "UPDATE task SET pause_wanted = ?") == 1
    if asked:
        wakeups.notify(conn)
    return asked


def answer_pause(conn: sqlite3.Connection, ref: AttemptRef) -> None:
    """Clear what another supervisor asked of this attempt: acted on, or refused."""
    _update_running(conn, [(ref, None)], "UPDATE task SET pause_wanted = ?")


def set_pausable(conn: sqlite3.Connection, task: str | AttemptRef, pausable: bool) -> bool:
    """Record whether a running task can be paused; False if it is not running (at that attempt)."""
    return _update_running(conn, [(task, int(pausable))], "UPDATE task SET is_pausable = ?") == 1


def record_pause_states(
    conn: sqlite3.Connection, states: Sequence[tuple[str | AttemptRef, bool, bool, str | None]]
) -> int:
    """Record (task, is_paused, is_pausable, status text) of running tasks as the supervisor
    knows them (the text: why it is paused, or its executor's own); tasks no longer running (at
    that attempt) are left alone. How many were written."""
    return _update_running(
        conn, [(task, int(paused), int(pausable), text) for task, paused, pausable, text in states],
        "UPDATE task SET is_paused = ?, is_pausable = ?, status_text = ?",
    )


def heartbeat(conn: sqlite3.Connection, running: Sequence[str | AttemptRef], now: float) -> int:
    """Stamp `heartbeat_at` of running tasks whose executors are alive; how many were stamped."""
    return _update_running(conn, [(task, now) for task in running], "UPDATE task SET heartbeat_at = ?")


def record_progress(conn: sqlite3.Connection, updates: Sequence[tuple[str | AttemptRef, int, str | None]]) -> int:
    """Record progress (clamped to 0-100) of several running tasks in one transaction; returns
    how many were running (others are left alone)."""
    return _update_running(
        conn, [(task, max(0, min(100, int(p))), text) for task, p, text in updates],
        "UPDATE task SET progress = ?, status_text = COALESCE(?, status_text)",
    )


IN_FLIGHT_VALUES = frozenset(status.value for status in IN_FLIGHT_STATUSES)


@dataclasses.dataclass(frozen=True)
class AttemptRows:
    """What the rows of a supervisor's running attempts say that others changed (SPEC §16)."""

    replaced: list[str]  # no longer in flight at that attempt: cancelled elsewhere, or rescued
    pause_wanted: dict[str, bool]  # asked by another supervisor: pause (True) or resume (False)


def look_at_attempts(conn: sqlite3.Connection, refs: Sequence[AttemptRef]) -> AttemptRows:
    """Read the rows of `refs` (one SELECT) for what another supervisor did to them. An attempt
    sent ahead (SPEC §15) is still `claimed`, at the attempt its claim counted: in flight too."""
    replaced: list[str] = []
    wanted: dict[str, bool] = {}
    if not refs:
        return AttemptRows(replaced, wanted)
    found = {row["id"]: row for row in conn.execute(
        f"SELECT id, status, supervisor, attempt, pause_wanted FROM task WHERE id IN ({', '.join('?' * len(refs))})",
        [ref.task_id for ref in refs])}
    for ref in refs:
        row = found.get(ref.task_id)
        if row is None or row["status"] not in IN_FLIGHT_VALUES \
                or (row["supervisor"] or "") != (ref.supervisor or "") or row["attempt"] != ref.attempt:
            replaced.append(ref.task_id)
        elif row["pause_wanted"] is not None:
            wanted[ref.task_id] = bool(row["pause_wanted"])
    return AttemptRows(replaced, wanted)
