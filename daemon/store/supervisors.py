"""Supervisors and their leases (SPEC §16): one row per live supervisor of a shared queue.

A supervisor holds a lease: its row, renewed every `heartbeat_interval` and valid for its
`lease_timeout`, both read against the DATABASE's clock (`_NOW`), never a host's: supervisors on
hosts whose clocks disagree still agree on whose lease has expired. When one has, any live
supervisor rescues the dead one's tasks by the rules of a start's recovery (SPEC §9: running →
failed/INTERRUPTED with a restart-log entry, claimed → pending) and removes its row, in one
transaction, the row last: a rescue that fails half-way leaves the row for the next one to find.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Callable

from daemon.errors import AlreadyRunning
from daemon.models import Task
from daemon.store import backend, recovery, restarts, statuses
from daemon.store.db import write

# The database's clock in Unix seconds. clock_timestamp(), not now(): now() is the start of the
# transaction, and a tick's transaction may have waited for locks.
_NOW = {
    backend.SQLITE: "((julianday('now') - 2440587.5) * 86400.0)",
    backend.POSTGRESQL: "extract(epoch FROM clock_timestamp())",
}


def _now(conn: sqlite3.Connection) -> str:
    return _NOW[backend.of(conn)]


@dataclasses.dataclass(frozen=True)
class SupervisorRow:
    """A supervisor's row: who holds the lease of `name`, and until when (`expired`)."""

    name: str
    host: str
    pid: int
    pid_started_at: float | None
    started_at: float
    heartbeat_at: float
    lease_timeout: float
    expired: bool


@dataclasses.dataclass(frozen=True)
class Rescue:
    """What rescuing a dead supervisor did: its tasks as they were, and what became of them."""

    supervisor: str
    in_flight: tuple[Task, ...]
    interrupted: tuple[Task, ...]  # failed as INTERRUPTED, for their executors' on_task_failed
    requeued: tuple[Task, ...]


def _select(conn: sqlite3.Connection) -> str:
    return (f"SELECT name, host, pid, pid_started_at, started_at, heartbeat_at, lease_timeout,"
            f" heartbeat_at + lease_timeout < {_now(conn)} AS expired FROM supervisor")


def _row(row: sqlite3.Row) -> SupervisorRow:
    return SupervisorRow(**{key: row[key] for key in row.keys() if key != "expired"}, expired=bool(row["expired"]))


def database_now(conn: sqlite3.Connection) -> float:
    """The database's clock, in Unix seconds."""
    return float(conn.execute(f"SELECT {_now(conn)}").fetchone()[0])


def find(conn: sqlite3.Connection, name: str) -> SupervisorRow | None:
    row = conn.execute(_select(conn) + " WHERE name = ?", (name,)).fetchone()
    return None if row is None else _row(row)


def list_all(conn: sqlite3.Connection) -> list[SupervisorRow]:
    """Every supervisor that holds a lease, or held one that no rescue has ended yet; by name."""
    return [_row(row) for row in conn.execute(_select(conn) + " ORDER BY name")]


def overview(conn: sqlite3.Connection) -> list[dict[str, object]]:
    """Every supervisor of the queue as `fredica status` shows it: its host and pid, the age of its
    lease by the database's clock, whether it has expired, and how many tasks it runs."""
    now = _now(conn)
    rows = conn.execute(
        f"""SELECT name, host, pid, {now} - heartbeat_at AS lease_age, lease_timeout,
                   heartbeat_at + lease_timeout < {now} AS expired,
                   (SELECT count(*) FROM task WHERE task.supervisor = supervisor.name
                        AND task.status = {statuses.RUNNING}) AS busy
            FROM supervisor ORDER BY name"""
    ).fetchall()
    return [{"name": row["name"], "host": row["host"], "pid": row["pid"],
             "lease_age": round(max(0.0, float(row["lease_age"])), 3), "lease_timeout": row["lease_timeout"],
             "expired": bool(row["expired"]), "busy": int(row["busy"])} for row in rows]


def register(
    conn: sqlite3.Connection, name: str, *, host: str, pid: int, pid_started_at: float | None,
    lease_timeout: float, gone: Callable[[SupervisorRow], bool],
) -> None:
    """Take the lease of `name` for this process. A row of that name whose lease is still valid
    is refused (AlreadyRunning), unless `gone(row)` says that its process is known dead (a kill -9
    on this host, restarted before its lease ran out): its tasks are then this supervisor's to
    recover. A row whose lease has expired is taken over the same way."""
    insert = ("INSERT OR IGNORE INTO supervisor (name, host, pid, pid_started_at, lease_timeout, started_at,"
              f" heartbeat_at) VALUES (?, ?, ?, ?, ?, {_now(conn)}, {_now(conn)})")
    values = (name, host, pid, pid_started_at, lease_timeout)
    with write(conn):
        if conn.execute(insert, values).rowcount == 1:
            return
        # Locked until commit: a rescuer that would remove it waits, then finds it renewed.
        row = conn.execute(_select(conn) + f" WHERE name = ?{backend.for_update(conn)}", (name,)).fetchone()
        if row is None:  # removed meanwhile, by the rescue that was holding it: the name is free
            conn.execute(insert, values)
            return
        held = _row(row)
        if not held.expired and not gone(held):
            raise AlreadyRunning(
                f"another supervisor named {name!r} (host {held.host}, pid {held.pid}) holds a lease on this "
                f"database: stop it, or give this one another [daemon] name"
            )
        conn.execute(
            "UPDATE supervisor SET host = ?, pid = ?, pid_started_at = ?, lease_timeout = ?,"
            f" started_at = {_now(conn)}, heartbeat_at = {_now(conn)} WHERE name = ?",
            (host, pid, pid_started_at, lease_timeout, name),
        )


def renew(conn: sqlite3.Connection, name: str, *, host: str, pid: int) -> bool:
    """Renew this process's lease of `name`; False if it holds it no more (it was rescued as
    dead, or another process took the name over)."""
    with write(conn):
        return conn.execute(
            f"UPDATE supervisor SET heartbeat_at = {_now(conn)} WHERE name = ? AND host = ? AND pid = ?",
            (name, host, pid),
        ).rowcount == 1


def expired(conn: sqlite3.Connection, *, besides: str) -> list[str]:
    """The names of the supervisors other than `besides` whose lease has expired."""
    return [row[0] for row in conn.execute(
        f"SELECT name FROM supervisor WHERE heartbeat_at + lease_timeout < {_now(conn)} AND name != ? ORDER BY name",
        (besides,),
    )]


def rescue(conn: sqlite3.Connection, name: str, *, now: float, session_id: str) -> Rescue | None:
    """If the lease of `name` has expired: its tasks by SPEC §9's rules, logged under
    `session_id`, then its row removed, in one transaction. None if it was renewed meanwhile or
    another supervisor is rescuing it (its row is locked: passed over, never waited for)."""
    with write(conn):
        found = conn.execute(
            f"SELECT name FROM supervisor WHERE name = ? AND heartbeat_at + lease_timeout < {_now(conn)}"
            f"{backend.skip_locked(conn)}", (name,),
        ).fetchone()
        if found is None:
            return None
        in_flight = recovery.in_flight(conn, supervisor=name, lock=True)
        interrupted = recovery.fail_interrupted(conn, now=now, supervisor=name)
        requeued = recovery.requeue_claimed(conn, now=now, supervisor=name)
        restarts.record(conn, session_id, in_flight, now=now)
        # Last: until its tasks are handled, the row is what says that someone must handle them.
        conn.execute("DELETE FROM supervisor WHERE name = ?", (name,))
    return Rescue(name, tuple(in_flight), tuple(interrupted), tuple(requeued))


def release(conn: sqlite3.Connection, name: str, *, host: str, pid: int) -> bool:
    """Give the lease of `name` up at a graceful stop, unless this process still has tasks in
    flight (their outcomes could not be written): then the row stays, for a rescue once its
    lease expires, or this supervisor's next start. Whether it was removed."""
    with write(conn):
        return conn.execute(
            "DELETE FROM supervisor WHERE name = ? AND host = ? AND pid = ? AND NOT EXISTS"
            f" (SELECT 1 FROM task WHERE supervisor = ? AND status IN ({statuses.IN_FLIGHT}))",
            (name, host, pid, name),
        ).rowcount == 1
