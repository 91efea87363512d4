"""The test cluster on a machine without PostgreSQL: skipped with a message, failed in CI."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from tests import postgres_cluster


@pytest.mark.parametrize("ci, outcome", [("", Skipped), ("true", Failed)])
def test_without_server_binaries(monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(postgres_cluster, "binaries", lambda: None)  # a machine without them
    with pytest.raises(outcome, match="apt-get install postgresql"):
        with postgres_cluster.running_cluster(lambda url: None):
            pass


def test_the_cluster_serves_its_template_and_clones(postgres_cluster: postgres_cluster.Cluster) -> None:
    import psycopg

    url = postgres_cluster.clone("cluster_check")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone() is not None
        settings = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('fsync', 'synchronous_commit', 'full_page_writes', 'listen_addresses')"
        ).fetchall())
    assert settings == {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "listen_addresses": ""}
    postgres_cluster.drop(url)
