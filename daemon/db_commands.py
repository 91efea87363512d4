"""`fredica db`: the database itself, with no daemon in between: `db copy` moves a SQLite queue
into PostgreSQL (SPEC §16).

Registered on `daemon.cli`'s group when that module is imported (lazily, as the acting commands
are): psycopg and the store are imported only when a command here runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from daemon import cli
from daemon.errors import CopyRefused

if TYPE_CHECKING:
    from daemon.store.postgres.copy import Copied


@cli.main.group("db", cls=cli.FredicaGroup)
@cli.config_option()
def db_group() -> None:
    """The database itself: copy a queue to PostgreSQL."""


@cli.command(db_group, "copy")
@click.argument("sqlite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("postgres_url")
def copy(sqlite_file: Path, postgres_url: str) -> None:
    """Copy a SQLite queue into an empty PostgreSQL database.

    Every table and row as it is (ids, seqs, statuses, results, the restart log), in one
    transaction; the SQLite file is only read. Refused, with nothing written: while a daemon owns
    the file; when its schema is older than this fredica-worker's (start the daemon on it once to
    migrate it, stop it, then copy); when the PostgreSQL database already holds rows. The target
    is migrated in the same transaction: a copy that fails leaves it as it was. Tasks left
    claimed or running are copied so, for the recovery of the first daemon that starts on
    PostgreSQL. Then point [daemon] database at POSTGRES_URL.
    """
    import sqlite3  # the database errors of both backends (the PostgreSQL connection raises these)

    from daemon.store import backend, db
    from daemon.store.postgres import connection, copy as copying

    if not backend.is_postgres(postgres_url):
        raise CopyRefused(f"POSTGRES_URL must be a postgresql:// URL, not {postgres_url!r}")
    shown_target = backend.shown(postgres_url)
    started = time.monotonic()
    with _no_daemon_owns(sqlite_file):
        try:
            source = db.connect_read_only(sqlite_file)
        except FileNotFoundError:
            raise CopyRefused(f"there is no database file {sqlite_file}") from None
        except sqlite3.Error as exc:  # it may not be read (a file that is no database: check_source)
            raise CopyRefused(f"cannot read {sqlite_file}: {exc}") from None
        with contextlib.closing(source):
            copying.check_source(source, str(sqlite_file))
            # Unwatched (`answer_watch`): one long transaction, whose lock waits for a daemon's
            # writes and whose ANALYZE and COMMIT grow with the queue.
            with connection.connect(postgres_url) as target, target.unwatched():
                # Before migrating: a database that holds another queue is refused untouched.
                copying.refuse_unless_empty(target, shown_target)
                try:
                    copied = copying.copy(source, target, shown_target)
                except sqlite3.Error as exc:
                    if getattr(exc, "in_doubt", False):  # its COMMIT was sent, its answer lost
                        raise CopyRefused(
                            f"the connection was lost as the copy was being committed: it may have been made "
                            f"({exc}); a copy made is there to read, and a second copy into it is refused"
                        ) from None
                    raise CopyRefused(f"the copy failed, nothing was written: {exc}") from None
    click.echo(_summary(copied, shown_target, time.monotonic() - started))


# What a row of each table is, for the summary; a table not named here says "rows in <table>".
_NOUNS = {
    "task_dependency": ("dependency", "dependencies"),
    "restart_task_log": ("restart-log entry", "restart-log entries"),
    "queue_state": ("paused queue state", "paused queue states"),
    "boot": ("boot time", "boot times"),
}


def _summary(copied: Copied, target: str, seconds: float) -> str:
    """One line: `copied N tasks in M runs (what else) to URL in S s`."""
    tasks, runs = copied.tasks, copied.runs
    others = []
    for table, count in copied.rows.items():
        if table in ("task", "workflow_run") or not count:
            continue
        singular, plural = _NOUNS.get(table, (f"row in {table}", f"rows in {table}"))
        others.append(f"{count} {singular if count == 1 else plural}")
    if copied.nul_replaced:
        others.append(f"{copied.nul_replaced} text value{'s' * (copied.nul_replaced != 1)} with NUL bytes, "
                      "copied with U+FFFD in their place")
    extra = f" ({', '.join(others)})" if others else ""
    return (f"copied {tasks} task{'s' * (tasks != 1)} in {runs} run{'s' * (runs != 1)}{extra} "
            f"to {target} in {seconds:.1f} s")


@contextlib.contextmanager
def _no_daemon_owns(database: Path) -> Iterator[None]:
    """Refuse (CopyRefused) while a daemon holds the database's single-owner lock, and keep one
    from starting until the copy is done: a shared flock on `<database>.lock` (the daemon takes
    it exclusive, `service.DatabaseLock`), released at the end. No lock file: no daemon runs."""
    from daemon import service

    lock_path = service.DatabaseLock(database).path
    try:
        handle = open(lock_path)  # read-only: the copy writes nothing beside the database
    except FileNotFoundError:
        yield
        return
    except OSError as exc:
        raise CopyRefused(f"cannot tell whether a daemon owns {database}: {exc.strerror} ({lock_path})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = handle.read().strip() or "unknown"
            raise CopyRefused(
                f"a fredica daemon (pid {owner}) owns {database}: stop it first, so that no task is "
                "copied in the middle of a change"
            ) from None
        yield
