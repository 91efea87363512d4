"""`fredica export`: the tasks as CSV or JSON lines, read straight from the database, read-only.

Read in the CLI's own process with sqlite-utils (`Table.rows_where`, which streams rows), not
through the daemon: a dump of 100,000 tasks need not pass through the control socket and the
supervisor's loop, and it works with the daemon down. The connection is opened read-only, and
creates no file (`db.connect_read_only`), so nothing here can write what only the supervisor writes.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import sqlite_utils

from daemon.errors import ExportFailed, FredicaError
from daemon.models import TASK_FILTER_WORDS
from daemon.store import backend, db, tasks
from daemon.store import ids as id_store

FORMATS = ("csv", "jsonl")
# What a row says, in this order: who it is, where it is, how it went, when.
COLUMNS = (
    "id", "workflow_run_id", "type", "queue", "status", "is_held", "priority", "retry_count", "max_retries",
    "progress", "status_text", "error_type", "error", "material_id", "idempotency_key",
    "created_at", "started_at", "completed_at", "payload", "result",
)


def rows(database: Path | str, *, statuses: Sequence[str] = (), run: str | None = None) -> Iterator[dict[str, Any]]:
    """The tasks of `database` in submission order (only those of `statuses` and `run` if given).
    What is wrong with the request or the database is refused here, before any row is written."""
    for status in statuses:
        if status not in TASK_FILTER_WORDS:  # as `ls --status` takes them (SPEC §14)
            raise ExportFailed(f"unknown status {status!r}: one of {', '.join(TASK_FILTER_WORDS)}")
    if backend.is_postgres(database):
        # sqlite-utils streams the rows, and reads SQLite only.
        raise ExportFailed(f"fredica export reads a SQLite database, not {backend.shown(database)}: export a "
                           "PostgreSQL queue's task table with psql's \\copy")
    if not Path(database).exists():
        raise ExportFailed(f"no database at {database}")
    try:
        conn = db.connect_read_only(database)
        conn.row_factory = None  # sqlite-utils makes its own dicts
        table = sqlite_utils.Database(conn).table("task")
        if not table.exists():
            conn.close()
            raise ExportFailed(f"{database} holds no tasks table: not a fredica database")
        if run is not None:
            run = id_store.run_id(conn, run)  # a prefix, as everywhere; an unknown run is refused
    except sqlite3.Error as exc:
        raise ExportFailed(f"cannot open {database} to read: {exc}") from None
    except FredicaError:
        conn.close()
        raise
    where, params = _where(statuses, run)
    return _stream(conn, table, where, params, database)


def _stream(
    conn: sqlite3.Connection, table: sqlite_utils.db.Table, where: str | None, params: list[Any], database: Path
) -> Iterator[dict[str, Any]]:
    try:
        yield from table.rows_where(where, params, order_by="seq", select=", ".join(COLUMNS))
    except sqlite3.Error as exc:
        raise ExportFailed(f"cannot read the tasks of {database}: {exc}") from None
    finally:
        conn.close()


def _where(statuses: Sequence[str], run: str | None) -> tuple[str | None, list[Any]]:
    clauses, params = [], []
    if statuses:
        clause, values = tasks.status_where(list(statuses))
        clauses.append(clause)
        params += values
    if run is not None:
        clauses.append("workflow_run_id = ?")
        params.append(run)
    return (" AND ".join(clauses) or None), params


def write(found: Iterator[dict[str, Any]], out: TextIO, fmt: str) -> int:
    """Write the rows to `out` as `fmt` ("csv" with a header, or "jsonl"); how many."""
    count = 0
    if fmt == "csv":
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        for row in found:
            writer.writerow(row)
            count += 1
    else:
        for row in found:
            # payload and result are JSON in the database: kept as objects, not as strings of JSON.
            row = {**row, "payload": _json(row["payload"]), "result": _json(row["result"])}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
