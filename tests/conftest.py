"""Shared test helpers: a real SQLite file per test, and `wait_for` instead of sleeps."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

import pytest

from daemon.store import db

if TYPE_CHECKING:
    from tests.daemon_harness import Daemon

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
