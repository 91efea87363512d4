"""What a statement's quoted text says reaches the database unchanged, on both backends: the
PostgreSQL adapter's translations (daemon/store/postgres/connection.py) act on SQL, not on text."""

from __future__ import annotations

import sqlite3

from tests.conformance import conn  # noqa: F401 (every test on every backend)


def test_a_percent_sign_in_a_statement_without_parameters_is_one_percent_sign(conn: sqlite3.Connection) -> None:
    assert conn.execute("SELECT 'done: 100%'").fetchone()[0] == "done: 100%"


def test_a_percent_sign_in_a_statement_with_parameters_is_one_percent_sign(conn: sqlite3.Connection) -> None:
    assert conn.execute("SELECT 'done: 100%' WHERE 1 = ?", (1,)).fetchone()[0] == "done: 100%"


def test_a_plus_sign_in_quoted_text_is_kept(conn: sqlite3.Connection) -> None:
    # SQLite's planner hint `AND +column` is dropped on PostgreSQL; text that reads alike is not SQL.
    assert conn.execute("SELECT 'x AND +y' WHERE 1 = ?", (1,)).fetchone()[0] == "x AND +y"


def test_arithmetic_plus_is_kept(conn: sqlite3.Connection) -> None:
    assert conn.execute("SELECT 2 + ? WHERE 1 = 1 AND +1 = 1", (1,)).fetchone()[0] == 3
