"""A task's snapshot (`models.Task`) made from its row and changed on the loop's hot path: the
fast `from_row` and `but` give exactly what the dataclass's own __init__ and `replace` give, on
both backends' rows."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from daemon.models import Task, TaskStatus
from daemon.store import db, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 1_000.0


def by_init(row: sqlite3.Row) -> Task:
    """The snapshot as the plain dataclass makes it, every column converted the obvious way."""
    import json

    values = {name: row[name] for name in row.keys()}
    return Task(**{
        field.name: values[field.name] for field in dataclasses.fields(Task)
    } | {
        "status": TaskStatus(values["status"]),
        "depends_on": tuple(json.loads(values["depends_on"] or "[]")),
        "payload": json.loads(values["payload"] or "{}"),
        "result": None if values["result"] is None else json.loads(values["result"]),
        **{name: bool(values[name]) for name in ("is_paused", "is_pausable", "payload_refs", "queue_explicit", "is_held")},
    })


def test_a_row_becomes_the_snapshot_the_dataclass_would_make(conn: sqlite3.Connection) -> None:
    with db.write(conn):
        [first] = tasks.submit(conn, [TaskSpec(type="ECHO")], now=T0).tasks
        [second] = tasks.submit(conn, [TaskSpec(type="ECHO", payload={"n": [1, "two"], "u": "\u00e9"},
                                                depends_on=(first.id,), queue="media", priority=3)], now=T0).tasks
    [claimed] = tasks.claim_ready(conn, T0, 1, supervisor="alpha")
    tasks.start(conn, first.id, now=T0, executor_pid=7, is_pausable=True, known=claimed)
    tasks.complete(conn, first.id, {"out": [1.5, None]}, now=T0 + 1)
    rows = conn.execute("SELECT * FROM task ORDER BY seq").fetchall()
    made = [Task.from_row(row) for row in rows]
    assert made == [by_init(row) for row in rows]
    done, waiting = made
    assert done.result == {"out": [1.5, None]} and done.status is TaskStatus.COMPLETED and done.is_pausable is True
    assert waiting.depends_on == (first.id,) and waiting.payload == {"n": [1, "two"], "u": "\u00e9"}
    assert waiting.is_held is False and waiting.queue == "media"
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.status = TaskStatus.PENDING  # type: ignore[misc]
    # Each snapshot has a payload of its own: changing one's does not change another's.
    assert Task.from_row(rows[0]).payload is not Task.from_row(rows[0]).payload


def test_but_is_replace(conn: sqlite3.Connection) -> None:
    with db.write(conn):
        [submitted] = tasks.submit(conn, [TaskSpec(type="ECHO", payload={"a": 1})], now=T0).tasks
    task = tasks.get(conn, submitted.id)
    changed = task.but(payload={"b": 2}, executor_pid=9)
    assert changed == dataclasses.replace(task, payload={"b": 2}, executor_pid=9)
    assert task.payload == {"a": 1} and task.executor_pid is None  # the original is unchanged
    assert task.but() == task
    with pytest.raises(TypeError, match="no field 'pyload'"):
        task.but(pyload={})
