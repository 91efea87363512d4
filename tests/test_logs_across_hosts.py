"""`fredica logs ID` on a shared PostgreSQL queue (SPEC §16): task logs stay on the host that ran
the task, and asked elsewhere the CLI names that host, in one line, through the daemon, with the
daemon down, with a daemon that does not answer, and over the HTTP API. Two real daemons, alpha
and beta, on one database, each with its own log directory; on SQLite nothing changes."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from click.testing import CliRunner

from daemon import cli
from daemon.store import db, supervisors, tasks
from daemon.submission import parse_spec
from tests.daemon_harness import Daemon
from tests.postgres_daemons import fredica, ok, on_postgres, url  # noqa: F401 (fixtures)
from tests.web_harness import free_port


def host_of(url: str, name: str) -> str:
    conn = db.connect_read_only(url)
    try:
        held = supervisors.find(conn, name)
        assert held is not None
        return held.host
    finally:
        conn.close()


def elsewhere(task_id: str, where: str) -> str:
    return (f"error: task {task_id} ran under supervisor alpha {where}, which keeps its log: "
            f"run `fredica logs {task_id}` on that host\n")


@pytest.fixture
def ran_by_alpha(on_postgres: Callable[..., Daemon]) -> tuple[Daemon, str]:
    """alpha, which ran a PRINT task to its end (alone: beta starts after)."""
    alpha = on_postgres("alpha").start()
    task_id = ok(alpha, "submit", "PRINT").strip()
    alpha.wait_task(task_id, "completed")
    return alpha, task_id


def test_a_task_another_supervisor_ran_names_its_host(
    ran_by_alpha: tuple[Daemon, str], on_postgres: Callable[..., Daemon], url: str
) -> None:
    alpha, task_id = ran_by_alpha
    beta = on_postgres("beta").start()
    said = elsewhere(task_id, f"on host {host_of(url, 'alpha')}")
    for args in ((task_id,), ("-f", task_id), ("--json", task_id), (task_id[:8], "-n", "5")):
        result = fredica(beta, "logs", *args)
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", said), args
    # On the host that ran it, as always.
    assert "hello on stdout" in ok(alpha, "logs", task_id)
    # A task never started has no log anywhere yet: as before, on any host.
    held = ok(beta, "submit", "PRINT", "--hold").strip()
    never = fredica(beta, "logs", held)
    assert never.exit_code == 0 and never.stderr.startswith("no log yet at ")
    # With beta's daemon down, its database says the same, read-only.
    beta.stop()
    down = fredica(beta, "logs", task_id)
    assert (down.exit_code, down.stdout, down.stderr) == (1, "", said)


def test_a_supervisor_that_is_gone_is_named_without_a_host(
    ran_by_alpha: tuple[Daemon, str], on_postgres: Callable[..., Daemon]
) -> None:
    alpha, task_id = ran_by_alpha
    alpha.stop()  # a graceful stop gives its lease up: no row says where alpha ran
    beta = on_postgres("beta").start()
    said = elsewhere(task_id, "(its host is not known any more: it holds no lease now)")
    for args in ((task_id,), ("-f", task_id)):
        result = fredica(beta, "logs", *args)
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", said), args
    beta.stop()
    assert fredica(beta, "logs", task_id).stderr == said


@pytest.fixture
def silent_socket(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Listens at a path and closes each connection unanswered: a daemon that does not answer."""
    servers: list[socket.socket] = []

    def listen(path: Path) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen()
        servers.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=serve, daemon=True).start()

    yield listen
    for server in servers:
        server.close()


def test_a_daemon_that_does_not_answer_still_names_the_host(
    ran_by_alpha: tuple[Daemon, str], on_postgres: Callable[..., Daemon], url: str,
    silent_socket: Callable[[Path], None],
) -> None:
    # The CLI then reads the log files itself; on a shared queue the task's row comes first.
    _, task_id = ran_by_alpha
    beta = on_postgres("beta")
    beta.socket.parent.mkdir(parents=True, exist_ok=True)
    silent_socket(beta.socket)
    result = fredica(beta, "logs", task_id)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == elsewhere(task_id, f"on host {host_of(url, 'alpha')}")


def http_get(port: int, token: str, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_http_api_refuses_it_naming_the_host(
    ran_by_alpha: tuple[Daemon, str], on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    _, task_id = ran_by_alpha
    port, token_file = free_port(), tmp_path / "beta-token"
    beta = on_postgres("beta", extra_toml=f'[http]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{token_file}"').start()
    message = elsewhere(task_id, f"on host {host_of(url, 'alpha')}")[len("error: "):-1]
    token = token_file.read_text().strip()
    for path in (f"/api/v1/log_path?id={task_id}", f"/api/v1/page/log?id={task_id[:8]}"):
        status, body = http_get(port, token, path)
        assert (status, body["ok"], body["error"]["kind"], body["error"]["message"]) == (
            404, False, "LogElsewhere", message), path
    beta.stop()


def test_on_sqlite_a_task_named_by_another_supervisor_is_read_here(tmp_path: Path) -> None:
    # One daemon per file: whatever name its row keeps (the config's name changed since), the
    # log is in this host's log directory.
    database, log_dir = tmp_path / "fredica.db", tmp_path / "logs"
    conn = db.open_database(database)
    [task] = tasks.submit(conn, [parse_spec({"type": "ECHO"})], now=1.0).tasks
    conn.execute("UPDATE task SET supervisor = 'old-name', status = 'completed' WHERE id = ?", (task.id,))
    conn.close()
    (log_dir / "tasks").mkdir(parents=True)
    (log_dir / "tasks" / f"{task.id}.log").write_text("ran here\n")
    config = tmp_path / "fredica.toml"
    config.write_text(f'[daemon]\ndatabase = "{database}"\nsocket = "{tmp_path}/gone.sock"\n'
                      f'log_dir = "{log_dir}"\nname = "new-name"\n')
    result = CliRunner().invoke(cli.main, ["--config", str(config), "logs", task.id])
    assert (result.exit_code, result.stdout) == (0, "ran here\n"), result.output
