"""The benchmark's own throwaway PostgreSQL server: tests/postgres_cluster.py's Cluster, started
with real durability unless told otherwise, one database per measured instance.

Unlike the tests' cluster (fsync, synchronous_commit and full_page_writes off, for speed), this
one keeps PostgreSQL's defaults for durability, `fsync = on` and `synchronous_commit = on`: a
commit is on disk when the client hears of it, as in production. `--fsync-off` turns all three
off, as the tests run. Both systems of a run share the server, so they see the same settings.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.postgres_cluster import SETTINGS, Cluster, binaries

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
# Two fredica supervisors (a few connections each, plus one per client), a procrastinate worker's
# pool and the benchmark's own readers: well above the tests' 50.
CONNECTIONS = "200"


class Server:
    """A running cluster of this process's; `database()` makes a fresh, empty database on it."""

    def __init__(self, cluster: Cluster, durability: dict[str, str]) -> None:
        self.cluster = cluster
        self.durability = durability
        self._made = 0

    def url(self, name: str = "postgres") -> str:
        return self.cluster.url(name)

    @contextlib.contextmanager
    def database(self, label: str) -> Iterator[str]:
        """A new empty database (each system migrates or builds its schema itself), dropped after."""
        self._made += 1
        name = f"b{self._made}_{label}"
        self.cluster.admin(f"CREATE DATABASE {name} TEMPLATE template0")
        try:
            yield self.url(name)
        finally:
            self.cluster.drop(self.url(name))

    def describe(self) -> str:
        return ", ".join(f"{key} = {value}" for key, value in self.durability.items())


@contextlib.contextmanager
def running(*, fsync: bool = True) -> Iterator[Server]:
    """Start a server (initdb + pg_ctl in a temp dir, a Unix socket only), yield it, stop it."""
    bin_dir = binaries()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl): install PostgreSQL (Debian: apt-get install postgresql)")
    durability = DURABLE if fsync else FAST
    settings = {**SETTINGS, **durability, "max_connections": CONNECTIONS}
    # Not under a private tmp dir: the server user must enter it; a socket path stays short.
    cluster = Cluster(bin_dir, Path(tempfile.mkdtemp(prefix="fredica-pgbench-")), settings=settings)
    try:
        cluster.start()
        yield Server(cluster, durability)
    finally:
        cluster.stop()
