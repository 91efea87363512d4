"""A real daemon with its HTTP server on (SPEC §17), and a small keep-alive client of its API;
the fixtures that give a test's daemon its database once per backend (SPEC §16: §17 holds
unchanged on PostgreSQL)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import BACKENDS
from tests.daemon_harness import Daemon

TEMPLATE_TOML = """
[templates.count_then_echo]
description = "Count, then echo"
params = ["n"]

[templates.count_then_echo.tasks.count]
type = "COUNT"
payload = { n = "{n}", count_file = "COUNT_FILE", state_file = "STATE_FILE" }

[templates.count_then_echo.tasks.echo]
type = "ECHO"
depends_on = ["count"]
"""


def free_port() -> int:
    """A port nobody listens on now (the daemon binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

# Every timer of a daemon's loop far away: on PostgreSQL it then wakes only for the others' submits
# and ends (NOTIFY), so its page can learn of the others' progress only from the database.
QUIET_LOOP = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}


class Reply:
    """One HTTP answer: status, headers, and the body (parsed as JSON when it is)."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = {name.lower(): value for name, value in response.getheaders()}
        self.body = response.read()
        self.json: Any = json.loads(self.body) if self.headers.get("content-type", "").startswith(
            "application/json") else None

    @property
    def data(self) -> Any:
        assert self.status == 200 and self.json["ok"], (self.status, self.body[:500])
        return self.json["data"]

    @property
    def kind(self) -> str:
        return self.json["error"]["kind"]


class HttpDaemon(Daemon):
    """A daemon serving HTTP on a free port of 127.0.0.1, with a template of two tasks."""

    def __init__(self, root: Path, *, extra_toml: str = "", database: str | None = None, **options: Any) -> None:
        """`database`: a PostgreSQL URL; None: a SQLite file of the daemon's own."""
        self.port = free_port()
        self.count_file, self.state_file = root / "count", root / "state-file"
        templates = TEMPLATE_TOML.replace("COUNT_FILE", str(self.count_file)).replace("STATE_FILE", str(self.state_file))
        http = f'[http]\nlisten = "127.0.0.1:{self.port}"\n'
        if database is not None:
            # A URL's default token file is the user's state directory (tested in
            # test_daemon_postgres.py): a test daemon keeps its own under its root instead.
            http += f"token_file = {json.dumps(str(root / 'state' / 'http-token'))}\n"
            options["database"] = database
        super().__init__(root, extra_toml=f"{http}{templates}\n{extra_toml}", **options)
        self.token_file = root / "state" / "http-token"
        self.url = database
        self._http: http.client.HTTPConnection | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            token: str | None = "") -> Reply:
        """One request on the kept-alive connection; `token` "" is the daemon's, None sends none."""
        given = dict(headers or {})
        if token is not None:
            given["Authorization"] = f"Bearer {token or self.token}"
        for attempt in range(2):
            if self._http is None:
                self._http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self._http.request(method, path, body=body, headers=given)
                reply = Reply(self._http.getresponse())
            except (ConnectionError, http.client.HTTPException):
                self._http.close()
                self._http = None
                if attempt:
                    raise
                continue
            if reply.headers.get("connection") == "close":
                self._http.close()
                self._http = None
            return reply
        raise AssertionError("unreachable")

    def post(self, op: str, **args: Any) -> Reply:
        return self.raw("POST", f"/api/v1/{op}", json.dumps(args).encode(), {"Content-Type": "application/json"})

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.raw("GET", path, **kwargs)

    def api(self, op: str, **args: Any) -> Any:
        return self.post(op, **args).data

    def close_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def sse_events(d: HttpDaemon, path: str, *, within: float | None = 120.0) -> Iterator[tuple[str, Any]]:
    """The (event, data) pairs of a server-sent event stream of `d`, as they come. `within`:
    seconds after which reading on fails the test (AssertionError), keepalives or not: the feed's
    keepalive comments never end the read of a stream whose awaited event was lost."""
    deadline = None if within is None else time.monotonic() + within
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=20)
    conn.request("GET", path, headers={"Authorization": f"Bearer {d.token}"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    event = None
    try:
        while True:
            line = response.readline()
            if not line:
                return
            assert deadline is None or time.monotonic() < deadline, f"{path}: nothing awaited came within {within} s"
            text = line.decode().rstrip("\n")
            if text.startswith("event: "):
                event = text[len("event: "):]
            elif text.startswith("data: "):
                yield event, json.loads(text[len("data: "):])
    finally:
        conn.close()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a /metrics text, found by its name and labels."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if match and match.group(1) == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            if all(found.get(key) == value for key, value in labels.items()):
                return float(match.group(3))
    raise AssertionError(f"no {name} {labels} in /metrics")


def _database(request: pytest.FixtureRequest, postgres: str) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
    else:
        yield request.getfixturevalue(postgres)


@pytest.fixture(scope="module", params=BACKENDS)
def module_database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The `database` of a module's long-lived HttpDaemon, once per backend: None (its own SQLite
    file) or the module's PostgreSQL database (skipped without PostgreSQL, failed under CI=true)."""
    yield from _database(request, "postgres_module_database")


@pytest.fixture(params=BACKENDS)
def web_database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The `database` of a test's own HttpDaemon, once per backend: None or a PostgreSQL
    database of the test's own."""
    yield from _database(request, "url")
