"""The store's conformance suite: a test module that imports `conn` from here runs each of its
tests once per backend (SQLite and PostgreSQL, `store` in tests/conftest.py), unchanged.

    from tests.conformance import conn  # noqa: F401 (every test on every backend)

A test that opens more connections (other processes) takes `database` too: the same backend's
path or URL, the one `conn` is open on.
"""

from __future__ import annotations

import sqlite3

import pytest


@pytest.fixture
def conn(store: sqlite3.Connection) -> sqlite3.Connection:
    return store


# For a test of SQLite's own machinery (its query plans, statement traces): SQLite only.
sqlite_only = pytest.mark.parametrize("database", ["sqlite"], indirect=True)
# For a test of what PostgreSQL alone has (LISTEN/NOTIFY): PostgreSQL only.
postgres_only = pytest.mark.parametrize("database", ["postgresql"], indirect=True)
