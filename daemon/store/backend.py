"""Which backend a `database` setting names, and which one a connection is on.

A path is SQLite (the default, and the fastest on one host); a `postgresql://` URL is PostgreSQL
(`postgres/`, several supervisors sharing one queue, SPEC §16). Nothing here imports psycopg:
a SQLite daemon and the CLI never pay for loading it.
"""

from __future__ import annotations

import re
from pathlib import Path

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(database: str | Path) -> bool:
    """Whether `database` (a config value: a path or a URL) names a PostgreSQL database."""
    return isinstance(database, str) and database.startswith(POSTGRES_SCHEMES)


def shown(database: str | Path) -> str:
    """`database` as messages and logs show it: a URL without its password."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", str(database)) if is_postgres(database) else str(database)


def of(conn: object) -> str:
    """The backend a connection is on (a `sqlite3.Connection` has no `backend` attribute)."""
    return getattr(conn, "backend", SQLITE)


def skip_locked(conn: object) -> str:
    """The clause that makes a SELECT lock the rows it takes and pass over those another
    transaction holds, on PostgreSQL: for a claim, where several supervisors take ready tasks at
    once (SQLite's writers are serialized already)."""
    return " FOR UPDATE SKIP LOCKED" if of(conn) == POSTGRESQL else ""


def for_share(conn: object) -> str:
    """The clause that makes a SELECT lock the rows it reads until commit on PostgreSQL (SQLite's
    writers are serialized already, and it has no such clause): for reads that a write in the
    same transaction depends on, such as the statuses of a submission's dependencies."""
    return " FOR SHARE" if of(conn) == POSTGRESQL else ""


def for_update(conn: object) -> str:
    """The clause that makes a SELECT lock the rows it reads for a write that follows, on
    PostgreSQL: for a rescue or a start's recovery, which move one supervisor's tasks while
    others run (SQLite's writers are serialized already)."""
    return " FOR UPDATE" if of(conn) == POSTGRESQL else ""
