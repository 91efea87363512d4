"""Read commands with the daemon down (SPEC §14): answered from the database, read-only, as the
daemon answers them, with `daemon not running` on stderr; nothing written, no file created."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from typing import Iterator

import pytest
from click.testing import Result

from daemon import cli
from daemon.store import migrations
from tests.daemon_harness import Daemon
from tests.test_show_messages import TEMPLATE, fredica

NOTE = "daemon not running"


def files(d: Daemon) -> dict[str, tuple[bytes, int]]:
    """Every file beside the database (the database's own included): its bytes and mtime."""
    folder = d.database.parent
    return {name: ((folder / name).read_bytes(), (folder / name).stat().st_mtime_ns) for name in os.listdir(folder)}


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables show ages: the same instant on both sides of the stop, so that they compare whole.
    monkeypatch.setattr(cli.time, "time", lambda: 2_000_000_000.0)


@pytest.fixture
def stopped(daemons, frozen_clock) -> Iterator[tuple[Daemon, dict[tuple[str, ...], Result], dict[str, str]]]:
    """A daemon that ran tasks (one completed, one failed, a template run waiting in a paused
    queue), the read commands' results while it ran, and then stopped with SIGTERM."""
    d: Daemon = daemons(extra_toml=TEMPLATE)
    d.start()
    done = d.submit("ECHO", payload={"x": 1})
    failed = d.submit("RAISE")
    d.wait_task(done, "completed")
    d.wait_task(failed, "failed")
    assert fredica(d, "queue", "pause", "default").exit_code == 0
    run_id = d.data("run", template="pipe", params={"x": "1"})["run_id"]
    ids = {"done": done, "failed": failed, "run": run_id}
    reads = [
        ("ls",), ("ls", "--json"), ("ls", "--status", "waiting"), ("ls", "--run", run_id[:6]), ("runs",),
        ("runs", "--json"), ("show", done[:6]), ("show", failed, "--json"), ("show", run_id[:8]),
        ("restarts",), ("restarts", "--all", "--json"), ("logs", done[:6]), ("types",), ("templates",),
        ("queues",),
    ]
    before = {args: fredica(d, *args) for args in reads}
    assert all(result.exit_code == 0 for result in before.values()), before
    assert d.stop(signal.SIGTERM) == 0
    yield d, before, ids


def test_read_commands_answer_as_before_from_the_database(stopped) -> None:
    d, before, ids = stopped
    untouched = files(d)
    for args, up in before.items():
        down = fredica(d, *args)
        assert (down.exit_code, down.stdout) == (0, up.stdout), args
        # The types and templates are the config's: nothing was read from the database for them.
        note = f"{NOTE}\n" if args in (("types",), ("templates",)) else f"{NOTE}: read from {d.database}\n"
        assert down.stderr == note + up.stderr, args
    # Writes, and what follows the daemon's progress, are not answered from a database at rest.
    for args in (["cancel", ids["run"]], ["submit", "ECHO"], ["queue", "resume", "default"], ["watch"],
                 ["watch", ids["done"]], ["wait", ids["done"]]):
        result = fredica(d, *args)
        assert result.exit_code == 3, (args, result.output)
        assert result.stderr.startswith(f"error: no daemon socket at {d.socket}") and result.stderr.count("\n") == 1
    assert files(d) == untouched  # not a byte, not an mtime; and no -wal or -shm left behind


def test_status_says_the_daemon_is_not_running(stopped) -> None:
    d, _, ids = stopped
    untouched = files(d)
    result = fredica(d, "status", "--json")
    assert result.exit_code == 3 and result.stderr.startswith(NOTE)  # what a script asks status for
    status = json.loads(result.stdout)
    assert status["pid"] is None and status["uptime"] is None and status["busy_workers"] == 0
    assert status["counts"] == {"pending": 2, "claimed": 0, "running": 0, "completed": 1, "failed": 1, "cancelled": 0,
                                "held": 0}
    assert status["queues"] == {"default": {"workers": 2, "busy": 0, "waiting": 2, "held": 0, "paused": True,
                                             "prefetch": 0}}
    text = fredica(d, "status").stdout.splitlines()
    assert text[:2] == ["daemon    not running", "workers   none running (2 configured)"]
    assert not any(line.startswith(("pid", "uptime")) for line in text)
    assert files(d) == untouched


def test_the_commits_of_a_killed_daemon_are_read_from_its_write_ahead_log(daemons, frozen_clock) -> None:
    d: Daemon = daemons()
    d.start()
    task_id = d.submit("ECHO", payload={"after": "kill"})
    d.wait_task(task_id, "completed")
    shown = fredica(d, "show", task_id, "--json").stdout
    d.kill9()
    assert (d.database.parent / "fredica.db-wal").exists()  # what was committed may be there alone
    untouched = files(d)
    result = fredica(d, "show", task_id[:8], "--json")
    assert (result.exit_code, result.stdout) == (0, shown) and result.stderr.startswith(NOTE)
    # The database and its log are as the daemon left them. The -shm file is SQLite's index of the
    # log, which a reader rebuilds after a crash: it holds no data, and no reader can avoid that.
    after = files(d)
    assert sorted(after) == sorted(untouched)
    assert {name: after[name] for name in after if not name.endswith("-shm")} == {
        name: untouched[name] for name in untouched if not name.endswith("-shm")}


def test_no_database_is_one_line_and_creates_nothing(daemons) -> None:
    d: Daemon = daemons()  # configured, never started
    for args in (["ls"], ["show", "abcd1234"], ["status", "--json"], ["runs"], ["restarts"]):
        result = fredica(d, *args)
        assert result.exit_code == 3 and result.stdout == ""
        assert result.stderr == (f"error: no daemon socket at {d.socket}: the daemon is not running (start it with "
                                 f"`fredica daemon`); there is no database at {d.database} to read either\n")
    assert sorted(os.listdir(d.root)) == ["config.toml"]


def test_a_database_of_an_older_schema_is_refused_in_one_line(daemons) -> None:
    d: Daemon = daemons()
    d.database.parent.mkdir(parents=True)
    with sqlite3.connect(d.database, isolation_level=None) as conn:
        migrations.migrate(conn, target=1)
    untouched = files(d)
    result = fredica(d, "ls")
    assert result.exit_code == 1
    assert result.stderr == (f"error: the database {d.database} has schema version 1, this fredica reads version "
                             f"{migrations.LATEST}: start the daemon once (it migrates the database), then ask again\n")
    assert files(d) == untouched


def test_the_installed_command_reads_with_the_daemon_down(stopped) -> None:
    # As a whole process: the import path of the fallback, and its exit status.
    d, before, ids = stopped
    result = subprocess.run([sys.executable, "-m", "daemon", "ls", "--json", "--config", str(d.config)],
                            capture_output=True, text=True, timeout=30, env=d.env())
    assert result.returncode == 0 and result.stdout == before[("ls", "--json")].stdout
    assert result.stderr == f"{NOTE}: read from {d.database}\n"
