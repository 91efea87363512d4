"""The Huey instance the peers benchmark runs: `huey_consumer benchmarks.peers.huey_app.huey`.

The database file comes from $PEER_HUEY_DB and the durability from $PEER_HUEY_SYNC:
- "normal": WAL with `synchronous=NORMAL`, the durability fredica-worker uses by default
  (SqliteHuey has no option for it: `fsync=True` gives FULL and `fsync=False` OFF, hence the
  small storage subclass below);
- "default": SqliteHuey's defaults (WAL, SQLite's default `synchronous`, FULL on this build: an
  fsync per commit, i.e. per enqueue and per dequeue).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from huey import SqliteHuey
from huey.api import TaskWrapper
from huey.storage import SqliteStorage

from benchmarks.peers import peer_tasks

DB_ENV = "PEER_HUEY_DB"
SYNC_ENV = "PEER_HUEY_SYNC"


class NormalSyncSqliteStorage(SqliteStorage):
    """SqliteStorage with `PRAGMA synchronous=NORMAL` on every connection."""

    def _create_connection(self):  # type: ignore[no-untyped-def]
        conn = super()._create_connection()
        conn.execute("pragma synchronous=NORMAL")
        return conn


class NormalSyncSqliteHuey(SqliteHuey):
    storage_class = NormalSyncSqliteStorage


class PeerHuey(NamedTuple):
    app: SqliteHuey
    noop_marked: TaskWrapper
    stamp_marked: TaskWrapper


def make_huey(filename: str, sync: str) -> PeerHuey:
    """The consumer's Huey, or the client's: same name, file and durability, same task names."""
    if sync not in ("normal", "default"):
        raise ValueError(f"{SYNC_ENV} must be normal or default, not {sync!r}")
    cls = NormalSyncSqliteHuey if sync == "normal" else SqliteHuey
    app = cls("peers", filename=filename)
    return PeerHuey(
        app,
        app.task(name="noop_marked")(peer_tasks.noop_marked),
        app.task(name="stamp_marked")(peer_tasks.stamp_marked),
    )


_consumer_huey: SqliteHuey | None = None


def __getattr__(name: str) -> SqliteHuey:
    """`huey`, what `huey_consumer benchmarks.peers.huey_app.huey` loads, built from the environment
    on first access (so that the client, which calls make_huey itself, never opens a stray file)."""
    global _consumer_huey
    if name != "huey":
        raise AttributeError(name)
    if _consumer_huey is None:
        _consumer_huey = make_huey(os.environ[DB_ENV], os.environ.get(SYNC_ENV, "normal")).app
    return _consumer_huey
