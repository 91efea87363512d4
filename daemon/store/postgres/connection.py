"""The PostgreSQL backend: a psycopg 3 connection that speaks the store's SQLite dialect.

The store's repositories are written against the part of `sqlite3.Connection` they use:
`execute`/`executemany` with `?` or `:name` parameters, rows read by position or by column name,
`in_transaction`, and explicit `BEGIN IMMEDIATE` / `SAVEPOINT` / `COMMIT` / `ROLLBACK` issued by
`db.write` and `db.savepoint`. `PostgresConnection` offers exactly that part over psycopg, so that
every repository runs unchanged on both backends and each SQL text still lives in one place.

Each statement text is translated once (cached) from the store's dialect to PostgreSQL's:

- placeholders: `?` becomes `%s`, `:name` becomes `%(name)s`, a literal `%` becomes `%%`;
- `BEGIN IMMEDIATE` becomes `BEGIN`: a plain READ COMMITTED transaction. Writers need not
  serialize as SQLite's do: the guarded transition's `UPDATE ... WHERE status IN (...)` is
  re-evaluated by PostgreSQL on the newest version of a row it had to wait for, so a transition
  from a status that changed meanwhile updates nothing and the caller's count check refuses it;
  the claim locks what it takes with `FOR UPDATE SKIP LOCKED` (`claim.py`); and an insert that
  meets an active task's idempotency key waits for that task's transaction, then does nothing;
- `INDEXED BY <index>` and a unary `+` before a column in a condition (`AND +status = ...`:
  SQLite's planner hints, the second telling it not to use that column's index) are dropped:
  PostgreSQL's planner needs none, and has no unary `+` for text;
- `INSERT OR IGNORE INTO ...` becomes `INSERT INTO ... ON CONFLICT DO NOTHING`;
- `COLLATE NOCASE` names the case-insensitive collation the migrations create;
- `json_each(?)`, a JSON array given as one parameter and read as rows of `value` (a list of ids
  of any length in one statement), becomes `json_array_elements_text(?::json)`, whose rows are
  named `value` too.

Statements whose answer nobody reads (`BEGIN`, `SAVEPOINT`, `RELEASE`, and what `execute_later`
is given: a NOTIFY, a new run, a run's new status, a completion's dependents counting one dependency
less) are not sent on their own: they go with the next statement
that is, in one pipeline, so one round trip carries them all. A round trip to the server is most
of what a statement costs (~120-160 us on the 2-core machines here, a prepared one-row SELECT
included), and a tick's transactions are mostly such bookkeeping: one task's submit, start and
ending took 22 round trips, and take 10 now (`tests/test_postgres_round_trips.py`).

What this changes for a caller: nothing it can see. A transaction that ends before anything was
sent costs no round trip at all; a `SAVEPOINT` released or rolled back to before anything followed
it is dropped; an error in the statement that carried held ones is raised by it, as before. An
error of a held statement (only a lost session, or what fails the whole transaction, can make
one) dooms its transaction: every statement but a ROLLBACK raises it (`_pipelined`).

Errors come out as the `sqlite3` exception classes the store already catches (both are DB-API 2
hierarchies): an `IntegrityError` on a unique index means the same on both backends. Each keeps
its SQLSTATE (`.sqlstate`), by which `daemon.faults` tells what it means for the daemon; an error
on a connection the server has closed (a restart) says `CONNECTION_LOST`, and `reconnect` then
opens a new session in the same object, so that whatever holds it goes on with it.

psycopg is imported here (and by `wakeups.Listener` when one is made) only: a SQLite-only daemon
and `fredica status` never pay for it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import re
import sqlite3
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import psycopg
import psycopg.conninfo
import psycopg.pq
import psycopg.sql

from daemon.errors import DatabaseUnusable
from daemon.store import backend, db
from daemon.store.postgres import answer_watch, connecting

_INDEXED_BY = re.compile(r"\s+INDEXED\s+BY\s+\w+", re.IGNORECASE)
_INSERT_OR_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO\b", re.IGNORECASE)
_BEGIN_IMMEDIATE = re.compile(r"^\s*BEGIN\s+IMMEDIATE\s*$", re.IGNORECASE)
# A `+` right before a name, opening a condition (after WHERE, AND, OR, ON or a parenthesis): never
# arithmetic, which has an operand on its left.
_UNARY_PLUS = re.compile(r"(\b(?:WHERE|AND|OR|ON)\s+|\()\+(?=[A-Za-z_])", re.IGNORECASE)
_JSON_EACH = re.compile(r"\bjson_each\(\s*\?\s*\)", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The PostgreSQL text of a statement in the store's dialect (see the module docstring)."""
    if _BEGIN_IMMEDIATE.match(sql):
        return "BEGIN"
    sql = _in_sql(_rewritten, sql)
    if _INSERT_OR_IGNORE.match(sql):
        sql = _INSERT_OR_IGNORE.sub("INSERT INTO", sql) + " ON CONFLICT DO NOTHING"
    return _placeholders(sql)


# Quoted text or a quoted name ('' and "" inside are the quote itself): never SQL to rewrite.
_QUOTED = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")""")


def _in_sql(rewrite: Callable[[str], str], sql: str) -> str:
    """`rewrite` applied to the parts of `sql` outside quotes: `AND +y` in a string is text."""
    parts = _QUOTED.split(sql)
    return "".join(part if index % 2 else rewrite(part) for index, part in enumerate(parts))


def _rewritten(sql: str) -> str:
    """SQLite's planner hints dropped, `json_each(?)` made PostgreSQL's (in SQL outside quotes)."""
    sql = _INDEXED_BY.sub("", sql)
    sql = _UNARY_PLUS.sub(r"\1", sql)
    return _JSON_EACH.sub("json_array_elements_text(?::json)", sql)


# What `PostgresConnection.execute` does with a statement (on its translated text): hold it back
# for the next one, or drop what is held back, or send it.
BEGIN, SAVEPOINT, RELEASE, ROLLBACK_TO, COMMIT, ROLLBACK, OTHER = range(7)
_BOOKKEEPING = re.compile(
    r"^\s*(BEGIN|START\s+TRANSACTION|SAVEPOINT|RELEASE|ROLLBACK\s+TO|COMMIT|END|ROLLBACK|ABORT)\b", re.IGNORECASE
)
# The savepoint a SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK TO [SAVEPOINT] names: the rest of its
# text, a name quoted or not (the keyword SAVEPOINT is taken as one only before a name).
_SAVEPOINT_NAME = re.compile(r'\s+(?:SAVEPOINT\s+(?=\S))?("(?:[^"]|"")+"|[A-Za-z_][\w$]*)\s*;?\s*$', re.IGNORECASE)
# The statements that end the life of a NOTIFY queued before them: the transaction's start or end,
# or a rollback to a savepoint, which takes back what followed it.
_FORGETS_WAKEUP = frozenset((BEGIN, COMMIT, ROLLBACK, ROLLBACK_TO))
_KINDS = {"BEGIN": BEGIN, "START": BEGIN, "SAVEPOINT": SAVEPOINT, "RELEASE": RELEASE, "ROLLBACK TO": ROLLBACK_TO,
          "COMMIT": COMMIT, "END": COMMIT, "ROLLBACK": ROLLBACK, "ABORT": ROLLBACK}


@functools.lru_cache(maxsize=1024)
def _kind(sql: str) -> tuple[int, str]:
    """What a translated statement is to the round-trip saving, and the savepoint it names."""
    match = _BOOKKEEPING.match(sql)
    if match is None:
        return OTHER, ""
    word = " ".join(match.group(1).upper().split())
    kind = _KINDS["START" if word.startswith("START") else word]
    if kind not in (SAVEPOINT, RELEASE, ROLLBACK_TO):
        return kind, ""
    named = _SAVEPOINT_NAME.match(sql, match.end())
    if named is None or (kind == SAVEPOINT and named.group(0).lstrip().upper().startswith("SAVEPOINT ")):
        # A name not understood: a SAVEPOINT sent as it is, which is always right; a RELEASE or
        # ROLLBACK TO keeps its kind (a ROLLBACK TO still forgets a NOTIFY) but matches no held one.
        return (OTHER, "") if kind == SAVEPOINT else (kind, "")
    name = named.group(1)
    # As the server reads it: a quoted name as written, any other folded to lower case.
    return kind, name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _placeholders(sql: str) -> str:
    """`?` → `%s`, `:name` → `%(name)s` outside quotes; every literal `%` doubled (psycopg reads
    `%` everywhere, inside string literals too); `::` casts left alone."""
    out: list[str] = []
    i, n = 0, len(sql)
    quote: str | None = None
    while i < n:
        c = sql[i]
        if c == "%":
            out.append("%%")
        elif quote is not None:
            out.append(c)
            if c == quote:
                quote = None
        elif c in ("'", '"'):
            quote = c
            out.append(c)
        elif c == "?":
            out.append("%s")
        elif c == ":" and i + 1 < n and sql[i + 1] == ":":
            out.append("::")
            i += 1
        elif c == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_"):
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            out.append(f"%({sql[i + 1 : j]})s")
            i = j
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


class Row(tuple):
    """A row read by position or by column name, as `sqlite3.Row` is."""

    _index: dict[str, int]

    def __new__(cls, values: Sequence[Any], index: dict[str, int]) -> "Row":
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


class _NoResult:
    """What a statement held back or dropped returns: a cursor with no rows, as BEGIN's is."""

    rowcount = -1
    description = None

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def __iter__(self) -> Any:
        return iter(())


_NOTHING = _NoResult()


def _row_factory(cursor: psycopg.Cursor[Any]) -> Any:
    # The names straight from the result, not `cursor.description`, whose Column objects cost
    # 31 us for the task table's columns: most of a one-row SELECT, at every statement.
    result = cursor.pgresult
    names = [result.fname(position) for position in range(result.nfields)] if result is not None else []
    if None in names:  # a result that names no fields (a COPY's): as psycopg describes it
        index = {column.name: position for position, column in enumerate(cursor.description or ())}
    else:
        encoding = cursor.connection.info.encoding  # the client's, as psycopg decodes the names
        index = {name.decode(encoding): position for position, name in enumerate(names)}  # type: ignore[union-attr]
    return lambda values: Row(values, index)


def _held_failed(exc: psycopg.Error, raw: psycopg.Connection[Any]) -> sqlite3.Error:
    """The error that dooms a transaction whose held statement failed (`_pipelined`)."""
    error = _as_sqlite_error(exc, raw)
    doomed = type(error)(f"{error} in a statement sent ahead of the next: its transaction can only be rolled back")
    doomed.sqlstate = getattr(error, "sqlstate", None)  # type: ignore[attr-defined]
    return doomed


def _again(error: sqlite3.Error) -> sqlite3.Error:
    """A new exception like `error`, for each statement its doomed transaction refuses."""
    again = type(error)(*error.args)
    again.sqlstate = getattr(error, "sqlstate", None)  # type: ignore[attr-defined]
    return again


# SQLSTATE in_failed_sql_transaction: what a COMMIT that rolled back says (`_execute`).
IN_FAILED_TRANSACTION = "25P02"
# SQLSTATE connection_failure: what an error on a lost connection says when psycopg gives none
# ("the connection is closed", after the server ended the session).
CONNECTION_LOST = "08006"


def _as_sqlite_error(exc: psycopg.Error, raw: psycopg.Connection[Any] | None = None) -> sqlite3.Error:
    """The store's exception class for a psycopg one, keeping its message (and SQLSTATE)."""
    sqlstate = exc.sqlstate
    if sqlstate is None and raw is not None and (raw.broken or raw.closed):
        sqlstate = CONNECTION_LOST
    kind: type[sqlite3.Error]
    if isinstance(exc, psycopg.IntegrityError):
        kind = sqlite3.IntegrityError
    elif isinstance(exc, psycopg.OperationalError):
        kind = sqlite3.OperationalError
    elif isinstance(exc, psycopg.ProgrammingError):
        kind = sqlite3.ProgrammingError
    else:
        kind = sqlite3.DatabaseError
    error = kind(f"{_first_line(exc)} (SQLSTATE {sqlstate})" if sqlstate else str(exc))
    error.sqlstate = sqlstate  # type: ignore[attr-defined]
    return error


class PostgresConnection:
    """The part of `sqlite3.Connection` the store uses, over one psycopg connection.

    Autocommit at the driver level: transactions are opened and ended by the store's own
    `BEGIN`/`COMMIT` (`db.write`), exactly as on SQLite, so that `in_transaction` and nesting mean
    the same on both backends.
    """

    backend = backend.POSTGRESQL

    def __init__(self, raw: psycopg.Connection[Any], url: str, *, read_only: bool = False) -> None:
        self.raw = raw
        self.url = url
        self.deferred: db.Deferred | None = None  # as `db.StoreConnection`'s
        # Wake-ups (`wakeups.notify`): whether to send them at all ([daemon] notify), and whether
        # this transaction has queued one already, so that it queues one however many it makes.
        self.notify_wakeups = True
        self.wakeup_queued = False
        self.read_only = read_only
        # Statements held back to go with the next one sent (the module docstring), in order,
        # with their kind and the savepoint they name; and whether a BEGIN is among them, when
        # the server knows of no transaction yet.
        self._unsent: list[tuple[str, Sequence[Any] | dict[str, Any], int, str]] = []
        self._begin_unsent = False
        # The failure of a held statement, which dooms its transaction (`_pipelined`).
        self._doomed: sqlite3.Error | None = None
        # When the round trip under way began (None: none is), for the watch that gives up a
        # session whose server stopped answering (`answer_watch`); what it waited, once it has.
        self.waiting_since: float | None = None
        self.answer_lock = threading.Lock()
        self.watched = True  # False: round trips that may rightly wait long (`unwatched`)
        self._given_up_after: float | None = None
        # The server processes of sessions lost or given up, by pid and start (a pid alone could
        # name another session after a server restart; a start not known: None): ended once a
        # new session is had, so that a transaction one may hold (its row locks, a COMMIT in its
        # buffer) does not wait for the server to notice; forgotten once gone
        # (`lost_sessions_ended`). Behind a pooler (`notify_wakeups` off: PgBouncer in transaction
        # mode) a server process is not this session's: none is kept, nor ever ended.
        # Only the writer's: a read-only session holds no transaction a later writer waits for.
        self._lost_sessions: set[tuple[int, datetime.datetime | None]] = set()
        answer_watch.WATCH.watch(self)
        self._session = None if read_only else self._identity()
        read_only = self.read_only
        self._reconnector: connecting.Connector[psycopg.Connection[Any]] = connecting.Connector(
            lambda: _raw_connection(url, read_only, connect_timeout=RECONNECT_TIMEOUT),
            lambda raw: raw.close(), name="fredica-reconnect",
        )

    @property
    def in_transaction(self) -> bool:
        return self._begin_unsent or self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    @property
    def broken(self) -> bool:
        """Whether the session is lost (the server restarted, or the network dropped it)."""
        return self.raw.broken or self.raw.closed

    def reconnect(self) -> None:
        """A new session in place of this one; a `CONNECTION_LOST` OperationalError while the
        server cannot be reached, or while the connect is still under way: it runs on a thread
        of its own (`connecting`), and the next call looks whether it is done. So a server's host
        that does not answer never holds up the caller (the loop, which steers its tasks
        meanwhile) for longer than `connecting.FIRST_WAIT`."""
        if not self._reconnector.under_way:
            self._forget_unsent()  # they belonged to the session that is gone
            self._doomed = None
            self._given_up_after = None
            if self._session is not None and self.notify_wakeups:
                self._lost_sessions.add(self._session)
            self._session = None
            with contextlib.suppress(psycopg.Error):
                self.raw.close()
        try:
            raw = self._reconnector.look()
        except psycopg.Error as exc:
            raise _unreachable(_first_line(exc), exc.sqlstate) from exc
        if raw is None:
            raise _unreachable("still connecting")
        self.raw = raw
        self._session = None if self.read_only else self._identity()
        with contextlib.suppress(sqlite3.Error):
            self.lost_sessions_ended()  # asks the server to end them, at once

    def _identity(self) -> tuple[int, datetime.datetime | None]:
        """This session's server process: its pid, and when it started (None if that could not be
        read): the two name it on the server, where a pid alone may be another's after a restart."""
        pid = self.raw.info.backend_pid
        try:
            row = self.execute("SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
        except sqlite3.Error:
            return pid, None
        return pid, row[0] if row is not None else None

    def lost_sessions_ended(self) -> bool:
        """Whether every session this connection lost is gone from the server: until then one
        could still commit what it was sent. Each look asks the server to end those it can name
        for sure (pid and start); one whose start is not known is waited for."""
        if not self._lost_sessions:
            return True
        pids = [pid for pid, _ in self._lost_sessions]
        starts = [start for _, start in self._lost_sessions]
        alive = self.execute(
            "SELECT a.pid, a.backend_start, CASE WHEN a.backend_start = lost.started THEN pg_terminate_backend(a.pid) END"
            " FROM pg_stat_activity AS a JOIN unnest(?::int[], ?::timestamptz[]) AS lost (pid, started)"
            " ON a.pid = lost.pid AND (lost.started IS NULL OR a.backend_start = lost.started)", (pids, starts),
        ).fetchall()
        self._lost_sessions = {
            (pid, start) for pid, start in self._lost_sessions
            if any(row[0] == pid and (start is None or row[1] == start) for row in alive)
        }
        return not self._lost_sessions

    @contextlib.contextmanager
    def unwatched(self) -> Iterator[None]:
        """Round trips inside that the answer watch leaves alone: those that may rightly wait long
        (a migration waits for the lock that `fredica db copy` holds for its whole copy)."""
        before, self.watched = self.watched, False
        try:
            yield
        finally:
            self.watched = before

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> psycopg.Cursor[Any]:
        deferred = self.deferred
        if deferred is not None and deferred.pending:
            db.before(self, deferred, sql)
        text = translate(sql)
        kind, name = _kind(text)
        if self.wakeup_queued and kind in _FORGETS_WAKEUP:
            self.wakeup_queued = False
        if self.watched:
            self.waiting_since = time.monotonic()
        try:
            # Parameters always given, if none: psycopg then reads the text's `%%` as the `%` it
            # stands for (`translate` doubles every one), where with None it sends `%%` as it is.
            cursor = self._execute(text, params, kind, name)
        except psycopg.Error as exc:
            error = self._error(exc)
            if kind == COMMIT and (self._given_up_after is not None or db.is_lost(self)):
                # Sent, and maybe committed: what is known lost is its answer.
                error.in_doubt = True  # type: ignore[attr-defined]
            raise error from exc
        finally:
            self._answered()
        if deferred is not None and deferred.pending:
            db.after(deferred, sql)
        return cursor

    def execute_later(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run `sql`, whose result nobody reads, with the next statement sent (a NOTIFY, say):
        in the same transaction, and in the same round trip."""
        self._unsent.append((translate(sql), params, OTHER, ""))

    def _execute(self, text: str, params: Sequence[Any] | dict[str, Any], kind: int, name: str) -> Any:
        """`text` (of `kind`, naming savepoint `name`) sent, or held back, or dropped with what it
        undoes (the module docstring)."""
        if self._doomed is not None:
            if kind != ROLLBACK:
                raise _again(self._doomed)
            self._doomed = None
        unsent = self._unsent
        if kind == OTHER:
            return self._send(text, params)
        if kind in (BEGIN, SAVEPOINT):
            unsent.append((text, params, kind, name))
            self._begin_unsent = self._begin_unsent or kind == BEGIN
            return _NOTHING
        if kind == RELEASE or kind == ROLLBACK_TO:
            if unsent and unsent[-1][2] == SAVEPOINT and unsent[-1][3] == name:
                if kind == RELEASE:  # nothing was done inside it: it need never exist
                    unsent.pop()
                return _NOTHING  # back to a savepoint nothing followed: there is nothing to undo
            if kind == RELEASE:
                unsent.append((text, params, kind, name))
                return _NOTHING
            return self._send(text, params)
        # COMMIT or ROLLBACK. What a ROLLBACK takes back need not be done first; a transaction the
        # server never heard of ends without a word to it, unless it holds work (a NOTIFY).
        if kind == ROLLBACK or not any(held[2] == OTHER for held in unsent):
            begun_here = self._begin_unsent
            self._forget_unsent()
            if begun_here:
                return _NOTHING
        cursor = self._send(text, params)
        if kind == COMMIT and cursor.statusmessage == "ROLLBACK":
            # A COMMIT of a transaction an error aborted rolls it back without an error of its own
            # (PostgreSQL's way; SQLite's transaction would have gone on): the caller must not
            # take it for committed.
            error = sqlite3.OperationalError(
                "the transaction was rolled back, not committed: one of its statements had failed (SQLSTATE 25P02)"
            )
            error.sqlstate = IN_FAILED_TRANSACTION  # type: ignore[attr-defined]
            raise error
        return cursor

    def _send(self, text: str, params: Sequence[Any] | dict[str, Any]) -> Any:
        if not self._unsent:
            return self.raw.execute(text, params)
        return self._pipelined(lambda: self.raw.execute(text, params))

    def _pipelined(self, carrier: Callable[[], Any]) -> Any:
        """The held statements and then `carrier`'s in one pipeline: they go out together, and the
        answers come back together; the first error among them is raised at its end.

        An error of a held statement is not the carrier's, nor that of the savepoint the carrier
        runs in: the held one belonged to a block that has ended already (a RELEASE held after it),
        and a ROLLBACK TO the carrier's savepoint, which then never began, would undo that earlier
        block, and let the transaction commit without it. So it dooms the transaction: every
        statement but a ROLLBACK raises it again, and the caller's `db.write` rolls it all back.
        """
        unsent = self._unsent
        self._forget_unsent()
        answers: list[Any] = []
        try:
            with self.raw.pipeline():
                for held, held_params, _, _ in unsent:
                    answers.append(self.raw.execute(held, held_params))
                cursor = carrier()
        except psycopg.Error as exc:
            if self._given_up_after is not None or db.is_lost(self):
                raise  # the session is gone (or given up): no transaction is left to doom
            # The statements before the one that failed have their results, and none after it do.
            if len(answers) < len(unsent) or any(answer.pgresult is None for answer in answers):
                self._doomed = _held_failed(exc, self.raw)
                raise _again(self._doomed) from exc
            raise
        return cursor

    def _forget_unsent(self) -> None:
        self._unsent = []
        self._begin_unsent = False

    def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        deferred = self.deferred
        if deferred is not None and deferred.pending:
            db.before(self, deferred, sql)
        if self._doomed is not None:
            raise _again(self._doomed)
        if self.watched:
            self.waiting_since = time.monotonic()
        try:
            cursor = self.raw.cursor()
            # In a pipeline, as psycopg's executemany runs anyway: the held statements first.
            self._pipelined(lambda: cursor.executemany(translate(sql), list(seq_of_params)))
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        finally:
            self._answered()
        return cursor

    def _answered(self) -> None:
        with self.answer_lock:  # the watch shuts no socket once this round trip is over
            self.waiting_since = None

    def give_up(self, limit: float) -> None:
        """The server has not answered the round trip under way within `limit` seconds: end the
        session (`answer_watch`; called on the watch's thread), which makes that round trip fail
        as a lost connection."""
        # Set first: the owner's thread raises as soon as the socket is shut, and must say why.
        self._given_up_after = limit
        try:
            if answer_watch.shut(self.raw.pgconn.socket):
                return
        except psycopg.Error:
            pass
        self._given_up_after = None  # not shut (closed meanwhile): nothing was given up

    def _error(self, exc: psycopg.Error) -> sqlite3.Error:
        if self._given_up_after is not None:
            return _unreachable(f"the server did not answer within {self._given_up_after:g} s")
        return _as_sqlite_error(exc, self.raw)

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Write `rows` (values in the order of `columns`) into `table` with COPY, in the current
        transaction: the fastest way in for many rows (`fredica db copy`). How many it wrote."""
        statement = psycopg.sql.SQL("COPY {} ({}) FROM STDIN").format(
            psycopg.sql.Identifier(table), psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, columns))
        )
        written = 0
        if self._doomed is not None:
            raise _again(self._doomed)
        try:
            if self._unsent:  # a COPY cannot go in a pipeline: the held statements go first
                self._pipelined(lambda: None)
            with self.raw.cursor() as cursor, cursor.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)
                    written += 1
        except psycopg.Error as exc:
            raise _as_sqlite_error(exc, self.raw) from exc
        return written

    def close(self) -> None:
        self._forget_unsent()
        self._doomed = None
        self._reconnector.abandon()
        self.raw.close()

    def __enter__(self) -> "PostgresConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Seconds a reconnection waits for the server: the loop keeps watching its tasks between tries.
RECONNECT_TIMEOUT = 2


def _raw_connection(url: str, read_only: bool, **options: Any) -> psycopg.Connection[Any]:
    # A connect to a server that does not answer waits for connect_timeout (libpq's, whole
    # seconds, at least 2), not for ever: a reader's thread reconnects after a session given up.
    # One the URL sets is its user's (a keyword given here would override it).
    if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(url):
        options.setdefault("connect_timeout", max(2, round(answer_watch.WATCH.limit)))
    raw = psycopg.connect(url, autocommit=True, row_factory=_row_factory, **options)
    if read_only:
        raw.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    return raw


def _unreachable(why: str, sqlstate: str | None = None) -> sqlite3.OperationalError:
    """What failing to reach a server that was reached before says: a lost connection, a fault
    that passes (`daemon.faults`: UNAVAILABLE)."""
    error = sqlite3.OperationalError(f"cannot reach the database: {why}")
    error.sqlstate = sqlstate or CONNECTION_LOST  # type: ignore[attr-defined]
    return error


def connect(url: str, *, read_only: bool = False, reached_before: bool = False) -> PostgresConnection:
    """A connection to the database at `url`, schema untouched (`read_only`: one that refuses
    every write, for the readers beside the loop and the CLI's reads with no daemon).
    DatabaseUnusable when it cannot be reached; with `reached_before` (a reader beside a daemon
    that opened it), the OperationalError of a lost connection instead: the server is away now."""
    try:
        raw = _raw_connection(url, read_only)
    except psycopg.Error as exc:
        if reached_before:
            raise _unreachable(_first_line(exc), exc.sqlstate) from exc
        raise DatabaseUnusable(f"cannot connect to the database {backend.shown(url)}: {_first_line(exc)}") from None
    return PostgresConnection(raw, url, read_only=read_only)


def open_database(url: str, *, answer_timeout: float | None = None) -> PostgresConnection:
    """Connect to the database at `url` and bring its schema up to date (SPEC §13, §16).
    `answer_timeout`: how long a round trip of this process's sessions may wait for the server's
    answer from now on (`answer_watch`; the daemon's `database_answer_timeout`)."""
    from daemon.store.postgres import migrations

    if answer_timeout is not None:
        answer_watch.WATCH.limit = answer_timeout
    conn = connect(url)
    try:
        with conn.unwatched():  # may wait for the lock of a `fredica db copy` under way
            migrations.migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

