"""Shared test helpers: a real SQLite file per test, and `wait_for` instead of sleeps."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

from daemon.store import db

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
