"""The migrations build exactly the schema `daemon/store/schema.py` describes, on each backend."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from daemon.store import db, migrations, schema
from daemon.store.postgres import migrations as postgres_migrations
from tests.postgres_cluster import Cluster


def test_both_backends_have_the_same_migration_versions() -> None:
    assert [m.version for m in postgres_migrations.MIGRATIONS] == [m.version for m in migrations.MIGRATIONS]
    assert postgres_migrations.LATEST == migrations.LATEST == schema.SCHEMA_VERSION


# --- SQLite -------------------------------------------------------------------------------------


def _sqlite_structure(conn: sqlite3.Connection) -> dict[str, Any]:
    """Tables (columns, keys, rowid, autoincrement) and indexes (columns, order, uniqueness, WHERE)
    as SQLite itself reports them, so that the text a table was created with does not matter."""
    described: dict[str, Any] = {}
    for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ):
        described[f"table {name}"] = {
            "columns": [tuple(r) for r in conn.execute(f"PRAGMA table_xinfo({name})")],
            "foreign keys": sorted(tuple(r)[2:5] for r in conn.execute(f"PRAGMA foreign_key_list({name})")),
            "without rowid": "WITHOUT ROWID" in sql.upper(),
            "autoincrement": "AUTOINCREMENT" in sql.upper(),
        }
        for index in conn.execute(f"PRAGMA index_list({name})").fetchall():
            # Automatic indexes (keys, UNIQUE) have no text, nor a row of their own in a WITHOUT ROWID table.
            found = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index["name"],)).fetchone()
            index_sql = found[0] if found else None
            where = " ".join(index_sql.split(" WHERE ", 1)[1].split()) if index_sql and " WHERE " in index_sql else None
            described[f"index {index['name']}"] = {
                "table": name,
                "unique": index["unique"],
                "origin": index["origin"],
                "columns": [tuple(r)[2:5] for r in conn.execute(f"PRAGMA index_xinfo({index['name']})") if r["key"]],
                "where": where,
            }
    return described


def test_sqlite_migrations_build_the_described_schema(tmp_path: Path) -> None:
    migrated = db.open_database(tmp_path / "migrated.db")
    described = sqlite3.connect(tmp_path / "described.db")
    described.row_factory = sqlite3.Row
    for statement in schema.SQLITE:
        described.execute(statement)

    assert migrations.current_version(migrated) == schema.SCHEMA_VERSION
    assert _sqlite_structure(migrated) == _sqlite_structure(described)


# --- PostgreSQL ---------------------------------------------------------------------------------


def _postgres_structure(url: str) -> dict[str, Any]:
    """Columns, constraints, indexes and collations as the catalogue reports them (PostgreSQL
    prints each definition in its own canonical form, so spelling does not matter)."""
    import psycopg

    with psycopg.connect(url) as conn:
        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.execute(sql)]

        return {
            "columns": rows(
                """SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default,
                          is_identity, identity_generation, collation_name
                   FROM information_schema.columns WHERE table_schema = 'public'
                   ORDER BY table_name, ordinal_position"""
            ),
            "constraints": rows(
                """SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
                   FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"""
            ),
            "indexes": rows("SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1, 2"),
            "collations": rows(
                """SELECT collname, collprovider, colliculocale, collisdeterministic FROM pg_collation
                   WHERE collnamespace = 'public'::regnamespace ORDER BY 1"""
            ),
        }


def test_postgres_migrations_build_the_described_schema(postgres_cluster: Cluster) -> None:
    import psycopg

    migrated = postgres_cluster.clone("schema_migrated", template="template0")
    described = postgres_cluster.clone("schema_described", template="template0")
    db.open_database(migrated).close()
    with psycopg.connect(described, autocommit=True) as conn:
        for statement in schema.POSTGRESQL:
            conn.execute(statement)

    with db.open_database(migrated) as conn:  # a second open finds nothing to do
        assert postgres_migrations.current_version(conn) == schema.SCHEMA_VERSION
    structure = _postgres_structure(migrated)
    assert structure == _postgres_structure(described)
    assert len(structure["indexes"]) >= 15 and structure["collations"]  # the comparison saw the schema
    postgres_cluster.drop(migrated)
    postgres_cluster.drop(described)


def test_postgres_migration_refuses_a_newer_schema(postgres_cluster: Cluster) -> None:
    import pytest

    from daemon.errors import MigrationError

    url = postgres_cluster.clone("schema_newer")
    with db.open_database(url) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (schema.SCHEMA_VERSION + 1,))
    with pytest.raises(MigrationError, match="newer than this fredica-worker understands"):
        db.open_database(url)
    postgres_cluster.drop(url)
