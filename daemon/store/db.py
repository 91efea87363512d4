"""Opening the database: WAL, a busy timeout, foreign keys, a deliberate `synchronous` level.

Durability: in WAL mode every COMMIT is appended to the write-ahead log before COMMIT returns, so a
committed transaction survives a kill -9 of any process at either level. The level only decides
what survives a power cut or a kernel crash:

- ``NORMAL`` (the default) syncs the WAL at checkpoints only. The last transactions before a power
  cut may be rolled back, never half applied. Recovery then treats those tasks as interrupted,
  which is why this is a sound default for a task queue: no fsync on every state change.
- ``FULL`` syncs the WAL on every commit: nothing committed is lost even on a power cut, at the
  price of one fsync per transaction.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

from daemon import paths
from daemon.errors import DatabaseUnusable  # noqa: F401 (re-exported: this module's errors live in the catalogue)
from daemon.store import backend, migrations

T = TypeVar("T")

SYNCHRONOUS_LEVELS = ("NORMAL", "FULL")
BUSY_TIMEOUT = 10.0  # seconds a write waits for another process's lock


class Deferred(Protocol):
    """Writes a repository keeps back until the end of the transaction, where many of them become
    one statement (`runs.DeferredShifts`: a run's task counters, moved by every transition).

    What is kept back is written before the COMMIT and before any statement that `needs_flush`
    says would read or change it (`before`), and forgotten with what a ROLLBACK undoes (`after`,
    and `savepoint`'s marks).
    """

    pending: bool  # something is kept back, written or not
    unflushed: bool  # something kept back is not written yet

    def needs_flush(self, sql: str) -> bool: ...
    def flush(self, conn: object) -> None: ...
    def mark(self) -> object: ...
    def undo_to(self, mark: object) -> None: ...
    def discard(self) -> None: ...


# How `before` and `after` treat a statement, by its first word. Cached by its first characters:
# the store runs a few dozen distinct statements, each thousands of times a second in a burst,
# and some of them are long (a batch's IN list, a multi-row INSERT), which a cache by the whole
# text would keep alive.
_OTHER, _BEGIN, _ENDS, _ROLLS_BACK = range(4)


def _role(sql: str) -> int:
    return _role_of_head(sql[:32])


@functools.lru_cache(maxsize=256)
def _role_of_head(start: str) -> int:
    head = start.lstrip()[:11].upper()
    if head.startswith(("COMMIT", "END")):
        return _ENDS
    if head.startswith("BEGIN"):
        return _BEGIN
    if head.startswith("ROLLBACK") and not head.startswith("ROLLBACK TO"):
        return _ROLLS_BACK
    return _OTHER


def before(conn: object, deferred: Deferred, sql: str) -> None:
    """What a connection with deferred writes does before running `sql` (when `deferred.pending`)."""
    role = _role(sql)
    if role == _ENDS:
        if deferred.unflushed:
            deferred.flush(conn)
    elif role == _BEGIN:
        deferred.discard()  # left by a transaction that ended without a word (SQLite's own rollback)
    elif deferred.unflushed and deferred.needs_flush(sql):
        deferred.flush(conn)


def after(deferred: Deferred, sql: str) -> None:
    """And after it: a whole transaction's ROLLBACK takes what was kept back with it (`savepoint`
    undoes its own part on a ROLLBACK TO)."""
    if _role(sql) in (_ENDS, _ROLLS_BACK):
        deferred.discard()


def execute_later(conn: object, sql: str, params: Sequence[Any] = ()) -> None:
    """Run a write whose result nobody reads, in the caller's transaction: at once on SQLite (no
    round trip to save), with the next statement on PostgreSQL (`PostgresConnection.execute_later`).
    Only for statements that cannot fail but as the whole transaction would (a lost session, a
    full disk): where such a failure is raised then, it fails what contains it all the same."""
    later = getattr(conn, "execute_later", None)
    if later is not None:
        later(sql, params)
    else:
        conn.execute(sql, params)  # type: ignore[attr-defined]


def executemany_later(conn: object, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> None:
    """`execute_later` for each of `seq_of_params` (on SQLite, one `executemany`)."""
    later = getattr(conn, "execute_later", None)
    if later is None:
        conn.executemany(sql, seq_of_params)  # type: ignore[attr-defined]
        return
    for params in seq_of_params:
        later(sql, params)


class StoreConnection(sqlite3.Connection):
    """A SQLite connection that holds the store's deferred writes (`Deferred`) until they are due."""

    deferred: Deferred | None = None

    def execute(self, sql: str, parameters: object = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        deferred = self.deferred
        if deferred is None or not deferred.pending:
            return super().execute(sql, parameters)  # type: ignore[arg-type]
        before(self, deferred, sql)
        cursor = super().execute(sql, parameters)  # type: ignore[arg-type]
        after(deferred, sql)
        return cursor

    def executemany(self, sql: str, parameters: object, /) -> sqlite3.Cursor:  # type: ignore[override]
        deferred = self.deferred
        if deferred is not None and deferred.pending:
            before(self, deferred, sql)
        return super().executemany(sql, parameters)  # type: ignore[arg-type]


def connect(path: str | Path, *, synchronous: str = "NORMAL", busy_timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    """A connection with the pragmas every fredica-worker connection needs, schema untouched."""
    level = synchronous.upper()
    if level not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, not {synchronous!r}")
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write transaction takes the
    # write lock up front instead of failing with SQLITE_BUSY half-way (see `write`).
    conn = sqlite3.connect(
        str(path), isolation_level=None, timeout=busy_timeout, check_same_thread=False, factory=StoreConnection
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    _enable_wal(conn, busy_timeout)
    conn.execute(f"PRAGMA synchronous = {level}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def connect_read_only(path: str | Path, *, busy_timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    """A connection that can only read the database at `path` and leaves no file behind, for
    reading it with no daemon running. FileNotFoundError when there is no database there. A
    `postgresql://` URL: a read-only session of that database (DatabaseUnusable if unreachable).

    SQLite's `mode=ro` on a WAL database creates the -wal and -shm files when they are missing
    (the daemon's last connection deletes them as it closes), and a read-only connection cannot
    delete them again. Without a -wal file, everything committed is in the database file itself,
    which in WAL mode changes only at checkpoints: it is read as `immutable`, which needs neither
    file. With a -wal (a daemon that was killed, or is starting) its commits must be read: then
    `mode=ro` reads them, through a -shm that SQLite creates if it is missing.
    """
    if backend.is_postgres(path):
        from daemon.store.postgres import connection  # only here: SQLite users never import psycopg

        return connection.connect(str(path), read_only=True)  # type: ignore[return-value]
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(str(path))
    immutable = "&immutable=1" if not Path(f"{path}-wal").exists() else ""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{immutable}", uri=True, isolation_level=None,
                           timeout=busy_timeout, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only = ON")
    return conn


def connect_reader(database: str | Path) -> sqlite3.Connection:
    """A connection beside the loop's that never writes (`query_only`; on PostgreSQL a read-only
    session), to a database the daemon has opened already: a PostgreSQL server that cannot be
    reached is away for now, an OperationalError as for a lost session (UNAVAILABLE)."""
    if backend.is_postgres(database):
        from daemon.store.postgres import connection

        return connection.connect(str(database), read_only=True, reached_before=True)  # type: ignore[return-value]
    conn = connect(database)
    conn.execute("PRAGMA query_only = ON")
    return conn


def schema_version(conn: sqlite3.Connection) -> tuple[int, int]:
    """(the database's schema version, the latest this fredica knows), on either backend."""
    if backend.of(conn) == backend.POSTGRESQL:
        from daemon.store.postgres import migrations as postgres_migrations

        return postgres_migrations.current_version(conn), postgres_migrations.LATEST  # type: ignore[arg-type]
    return migrations.current_version(conn), migrations.LATEST


def is_lost(conn: sqlite3.Connection) -> bool:
    """Whether the connection's session is gone (a PostgreSQL server that restarted; a SQLite
    file's connection never is)."""
    return bool(getattr(conn, "broken", False))


def reconnect(conn: sqlite3.Connection) -> None:
    """A new session in place of a lost one, in the same connection object (PostgreSQL: see
    `postgres.connection.PostgresConnection.reconnect`); nothing to do for a SQLite file."""
    again = getattr(conn, "reconnect", None)
    if again is not None:
        again()


def lost_sessions_ended(conn: sqlite3.Connection) -> bool:
    """Whether the sessions a connection lost can no longer write (PostgreSQL: gone from the
    server, `PostgresConnection.lost_sessions_ended`); a SQLite file's connection loses none."""
    ended = getattr(conn, "lost_sessions_ended", None)
    return True if ended is None else bool(ended())


def set_busy_timeout(conn: sqlite3.Connection, seconds: float) -> None:
    """How long a write waits for another process's write lock (SQLite's; a PostgreSQL writer
    waits for the rows it needs only, and keeps its server's settings)."""
    if backend.of(conn) == backend.SQLITE:
        conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")


class ThreadReaders:
    """A read-only connection (`connect_reader`) to the daemon's database for each thread that
    calls: the readers beside the loop (request handlers, the web page's reads, /metrics) never
    write, and a connection stays on the thread that made it. One whose session was lost (a
    PostgreSQL restart) is opened again at the next call."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._local = threading.local()

    def __call__(self) -> sqlite3.Connection:
        """This thread's connection (a new one if its session was lost)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and is_lost(conn):
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
        if conn is None:
            conn = connect_reader(self.path)
            self._local.conn = conn
        return conn

    def lost(self) -> bool:
        """Whether this thread's connection has lost its session (the next call opens another)."""
        conn = getattr(self._local, "conn", None)
        return conn is not None and is_lost(conn)

    def read(self, reading: Callable[[sqlite3.Connection], T]) -> T:
        """`reading(conn)` on this thread's connection, made once more on a new session if the
        one it had was lost (a PostgreSQL restart since this thread last read): a read wrote
        nothing, and a restart long over is no error to report."""
        try:
            return reading(self())
        except sqlite3.DatabaseError:
            if not self.lost():
                raise
        return reading(self())


def _enable_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    # Switching to WAL needs an exclusive lock, and SQLite does not apply the busy handler to it:
    # several processes opening a new file at once can see "database is locked". WAL is persistent,
    # so only the first opener switches; the others find it set, or retry until it is.
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("could not switch the database to WAL mode")
        time.sleep(0.01)


def open_database(
    path: str | Path, *, synchronous: str = "NORMAL", busy_timeout: float = BUSY_TIMEOUT,
    answer_timeout: float | None = None,
) -> sqlite3.Connection:
    """Open (creating if needed) the database at `path`, check that it is whole and writable, and
    bring its schema up to date. DatabaseUnusable, with nothing changed, when it is not (SPEC §13).
    A `postgresql://` URL opens that PostgreSQL database instead (`postgres/`, SPEC §16), whose
    server this process's sessions wait for `answer_timeout` seconds at most per round trip."""
    if backend.is_postgres(path):
        from daemon.store.postgres import connection  # only here: SQLite users never import psycopg

        return connection.open_database(str(path), answer_timeout=answer_timeout)  # type: ignore[return-value]
    path = Path(path)
    wal = Path(f"{path}-wal")
    if not path.exists() and wal.exists():
        # Creating the database now would start an empty queue beside the log of the real one.
        raise DatabaseUnusable(
            f"the database {path} is missing but its write-ahead log {wal} is still there (deleted by "
            f"mistake?): restore {path.name} from a backup, or remove {wal.name} and {path.name}-shm "
            "to start with an empty queue"
        )
    paths.private_dir(path.parent)
    paths.private_file(path)  # SQLite gives its -wal and -shm files the database's mode
    try:
        conn = connect(path, synchronous=synchronous, busy_timeout=busy_timeout)
        try:
            _check_whole(conn, path)
            _check_writable(conn, path)
            migrations.migrate(conn)
        except BaseException:
            conn.close()
            raise
    except sqlite3.DatabaseError as exc:
        raise _unusable(path, exc) from None
    return conn


def _check_whole(conn: sqlite3.Connection, path: Path) -> None:
    # quick_check reads every page (not the indexes' agreement with their tables, which
    # integrity_check adds at four times the cost): ~50 ms at 100,000 tasks.
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
    if problems != ["ok"]:
        # Its first report starts with "*** in database main ***" on a line of its own.
        why = " ".join(problems[0].replace("*** in database main ***", "").split())
        raise DatabaseUnusable(_corrupt_message(path, why))


def _check_writable(conn: sqlite3.Connection, path: Path) -> None:
    # SQLite opens a file it may not write read-only without a word, and says so only at the
    # first write: after recovery had already ended the leftover executors. Rewriting the schema
    # version as it is, then rolling back, is a write that changes nothing.
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.execute("ROLLBACK")


def _corrupt_message(path: Path, why: str) -> str:
    return (
        f"the database {path} is corrupt ({why}): restore it from a backup, or move it and its "
        "-wal file away to start with an empty queue"
    )


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> DatabaseUnusable:
    """What a SQLite error met while opening the database means for its owner, in one line."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return DatabaseUnusable(_corrupt_message(path, str(exc)))
    if path.is_dir():
        return DatabaseUnusable(f"cannot open the database {path}: it is a directory")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return DatabaseUnusable(
            f"the database {path} cannot be written ({exc}): make it, its -wal and -shm files and "
            f"the directory {path.parent} writable for the daemon's user"
        )
    return DatabaseUnusable(f"cannot open the database {path}: {exc}")


@contextlib.contextmanager
def savepoint(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Inside a transaction: if the block fails, undo what it wrote and let the transaction go on.

    For callers that catch an error and carry on (the supervisor runs a whole tick in one
    transaction; one task's failed step must not take the others' changes with it, nor leave
    half of its own). Outside a transaction it is one of its own, as `write`.
    """
    if not conn.in_transaction:
        with write(conn):
            yield conn
        return
    conn.execute("SAVEPOINT undo_on_error")
    kept = getattr(conn, "deferred", None)
    mark = kept.mark() if kept is not None else None  # None: nothing was ever kept back here
    try:
        yield conn
    except BaseException:
        # A full disk or an I/O error can make SQLite roll back the whole transaction on its own:
        # there is no savepoint left to go back to, and the error to report is the first one.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK TO undo_on_error")
                conn.execute("RELEASE undo_on_error")
        # Looked up again: a connection's first move makes its `deferred`, maybe inside the block,
        # and then all that is kept back is the block's own.
        deferred = getattr(conn, "deferred", None)
        if deferred is not None:
            # What the block kept back goes with what it wrote (and so does a flush it made).
            deferred.undo_to(mark) if conn.in_transaction and mark is not None else deferred.discard()
        raise
    conn.execute("RELEASE undo_on_error")


@contextlib.contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One atomic write transaction; nested uses join the outer one (see `savepoint`)."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")  # deferred writes are written first (`before`)
    except BaseException:
        # A COMMIT that failed (a full disk) leaves the transaction open: it must not be joined by
        # the next `write` as if nested. A rollback that fails too must not hide the first error.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        deferred = getattr(conn, "deferred", None)
        if deferred is not None:
            deferred.discard()  # whether or not the ROLLBACK ran: the transaction is gone
        raise
