"""Shared test helpers: a real SQLite file per test (or a real PostgreSQL database, for the store's
conformance suite), and `wait_for` instead of sleeps."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import pytest

from daemon.models import Task, TaskStatus
from daemon.store import db

if TYPE_CHECKING:
    from tests.daemon_harness import Daemon
    from tests.postgres_cluster import Cluster

# The store's backends, for the tests that run against each (`store`, `database`).
BACKENDS = ("sqlite", "postgresql")

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.005) -> T:
    """Poll `condition` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "fredica.db"


@pytest.fixture
def conn(db_path: Path) -> Iterator[sqlite3.Connection]:
    connection = db.open_database(db_path)
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator["Cluster"]:
    """This worker's throwaway PostgreSQL cluster, with a migrated template database (started at
    its first use; skipped, or failed under CI=true, without PostgreSQL: tests/postgres_cluster.py)."""
    from tests.postgres_cluster import running_cluster

    def migrate(url: str) -> None:
        db.open_database(url).close()

    with running_cluster(migrate) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def postgres_module_database(postgres_cluster: "Cluster", request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of this test module's own database, cloned from the migrated template."""
    url = postgres_cluster.clone(request.module.__name__.rsplit(".", 1)[-1])
    yield url
    postgres_cluster.drop(url)


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, db_path: Path) -> str | Path:
    """What `database` names in the config, once per backend: a SQLite file of this test's own,
    or the module's PostgreSQL database emptied for this test."""
    if request.param == "sqlite":
        return db_path
    from tests.postgres_cluster import empty

    url: str = request.getfixturevalue("postgres_module_database")
    empty(url)
    return url


@pytest.fixture
def store(database: str | Path) -> Iterator[sqlite3.Connection]:
    """An open, migrated store connection, once per backend (the conformance suite's `conn`)."""
    connection = db.open_database(database)
    yield connection
    connection.close()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., "Daemon"]]:
    """Makes real daemons (not yet started) under tmp_path; kills any still running at the end."""
    from tests.daemon_harness import Daemon

    made: list[Daemon] = []

    def make(name: str = "d", **options: object) -> Daemon:
        daemon = Daemon(tmp_path / name, **options)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.kill_if_running()


def make_task(task_type: str, payload: dict[str, Any] | None = None, **fields: Any) -> Task:
    """A task snapshot as the supervisor hands it to an executor, for tests without a database."""
    values: dict[str, Any] = dict(
        seq=1, id=f"task-{task_type.lower()}", type=task_type, workflow_run_id="run-1",
        material_id=None, status=TaskStatus.RUNNING, priority=0, depends_on=(),
        payload=payload or {}, result=None, error=None, error_type=None, idempotency_key=None,
        retry_count=0, max_retries=0, progress=0, status_text=None, is_paused=False,
        is_pausable=False, timeout=None, not_before=0.0, executor_pid=None,
        executor_started_at=None, created_at=0.0, claimed_at=None, started_at=None,
        completed_at=None, heartbeat_at=None,
    )
    values.update(fields)
    return Task(**values)
