"""The PostgreSQL backend's translation of the store's SQLite dialect (daemon/store/postgres/connection.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from daemon.store import backend  # noqa: E402
from daemon.store.postgres.connection import translate  # noqa: E402


@pytest.mark.parametrize(
    "sqlite, postgres",
    [
        ("SELECT * FROM task WHERE id = ?", "SELECT * FROM task WHERE id = %s"),
        ("UPDATE task SET a = :a, b = :b_2 WHERE seq IN (:s0)", "UPDATE task SET a = %(a)s, b = %(b_2)s WHERE seq IN (%(s0)s)"),
        # Quoted text keeps its ? and :word; every % is doubled for psycopg, quoted or not.
        ("SELECT '?:x%' FROM t WHERE a LIKE ? || '%'", "SELECT '?:x%%' FROM t WHERE a LIKE %s || '%%'"),
        ('SELECT "odd?col" FROM t WHERE x::text = ?', 'SELECT "odd?col" FROM t WHERE x::text = %s'),
        ("BEGIN IMMEDIATE", "BEGIN"),
        ("SELECT min(x) FROM task INDEXED BY task_delayed WHERE a = 1", "SELECT min(x) FROM task WHERE a = 1"),
        ("INSERT OR IGNORE INTO d (a, b) VALUES (?, ?)", "INSERT INTO d (a, b) VALUES (%s, %s) ON CONFLICT DO NOTHING"),
        # SQLite's "use no index of this column": PostgreSQL has no unary + for text.
        ("SELECT id FROM task WHERE id IN (?) AND +status IN ('claimed')",
         "SELECT id FROM task WHERE id IN (%s) AND status IN ('claimed')"),
        ("UPDATE task SET attempt = attempt + 1, n = n +1 WHERE (+status = ?)",
         "UPDATE task SET attempt = attempt + 1, n = n +1 WHERE (status = %s)"),
    ],
)
def test_statements_are_translated(sqlite: str, postgres: str) -> None:
    assert translate(sqlite) == postgres


def test_a_url_names_postgres_and_a_path_sqlite() -> None:
    assert backend.is_postgres("postgresql:///q?host=/tmp")
    assert backend.is_postgres("postgres://u@h/q")
    assert not backend.is_postgres("/var/lib/fredica/fredica.db")
    assert not backend.is_postgres("postgresql.db")
