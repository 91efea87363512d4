"""Database faults at runtime (SPEC §13): what a database error means for the loop, and how a
write fault is ridden out.

Two kinds matter. A *write fault* (the disk is full, an I/O error, the file turned read-only,
another process holding the write lock past the busy timeout; on PostgreSQL also a lost
connection, a server restarting) passes: the loop keeps in memory what it still has to record,
claims nothing, refuses requests that would write, and retries the write at growing intervals
until it succeeds (reconnecting first, for a lost connection). *Corruption* does not pass: the
daemon ends its attempts and exits. Anything else is not a database fault, and goes where it
went before.

SQLite's errors are known by their `sqlite_errorname`; PostgreSQL's (raised as the same
`sqlite3` classes by `store/postgres/connection.py`) by their SQLSTATE.
"""

from __future__ import annotations

import dataclasses
import enum
import sqlite3
from typing import Callable

from daemon.errors import DatabaseFault  # noqa: F401 (re-exported: this module's errors live in the catalogue)

# The first retry comes quickly (a log rotated, a file deleted by hand), then they space out.
FIRST_RETRY = 0.25
MAX_RETRY = 5.0
# How long a retry waits for another process's write lock (the normal busy timeout is 10 s).
RETRY_BUSY_TIMEOUT = 0.1


class Kind(enum.Enum):
    FULL = "full"
    IO = "io"
    READ_ONLY = "read_only"
    LOCKED = "locked"
    CORRUPT = "corrupt"
    UNAVAILABLE = "unavailable"  # PostgreSQL: the connection is lost, or the server will not take it


# Refusal texts: what a user is told, for each kind of write fault.
REFUSALS = {
    Kind.FULL: "the database's disk is full: nothing was changed",
    Kind.IO: "the database cannot be written (disk I/O error): nothing was changed",
    Kind.READ_ONLY: "the database has become read-only: nothing was changed",
    Kind.LOCKED: "the database is locked by another process: nothing was changed",
    Kind.CORRUPT: "the database is corrupt: the daemon is stopping; nothing was changed",
    Kind.UNAVAILABLE: "the database is unavailable (connection lost): nothing was changed",
}
# A connection lost while its COMMIT was on the way: the server may have committed it (the answer
# is what was lost), or not. Nobody can say which until it is reached again.
IN_DOUBT = ("the connection to the database was lost as the change was being committed: it may have been "
            "made; look before asking again")

_KINDS = (
    ("SQLITE_FULL", Kind.FULL),
    ("SQLITE_IOERR", Kind.IO),
    ("SQLITE_READONLY", Kind.READ_ONLY),
    ("SQLITE_BUSY", Kind.LOCKED),  # another process holds the write lock (SQLITE_LOCKED: a bug of ours)
    ("SQLITE_CORRUPT", Kind.CORRUPT),
    ("SQLITE_NOTADB", Kind.CORRUPT),
)
# SQLSTATE prefixes (classes, or single codes), most specific first.
_POSTGRES_KINDS = (
    ("08", Kind.UNAVAILABLE),  # connection exception
    ("57P", Kind.UNAVAILABLE),  # the server shuts down, crashed, or is starting
    ("53100", Kind.FULL),  # disk_full
    ("58030", Kind.IO),  # io_error
    ("25006", Kind.READ_ONLY),  # read_only_sql_transaction: a standby, or a read-only database
    ("XX001", Kind.CORRUPT),  # data_corrupted
    ("XX002", Kind.CORRUPT),  # index_corrupted
    # Another supervisor's transaction was in the way (a deadlock broken, a lock not had): the
    # tick is rolled back and tried again, as for SQLite's busy lock.
    ("40P01", Kind.LOCKED),
    ("40001", Kind.LOCKED),
    ("55P03", Kind.LOCKED),
)



class DatabaseCorrupt(Exception):
    """The database was found corrupt at runtime: the daemon must end (SPEC §13)."""


def refusal(kind: Kind, exc: BaseException | None = None) -> DatabaseFault:
    """What a request refused for a fault of this kind (`exc`, if known) is told."""
    if kind is Kind.UNAVAILABLE and getattr(exc, "in_doubt", False):
        return DatabaseFault(IN_DOUBT)
    return DatabaseFault(REFUSALS[kind])


def reader_refusal(exc: sqlite3.DatabaseError, report_corruption: Callable[[BaseException], None]) -> Exception:
    """What a reader's database error is answered with: itself, or, for corruption, the refusal
    that says so once `report_corruption` has told the loop (which ends the daemon: it must not go
    on answering from a database it can no longer trust, SPEC §13)."""
    kind = classify(exc)
    if kind is Kind.UNAVAILABLE:
        return refusal(kind)  # one line; the reader's next call opens a new session
    if kind is not Kind.CORRUPT:
        return exc
    report_corruption(exc)
    return refusal(Kind.CORRUPT)


def classify(exc: BaseException) -> Kind | None:
    """The kind of database fault `exc` is (None: not one). Extended codes (SQLITE_IOERR_WRITE,
    SQLITE_CORRUPT_INDEX, ...) count as their primary code."""
    if not isinstance(exc, sqlite3.Error):
        return None
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return next((kind for prefix, kind in _POSTGRES_KINDS if sqlstate.startswith(prefix)), None)
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    name = getattr(exc, "sqlite_errorname", None) or ""
    for prefix, kind in _KINDS:
        if name.startswith(prefix):
            return kind
    if name:
        return None
    # Errors raised without a code (older SQLite builds): known by their text.
    text = str(exc)
    if "disk is full" in text:
        return Kind.FULL
    if "malformed" in text or "not a database" in text:
        return Kind.CORRUPT
    return None


@dataclasses.dataclass
class WriteFault:
    """A write fault being ridden out: since when, and when to try writing again."""

    kind: Kind
    error: str
    since: float
    retry_at: float
    delay: float = FIRST_RETRY
    failed_retries: int = 0

    @classmethod
    def start(cls, kind: Kind, exc: BaseException, now: float) -> "WriteFault":
        return cls(kind, str(exc), since=now, retry_at=now + FIRST_RETRY)

    def retry_failed(self, kind: Kind, exc: BaseException, now: float) -> None:
        """The retry failed too: wait twice as long (at most MAX_RETRY) before the next."""
        self.kind, self.error = kind, str(exc)
        self.failed_retries += 1
        self.delay = min(self.delay * 2, MAX_RETRY)
        self.retry_at = now + self.delay

    def refusal(self) -> DatabaseFault:
        return refusal(self.kind)

    def summary(self, now: float) -> str:
        """For systemd's STATUS and `fredica status`."""
        return f"database fault for {now - self.since:.0f} s ({self.error}): retrying writes, claiming nothing"
