"""Real daemons sharing one PostgreSQL database, as supervisors on several hosts would (SPEC §16),
each in a directory of its own (config, socket, logs): the fixture `on_postgres`, and the CLI
run against one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from daemon import cli
from tests.daemon_harness import Daemon
from tests.postgres_cluster import url  # noqa: F401 (url: a database of each test's own)

FAULT_EXECUTORS = {"GATED": "tests.fault_executors:Gated"}


@pytest.fixture
def on_postgres(url: str, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Makes real daemons (not yet started) whose database is this test's PostgreSQL database,
    named as their directory unless told (`supervisor`); kills any still running at the end."""
    made: list[Daemon] = []

    def make(label: str = "alpha", *, supervisor: str | None = None, executors: dict[str, str] | None = None,
             **options: Any) -> Daemon:
        daemon = Daemon(tmp_path / label, database=url, name=supervisor or label,
                        executors=FAULT_EXECUTORS if executors is None else executors, **options)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.kill_if_running()


def fredica(d: Daemon, *args: str) -> Result:
    """The CLI, as a user on `d`'s host runs it."""
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], catch_exceptions=False)


def ok(d: Daemon, *args: str) -> str:
    """The CLI's output, which must have succeeded."""
    result = fredica(d, *args)
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout


def hang(tmp_path: Path, name: str) -> dict[str, Any]:
    """The payload of a HANG task that says it runs by making `name`.ready."""
    return {"ready_file": str(tmp_path / f"{name}.ready")}
