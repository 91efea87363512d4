"""`fredica export`: the tasks as CSV or JSON lines, read straight from the database, read-only.

Read in the CLI's own process (`daemon.store.export`, a page of rows at a time, on SQLite and
PostgreSQL alike), not through the daemon: a dump of 100,000 tasks need not pass through the
control socket and the supervisor's loop, and it works with the daemon down. The connection is
opened read-only, and creates no file (`db.connect_read_only`; on PostgreSQL a read-only session),
so nothing here can write what only the supervisor writes.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence, TextIO

from daemon.errors import ExportFailed, FredicaError
from daemon.models import TASK_FILTER_WORDS
from daemon.store import backend, db
from daemon.store import export as export_store
from daemon.store import ids as id_store

FORMATS = ("csv", "jsonl")
COLUMNS = export_store.COLUMNS


def rows(database: Path | str, *, statuses: Sequence[str] = (), run: str | None = None) -> Iterator[dict[str, Any]]:
    """The tasks of `database` in submission order (only those of `statuses` and `run` if given).
    What is wrong with the request or the database is refused here, before any row is written."""
    for status in statuses:
        if status not in TASK_FILTER_WORDS:  # as `ls --status` takes them (SPEC §14)
            raise ExportFailed(f"unknown status {status!r}: one of {', '.join(TASK_FILTER_WORDS)}")
    shown = backend.shown(database)
    try:
        conn = db.connect_read_only(database)  # PostgreSQL unreachable: DatabaseUnusable, one line
    except FileNotFoundError:
        raise ExportFailed(f"no database at {database}") from None
    except sqlite3.Error as exc:
        raise ExportFailed(f"cannot open {shown} to read: {exc}") from None
    try:
        if not export_store.holds_tasks(conn):
            raise ExportFailed(f"{shown} holds no tasks table: not a fredica database")
        run_id = None if run is None else id_store.run_id(conn, run)  # a prefix, as everywhere; unknown: refused
    except sqlite3.Error as exc:
        conn.close()
        raise ExportFailed(f"cannot open {shown} to read: {exc}") from None
    except FredicaError:
        conn.close()
        raise
    return _stream(conn, export_store.rows(conn, statuses=statuses, run_id=run_id), shown)


def _stream(
    conn: sqlite3.Connection, found: Generator[dict[str, Any], None, None], shown: str
) -> Iterator[dict[str, Any]]:
    try:
        yield from found
    except sqlite3.Error as exc:
        raise ExportFailed(f"cannot read the tasks of {shown}: {exc}") from None
    finally:
        found.close()  # its read transaction ends first
        conn.close()


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
