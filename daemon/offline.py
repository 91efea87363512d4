"""Read requests answered with no daemon running (SPEC §14): the daemon's own read handlers
(`operations.Reads`), run in the CLI's process on the database opened read-only.

Only when no daemon runs at all (`DaemonNotRunning`): one that is slow, or another user's, is
never bypassed. The reply is what the daemon would have sent, down to its JSON, so that every
command renders it as it renders the daemon's. Nothing here writes: the connection is read-only
and creates no file (`db.connect_read_only`).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any, Iterator

from daemon import operations, protocol
from daemon.config import Settings
from daemon.errors import DaemonUnreachable, FredicaError, MigrationError
from daemon.store import backend, db


def answers(op: str) -> bool:
    """Whether `op` is a read that needs no running daemon (`wait` and every write need one)."""
    return op in protocol.OPERATIONS and not protocol.OPERATIONS[op].writes and hasattr(operations.Reads, f"op_{op}")


class OfflineReads(operations.Reads):
    """The read handlers on one read-only connection, opened when a handler first needs it (the
    daemon's log and the templates need none). `not_running`: what the client met, raised again
    with more said when there is no database either (one line: nothing answers, nothing is
    created)."""

    def __init__(self, settings: Settings, not_running: DaemonUnreachable) -> None:
        super().__init__(settings, self._connection)
        self._not_running = not_running
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            path = self.settings.database
            try:
                conn = db.connect_read_only(path)  # PostgreSQL: a read-only session, no daemon needed
            except FileNotFoundError:
                raise DaemonUnreachable(
                    f"{self._not_running.message}; there is no database at {path} to read either") from None
            version, latest = db.schema_version(conn)
            if version != latest:
                conn.close()
                raise MigrationError(
                    f"the database {backend.shown(path)} has schema version {version}, this fredica reads version "
                    f"{latest}: start the daemon once (it migrates the database), then ask again"
                )
            self._conn = conn
        return self._conn

    @property
    def opened(self) -> bool:
        """Whether a handler has read the database."""
        return self._conn is not None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclasses.dataclass(frozen=True)
class Answer:
    """The data of the reply the daemon would have given, and whether the database was read for
    it (the daemon's log and the templates are found without it)."""

    data: Any
    read_database: bool


def pages(settings: Settings, op: str, args: dict[str, Any], not_running: DaemonUnreachable) -> Iterator[Answer]:
    """A streamed read (`ls_pages`) as the daemon would send it: each page's items as an Answer,
    then one more whose data is what its last frame says besides them (`total`)."""
    protocol.OPERATIONS[op].check(args)
    reads = OfflineReads(settings, not_running)
    try:
        streamed: protocol.Pages = getattr(reads, f"op_{op}")(**args)
        last = False
        while not last:
            message, last = streamed.next_frame()
            data = json.loads(json.dumps(message["data"]))
            yield Answer(data.pop("items"), True)
            if last:
                data.pop("more", None)
                yield Answer(data, True)
    except sqlite3.Error as exc:
        raise FredicaError(f"cannot read the database {backend.shown(settings.database)}: {exc}") from None
    finally:
        reads.close()


def answer(settings: Settings, op: str, args: dict[str, Any], not_running: DaemonUnreachable) -> Answer:
    """What the daemon would answer to `op`, read from its database; `not_running` is what the
    client met (see `OfflineReads`)."""
    protocol.OPERATIONS[op].check(args)
    reads = OfflineReads(settings, not_running)
    try:
        data = getattr(reads, f"op_{op}")(**args)
        read_database = reads.opened
    except sqlite3.Error as exc:
        raise FredicaError(f"cannot read the database {backend.shown(settings.database)}: {exc}") from None
    finally:
        reads.close()
    # As the daemon's reply: JSON types only (tuples become lists, keys strings).
    return Answer(json.loads(json.dumps(data)), read_database)
