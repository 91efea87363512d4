"""`fredica db copy`: a SQLite queue moved into a PostgreSQL database whole (SPEC §16).

Every table of the SQLite database, every row as it is: ids, seqs, statuses, results, the restart
log, and tasks a daemon left claimed or running when it stopped (the PostgreSQL daemon's recovery
deals with those as SQLite's would have). The rows go in with COPY, one table after another in the
order their foreign keys need, in one transaction: a copy that fails leaves the target as it was.
Then each identity counter (`task.seq`, the restart log's id) is set past the highest value the
SQLite database ever handed out, so that new rows neither collide with copied ones nor reuse the
seq of a task cleaned away.

Both databases must be at this fredica-worker's schema version (the target is migrated in the
copy's transaction), so that their tables and columns are the same; a target that holds any row
already is refused: merging two queues is not a copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from typing import TYPE_CHECKING, Any, Iterator

import sqlite_utils

from daemon.errors import CopyRefused
from daemon.store import migrations as sqlite_migrations, statuses
from daemon.store.postgres import migrations

if TYPE_CHECKING:
    from daemon.store.postgres.connection import PostgresConnection

# Kept by fredica-worker's migrations, never copied: each side records its own schema version.
_BOOKKEEPING = {"schema_version"}


@dataclasses.dataclass(frozen=True)
class Copied:
    """How many rows of each table the copy wrote, in the order it wrote them."""

    rows: dict[str, int]
    nul_replaced: int = 0  # text values that held NUL bytes, written with U+FFFD instead

    @property
    def tasks(self) -> int:
        return self.rows.get("task", 0)

    @property
    def runs(self) -> int:
        return self.rows.get("workflow_run", 0)


def check_source(source: sqlite3.Connection, shown: str) -> None:
    """Refuse a SQLite database that is not fredica-worker's, or not at its schema version:
    CopyRefused with what to do. `shown` names the database in the message."""
    try:
        version = sqlite_migrations.current_version(source)
        has_tasks = source.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'task'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise CopyRefused(f"{shown} is not a fredica database ({exc})") from None
    if has_tasks is None:
        raise CopyRefused(f"{shown} is not a fredica database (it has no task table)")
    latest = sqlite_migrations.LATEST
    if version < latest:
        raise CopyRefused(
            f"the database {shown} has schema version {version}, older than this fredica-worker's ({latest}): "
            "start `fredica daemon` on it once (it migrates at start), stop it, then copy"
        )
    if version > latest:
        raise CopyRefused(
            f"the database {shown} has schema version {version}, newer than this fredica-worker "
            f"understands ({latest}): upgrade fredica-worker"
        )


def rows_held(target: "PostgresConnection") -> dict[str, int]:
    """The tables of the target that hold rows, with their counts (an unmigrated target: those
    of its tables that exist)."""
    held: dict[str, int] = {}
    for table in _target_tables(target):
        count = target.execute(f"SELECT count(*) FROM {_quoted(table)}").fetchone()[0]
        if count:
            held[table] = int(count)
    return held


def refuse_unless_empty(target: "PostgresConnection", shown: str) -> None:
    """CopyRefused when the target holds any row: a copy fills an empty database only."""
    held = rows_held(target)
    if not held:
        return
    what = (_count(held["task"], "task") if "task" in held
            else ", ".join(f"{_count(n, 'row')} in {table}" for table, n in held.items()))
    raise CopyRefused(
        f"the database {shown} already holds {what}: fredica db copy fills an empty database only "
        "(nothing was written)"
    )


def copy(source: sqlite3.Connection, target: "PostgresConnection", shown_target: str) -> Copied:
    """Migrate the empty `target` and copy every table of `source` into it, in one transaction;
    what was written. CopyRefused (nothing written) when the two schemas differ or the target is
    no longer empty; a database error rolls everything back, the migration too, and propagates."""
    source.execute("BEGIN")  # one snapshot of the source, whatever else reads it meanwhile
    try:
        counters = _highest_handed_out(source)
        target.execute("BEGIN")
        try:
            # PostgreSQL's DDL is transactional: a copy that fails leaves no empty tables behind,
            # and a daemon starting on the target meanwhile waits for the migration's lock.
            migrations.migrate_in_transaction(target)
            tables = _tables_to_copy(source, target)
            # Writers elsewhere (a daemon already started on the target) wait for the commit,
            # and the emptiness found under the lock holds until then.
            target.execute(f"LOCK TABLE {', '.join(_quoted(t) for t, _ in tables)} IN EXCLUSIVE MODE")
            refuse_unless_empty(target, shown_target)
            rows: dict[str, int] = {}
            replaced = [0]
            for table, columns in tables:
                cursor = source.cursor()
                cursor.row_factory = None  # plain tuples: COPY takes them as they come
                selected = [_copied_column(table, column) for column in columns]
                cursor.execute(f"SELECT {', '.join(selected)} FROM {_quoted(table)}")
                rows[table] = target.copy_rows(table, columns, _storable(cursor, replaced))
            _advance_identities(target, [t for t, _ in tables], counters)
            # Statistics now, not at autovacuum's next round: until then the planner takes the
            # tables for empty, and picks plans for a handful of rows (a claim, an export's pages).
            target.execute(f"ANALYZE {', '.join(_quoted(t) for t, _ in tables)}")
            target.execute("COMMIT")
        except BaseException:
            # A connection that broke has nothing to roll back, and its error is the one to report.
            with contextlib.suppress(sqlite3.Error):
                target.execute("ROLLBACK")
            raise
    finally:
        source.execute("COMMIT")
    return Copied(rows, replaced[0])


def _storable(rows: Any, replaced: list[int]) -> Iterator[tuple[Any, ...]]:
    """The rows with each NUL byte of their text replaced by U+FFFD (counted in `replaced`): SQLite
    stores text as given (an executor's error may quote output holding one), PostgreSQL text
    cannot hold NUL, and one such value must not keep a whole queue from moving."""
    for row in rows:
        if any(isinstance(value, str) and "\x00" in value for value in row):
            replaced[0] += sum(isinstance(value, str) and "\x00" in value for value in row)
            row = tuple(value.replace("\x00", "\ufffd") if isinstance(value, str) else value for value in row)
        yield row


# Live state of the SQLite daemon, not of the queue: a lease there means nothing to PostgreSQL's.
NOT_COPIED = ("supervisor",)


def _copied_column(table: str, column: str) -> str:
    """What the SELECT of the source reads for one column. A task left claimed or running names
    the SQLite daemon that claimed it, which holds no lease on PostgreSQL to be rescued by: it is
    copied as claimed by no supervisor, which the first start's recovery there takes as its own."""
    if table == "task" and column == "supervisor":
        return f"CASE WHEN status IN ({statuses.IN_FLIGHT}) THEN NULL ELSE supervisor END"
    return _quoted(column)


def _target_tables(target: "PostgresConnection") -> list[str]:
    return [
        row[0] for row in target.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
            " ORDER BY relname"
        )
        if row[0] not in _BOOKKEEPING
    ]


def _tables_to_copy(source: sqlite3.Connection, target: "PostgresConnection") -> list[tuple[str, list[str]]]:
    """Each table with its columns, a referenced table before those that reference it;
    CopyRefused when the source has a table or a column the target lacks."""
    # The source is read as any SQLite file is, whatever its version wrote: sqlite-utils'
    # introspection (its tables, each one's columns in order), not PRAGMAs spelled out here.
    schema = sqlite_utils.Database(source)
    names = [name for name in schema.table_names() if not name.startswith("sqlite_")]
    in_target = set(_target_tables(target))
    tables: dict[str, list[str]] = {}
    for name in names:
        if name in NOT_COPIED:
            continue
        if name not in in_target:
            raise CopyRefused(f"the SQLite database has a table {name} that the PostgreSQL database lacks")
        columns = [column.name for column in schema[name].columns]
        target_columns = {
            row[0] for row in target.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ?",
                (name,),
            )
        }
        missing = [column for column in columns if column not in target_columns]
        if missing:
            raise CopyRefused(f"the PostgreSQL table {name} lacks the column(s) {', '.join(missing)} of SQLite's")
        tables[name] = columns
    return [(name, tables[name]) for name in _referenced_first(target, list(tables))]


def _referenced_first(target: "PostgresConnection", tables: list[str]) -> list[str]:
    """`tables` ordered so that each comes after every table its foreign keys name."""
    references: dict[str, set[str]] = {table: set() for table in tables}
    for child, parent in target.execute(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
        " WHERE contype = 'f' AND connamespace = 'public'::regnamespace"
    ):
        if child in references and parent in references and parent != child:
            references[child].add(parent)
    ordered: list[str] = []
    while references:
        ready = sorted(table for table, parents in references.items() if not parents - set(ordered))
        if not ready:  # a cycle: the migrations make none, and COPY would refuse it row by row
            raise CopyRefused(f"the tables {', '.join(sorted(references))} reference each other in a cycle")
        for table in ready:
            ordered.append(table)
            del references[table]
    return ordered


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _quoted(name: str) -> str:
    """A table or column name as an SQL identifier (the names come from the catalogues)."""
    return '"' + name.replace('"', '""') + '"'


def _highest_handed_out(source: sqlite3.Connection) -> dict[str, int]:
    """AUTOINCREMENT's record of the highest key each table ever handed out (rows since deleted
    included): the PostgreSQL counters continue from there."""
    if source.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone() is None:
        return {}
    return {row[0]: int(row[1]) for row in source.execute("SELECT name, seq FROM sqlite_sequence")}


def _advance_identities(target: "PostgresConnection", tables: list[str], handed_out: dict[str, int]) -> None:
    """Set each identity counter of `tables` so that the next row gets a key above every copied
    one and above what SQLite ever handed out."""
    for table, column in target.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND is_identity = 'YES' ORDER BY table_name"
    ).fetchall():
        if table not in tables:
            continue
        highest = target.execute(f"SELECT coalesce(max({_quoted(column)}), 0) FROM {_quoted(table)}").fetchone()[0]
        following = max(int(highest), handed_out.get(table, 0)) + 1
        target.execute(
            "SELECT setval(pg_get_serial_sequence(?, ?), ?, false)", (_quoted(table), column, following)
        )
