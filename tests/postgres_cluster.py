"""A throwaway PostgreSQL cluster for the tests: initdb + pg_ctl in a temporary directory.

One cluster per pytest(-xdist) worker process, started the first time a test asks for PostgreSQL
and stopped at the end of the session. One per worker rather than one shared behind a lock: a
shared cluster needs a cross-process reference count to know who may stop it (and a worker killed
mid-run leaves it running), while a cluster of its own costs a worker ~1 s of initdb at its first
PostgreSQL test, in parallel with the others' and only in sessions that run such tests.

Tuned for speed, not durability (`fsync`, `synchronous_commit` and `full_page_writes` off): a
test never survives a power cut. It listens on a Unix socket in its own directory only, so that
two sessions on one machine never meet on a port.

Without PostgreSQL's server binaries (or psycopg) the tests that need it are skipped with a
message saying what to install; under `CI=true` they fail instead, so that CI never passes by
running none of them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

import pytest

SERVER_USER = "postgres"  # initdb refuses to run as root: as root, the cluster runs as this user
TEMPLATE = "fredica_template"
SETTINGS = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "50",
    "shared_buffers": "32MB",
}


def binaries() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(candidates[-1]).parent if candidates else None


def unavailable(reason: str) -> None:
    """Skip the calling test with `reason`, or fail it in CI, where every test must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


class Cluster:
    """A running cluster owned by this process; `url(name)` names one of its databases."""

    def __init__(self, bin_dir: Path, root: Path, settings: dict[str, str] | None = None) -> None:
        """`settings`: the server's (`-c key=value`), SETTINGS unless told; benchmarks/postgres
        starts one with real durability."""
        self.bin_dir = bin_dir
        self.root = root
        self.settings = SETTINGS if settings is None else settings
        self.data = root / "data"
        self.socket_dir = root
        self._as_server_user: list[str] = []
        self._databases = 0

    def _run(self, tool: str, *args: str) -> None:
        command = [*self._as_server_user, str(self.bin_dir / tool), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        if os.geteuid() == 0:
            server = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, server.pw_uid, server.pw_gid)
            self._as_server_user = ["runuser", "-u", SERVER_USER, "--"]
        # --no-sync: nothing here must survive a crash; trust: only this directory's socket reaches it.
        self._run("initdb", "-D", str(self.data), "-U", SERVER_USER, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions")
        self.start_server()

    def _options(self) -> str:
        options = " ".join(f"-c {key}={value}" for key, value in self.settings.items())
        return options + f" -c unix_socket_directories='{self.socket_dir}'"

    def start_server(self) -> None:
        """Start the server of the initialized cluster (again), waiting until it takes connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-o", self._options(), "start")

    def stop_server(self) -> None:
        """Stop the server, ending every session at once (`fast`: clients see their connection
        closed, as in a restart); the data stays for `start_server`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Restart the server (`pg_ctl restart`): every client's session is ended, and connections
        are taken again once it is back."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-m", "fast", "-w",
                  "-t", "60", "-o", self._options(), "restart")

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql:///{database}?host={quote(str(self.socket_dir))}&user={SERVER_USER}"

    def admin(self, *statements: str) -> None:
        """Run statements outside a transaction (CREATE/DROP DATABASE refuse to run in one)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def make_template(self, prepare: Callable[[str], None]) -> None:
        """Create the template database and let `prepare(url)` build it (migrate the schema)."""
        self.admin(f"CREATE DATABASE {TEMPLATE}")
        prepare(self.url(TEMPLATE))
        self.admin(f"ALTER DATABASE {TEMPLATE} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")

    def clone(self, label: str, template: str = TEMPLATE) -> str:
        """A new database cloned from the migrated template (`template0`: an empty one); its URL.
        `label` only helps reading the server's log."""
        self._databases += 1
        name = "t%d_%s" % (self._databases, "".join(c if c.isalnum() else "_" for c in label.lower())[:40])
        # FILE_COPY: copying the template's few files beats WAL-logging every page of it.
        self.admin(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
        return self.url(name)

    def drop(self, url: str) -> None:
        name = url.split("?")[0].rsplit("/", 1)[1]
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def empty(url: str) -> None:
    """Delete every row of a migrated database (its schema and version stay) and restart its
    identity counters: a test module's database made new for its next test. DELETE, not
    TRUNCATE: on tables of a few rows it takes ~2 ms where TRUNCATE's new files take ~90."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        # Referencing tables first, so that no foreign key is in the way.
        tables = [row[0] for row in conn.execute(
            """SELECT c.relname FROM pg_class AS c
               WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND c.relname != 'schema_version'
               ORDER BY (SELECT count(*) FROM pg_constraint AS f WHERE f.contype = 'f' AND f.conrelid = c.oid) DESC"""
        )]
        sequences = [row[0] for row in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'S'"
        )]
        with conn.transaction():
            for table in tables:
                conn.execute(f"DELETE FROM {table}")
            for sequence in sequences:
                conn.execute(f"ALTER SEQUENCE {sequence} RESTART")


@contextlib.contextmanager
def running_cluster(prepare: Callable[[str], None]) -> Iterator[Cluster]:
    """Start a cluster with a template database built by `prepare`, yield it, stop it."""
    bin_dir = binaries()
    if bin_dir is None:
        unavailable("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql: "
                    "install PostgreSQL (Debian: apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed: pip install 'psycopg[binary,pool]'")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            unavailable(f"running as root, and there is no {SERVER_USER!r} user to run the server as "
                        "(initdb refuses root; Debian's postgresql package creates that user)")
    # Not under pytest's tmp dir: that one is private to this user, and the server user must enter
    # it; and a Unix socket path must stay under ~100 bytes.
    cluster = Cluster(bin_dir, Path(tempfile.mkdtemp(prefix="fredica-pg-")))
    try:
        cluster.start()
        cluster.make_template(prepare)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def url(postgres_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of the test's own, migrated (cloned from the template), dropped after it: for a
    test of real daemons sharing one PostgreSQL queue (import it: `from tests.postgres_cluster import url`)."""
    made = postgres_cluster.clone(request.node.name)
    yield made
    postgres_cluster.drop(made)


class HeldConnect:
    """A connect, in place of `real`, that waits for `answer` before it goes on: a server's host
    that does not answer, for as long as the test wants. A caller that waited for it would wait
    until the test gives up on it (30 s), and then fail with `AssertionError`."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.answer = threading.Event()
        self.calls = 0
        self.made: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        assert self.answer.wait(30), "the caller waited for a connect that did not answer"
        self.made.append(self.real(*args, **kwargs))
        return self.made[-1]
