"""Opening a PostgreSQL database that cannot be used: one line that says why (SPEC §13, §16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import DatabaseUnusable
from daemon.store import db
from tests.postgres_cluster import Cluster


def test_an_unreachable_server_is_one_line_without_the_password(tmp_path: Path) -> None:
    url = f"postgresql://fredica:s3cret@/queue?host={tmp_path}&connect_timeout=2"  # no server there
    with pytest.raises(DatabaseUnusable) as caught:
        db.open_database(url)
    message = str(caught.value)
    assert message.startswith("cannot connect to the database postgresql://fredica:***@/queue")
    assert "s3cret" not in message and "\n" not in message
    assert str(tmp_path) in message  # libpq's reason names the socket it tried


def test_a_missing_database_is_one_line(postgres_cluster: Cluster) -> None:
    with pytest.raises(DatabaseUnusable, match=r'^cannot connect to the database .*"no_such_queue" does not exist'):
        db.open_database(postgres_cluster.url("no_such_queue"))
