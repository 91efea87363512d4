"""Queue repository (SPEC §15): paused queues, waiting counts, and re-routing at start.

A task's queue is a column of its row, set when it is submitted (`submissions`); claiming by
queue is `tasks.claim_ready`. Nothing here changes a task's status.
"""

from __future__ import annotations

import sqlite3
from typing import Collection, Mapping

from daemon.store import statuses
from daemon.store.db import write


def paused(conn: sqlite3.Connection) -> set[str]:
    """The names of the queues a user has paused (kept across restarts)."""
    return {row[0] for row in conn.execute("SELECT name FROM queue_state WHERE paused = 1")}


def set_paused(conn: sqlite3.Connection, name: str, is_paused: bool, *, now: float) -> bool:
    """Record that a queue is paused or not; False if it already was."""
    with write(conn):
        if (name in paused(conn)) == is_paused:
            return False
        conn.execute(
            "INSERT INTO queue_state (name, paused, changed_at) VALUES (?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, changed_at = excluded.changed_at",
            (name, int(is_paused), now),
        )
        return True


def waiting(conn: sqlite3.Connection) -> dict[str, int]:
    """How many tasks wait (pending or claimed) in each queue that has any: read from the index
    `task_waiting_by_queue` alone."""
    return dict(
        conn.execute(
            "SELECT queue, count(*) FROM task INDEXED BY task_waiting_by_queue"
            f" WHERE status IN ({statuses.WAITING}) GROUP BY queue"
        ).fetchall()
    )


def held(conn: sqlite3.Connection) -> dict[str, int]:
    """How many of the waiting tasks of each queue are held (SPEC §14): from the `task_held` index,
    which holds those tasks only."""
    return dict(
        conn.execute(
            f"SELECT queue, count(*) FROM task WHERE status = {statuses.PENDING} AND is_held = 1 GROUP BY queue"
        ).fetchall()
    )


def reroute(conn: sqlite3.Connection, routes: Mapping[str, str], names: Collection[str], default: str) -> dict[str, int]:
    """Move pending tasks to the queue the config routes them to now, in one UPDATE: those routed
    by type whose route changed, and those whose named queue is not in `names` (they are routed by
    type from now on). Returns how many went to each queue (none: an empty dict)."""
    route_sql = "CASE type " + " ".join("WHEN ? THEN ?" for _ in routes) + " ELSE ? END" if routes else "?"
    route_params = [value for item in routes.items() for value in item] + [default]
    marks = ", ".join("?" * len(names))
    with write(conn):
        rows = conn.execute(
            f"""
            UPDATE task SET queue = {route_sql}, queue_explicit = 0
            WHERE status = {statuses.PENDING} AND (queue_explicit = 0 OR queue NOT IN ({marks})) AND queue != {route_sql}
            RETURNING queue
            """,
            [*route_params, *names, *route_params],
        ).fetchall()
    moved: dict[str, int] = {}
    for (queue,) in rows:
        moved[queue] = moved.get(queue, 0) + 1
    return moved
