"""Which backend a `database` setting names, and which one a connection is on.

A path is SQLite (the default, and the fastest on one host); a `postgresql://` URL is PostgreSQL
(`postgres.py`, several supervisors sharing one queue, SPEC §16). Nothing here imports psycopg:
a SQLite daemon and the CLI never pay for loading it.
"""

from __future__ import annotations

from pathlib import Path

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(database: str | Path) -> bool:
    """Whether `database` (a config value: a path or a URL) names a PostgreSQL database."""
    return isinstance(database, str) and database.startswith(POSTGRES_SCHEMES)


def of(conn: object) -> str:
    """The backend a connection is on (a `sqlite3.Connection` has no `backend` attribute)."""
    return getattr(conn, "backend", SQLITE)
