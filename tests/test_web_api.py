"""The HTTP API (SPEC §17) against a real daemon with `[http] listen` on a free port: every
operation, every class of error, the token, CORS, the body limit, /metrics and the live events;
once on SQLite and once on PostgreSQL (SPEC §16), the same tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from daemon import cli, config, protocol
from daemon.errors import ConfigError
from tests.conftest import wait_for
from tests.postgres_cluster import url  # noqa: F401 (web_database's PostgreSQL half)
from tests.web_harness import HttpDaemon, metric, module_database, sse_events, web_database  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, module_database: str | None) -> Iterator[HttpDaemon]:
    daemon = HttpDaemon(tmp_path_factory.mktemp("web") / "d", database=module_database, max_workers=3)
    try:
        yield daemon.start()
    finally:
        daemon.kill_if_running()


def count_task(d: HttpDaemon, n: int = 100_000, step: float = 0.02) -> str:
    tasks = [{"type": "COUNT", "payload": {"n": n, "step": step, "count_file": str(d.root / "c"),
                                          "state_file": str(d.root / "s")}}]
    return d.api("submit", tasks=tasks)["tasks"][0]["id"]


def hang_task(d: HttpDaemon, name: str) -> str:
    return d.api("submit", tasks=[{"type": "HANG", "payload": {"ready_file": str(d.root / name)}}])["tasks"][0]["id"]


def stored(d: HttpDaemon) -> int:
    """How many tasks the daemon holds (tasks of earlier tests may still change status)."""
    return sum(d.get("/api/v1/status").data["counts"].values())


def act(d: HttpDaemon, op: str, target: str) -> dict[str, Any]:
    """An acting operation on one task (they take `ids`, SPEC §14): its one result."""
    [result] = d.api(op, ids=[target])["results"]
    return result


def wait_status(d: HttpDaemon, task_id: str, *statuses: str) -> dict[str, Any]:
    return wait_for(lambda: (t := d.api("show", id=task_id)["object"])["status"] in statuses and t, 20)


# --- every operation ---------------------------------------------------------------------------


def test_every_operation_of_the_protocol_table_is_served(d: HttpDaemon) -> None:
    # Generic over OPERATIONS: an operation added to the table is served with no code of its own.
    # An empty body is either answered or refused for its arguments, never an unknown request.
    for op, operation in protocol.OPERATIONS.items():
        reply = d.raw("POST", f"/api/v1/{op}", b"")
        if getattr(operation, "streams", False) and reply.status == 200:
            lines = [json.loads(line) for line in reply.body.splitlines()]
            assert lines and all(line["ok"] for line in lines) and "more" not in lines[-1]["data"], (op, lines)
            continue
        assert reply.json is not None, (op, reply.status)
        required = [name for name, argument in operation.arguments.items() if argument.required]
        if required:
            assert reply.status == 400 and reply.kind == "ProtocolError", (op, reply.json)
            assert f"{required[0]} is required" in reply.json["error"]["message"]
        elif getattr(operation, "bulk", False):  # needs ids or a selector (SPEC §14)
            assert reply.status == 400 and reply.kind == "ProtocolError", (op, reply.json)
            assert "give at least one" in reply.json["error"]["message"], (op, reply.json)
        else:
            assert reply.status == 200 and reply.json["ok"], (op, reply.json)


def test_reads_by_get_with_query_arguments(d: HttpDaemon) -> None:
    task_id = d.api("submit", tasks=[{"type": "ECHO", "payload": {"x": 1}}])["tasks"][0]["id"]
    wait_status(d, task_id, "completed")
    status = d.get("/api/v1/status").data
    assert status["pid"] == d.process.pid and status["counts"]["completed"] >= 1
    listed = d.get("/api/v1/ls?status=completed&type=echo&limit=1").data
    assert len(listed) == 1 and listed[0]["type"] == "ECHO"
    shown = d.get(f"/api/v1/show?id={task_id[:8]}").data
    assert shown["kind"] == "task" and shown["object"]["result"]["echo"] == {"x": 1}
    waited = d.get(f"/api/v1/wait?ids={task_id}&timeout=5").data
    assert waited["ended"] and waited["tasks"][0]["id"] == task_id
    assert d.get(f"/api/v1/log_path?id={task_id}").data["path"].endswith(f"{task_id}.log")
    assert d.get("/api/v1/restarts?all=true").data == []
    assert [q["name"] for q in d.get("/api/v1/queues").data] == ["default"]
    types = {t["type"]: t for t in d.get("/api/v1/types").data}
    assert types["COUNT"]["pausable"] and not types["HANG"]["pausable"]
    assert [t["name"] for t in d.get("/api/v1/templates").data] == ["count_then_echo"]
    run_id = shown["object"]["workflow_run_id"]
    assert run_id in [r["id"] for r in d.get("/api/v1/runs?limit=50").data]


@pytest.mark.skipif("ls_pages" not in protocol.OPERATIONS, reason="this daemon has no streamed ls")
def test_a_streamed_operation_answers_json_lines(d: HttpDaemon) -> None:
    ids = [d.api("submit", tasks=[{"type": "ECHO", "payload": {"s": i}}])["tasks"][0]["id"] for i in range(3)]
    reply = d.get("/api/v1/ls_pages?type=ECHO&total=true")
    assert reply.status == 200 and reply.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in reply.body.splitlines()]
    assert all(line["ok"] for line in lines) and all(line["data"].get("more") for line in lines[:-1])
    found = [task["id"] for line in lines for task in line["data"]["items"]]
    assert set(ids) <= set(found) and lines[-1]["data"]["total"] == len(found)
    refused = d.get("/api/v1/ls_pages?sort=sideways")
    assert refused.status == 400 and refused.kind == "ProtocolError", refused.json


def test_submit_run_wait_and_cancel_by_post(d: HttpDaemon) -> None:
    started = d.api("run", template="count_then_echo", params={"n": "3"})
    count_id, echo_id = started["tasks"][0]["id"], started["tasks"][1]["id"]
    waited = d.api("wait", ids=[started["run_id"]], timeout=10)
    assert waited["ended"] and [t["status"] for t in waited["tasks"]] == ["completed", "completed"]
    assert d.api("show", id=started["run_id"])["object"]["status"] == "completed"
    long_id = count_task(d)
    wait_status(d, long_id, "running")
    cancelled = act(d, "cancel", long_id)
    assert cancelled["ok"] and cancelled["stopping"] == [long_id]
    assert wait_status(d, long_id, "cancelled")["error_type"] == "CANCELLED"
    assert {count_id, echo_id}.isdisjoint(cancelled["cancelled"])


def test_pause_and_resume_and_their_refusals(d: HttpDaemon) -> None:
    task_id = count_task(d)
    wait_status(d, task_id, "running")
    # As on the socket: a bulk reply answers each target, a refusal with its kind (HTTP 200).
    assert act(d, "pause", task_id)["is_paused"] is True
    again = act(d, "pause", task_id)
    assert not again["ok"], again
    assert act(d, "resume", task_id)["is_paused"] is False
    hang_id = hang_task(d, "pause-hang")
    wait_status(d, hang_id, "running")
    refused = act(d, "pause", hang_id)
    assert not refused["ok"] and refused["kind"] == "NotPausable", refused
    for target in (task_id, hang_id):
        act(d, "cancel", target)
    wait_status(d, task_id, "cancelled")
    finished = act(d, "pause", task_id)
    assert not finished["ok"] and finished["kind"] in ("InvalidTransition", "NotPausable"), finished


@pytest.mark.skipif("retry" not in protocol.OPERATIONS, reason="this daemon has no retry operation")
def test_retry_by_ids(d: HttpDaemon) -> None:
    failed = d.api("submit", tasks=[{"type": "RAISE"}])["tasks"][0]["id"]
    wait_status(d, failed, "failed")
    results = d.api("retry", ids=[failed[:8], "ffffffff"])["results"]
    assert [r["ok"] for r in results] == [True, False], results
    assert wait_status(d, results[0]["new_id"], "failed")["type"] == "RAISE"
    refused = d.post("retry", ids=[])
    assert refused.status == 400 and refused.kind == "ProtocolError"


def test_hold_and_release(d: HttpDaemon) -> None:
    d.api("queue_pause", name="default")  # so that the task waits to be held
    try:
        task_id = d.api("submit", tasks=[{"type": "ECHO", "payload": {"held": True}}])["tasks"][0]["id"]
        held = act(d, "hold", task_id)
        assert held["ok"], held
        assert d.api("show", id=task_id)["object"]["is_held"]
        again = act(d, "hold", task_id)
        assert not again["ok"] and "\n" not in again["message"], again
    finally:
        d.api("queue_resume", name="default")
    assert d.api("wait", ids=[task_id], timeout=0.5)["ended"] is False  # held: never claimed
    assert act(d, "release", task_id)["ok"]
    assert wait_status(d, task_id, "completed")["is_held"] in (0, False)


def test_queue_operations(d: HttpDaemon) -> None:
    assert d.api("queue_pause", name="default") == {"name": "default", "changed": True}
    assert d.get("/api/v1/queues").data[0]["paused"] is True
    assert d.api("queue_resume", name="default")["changed"] is True
    assert d.api("queue_workers", name="default", workers=4) == {"name": "default", "workers": 4}
    assert d.get("/api/v1/status").data["max_workers"] == 4
    d.api("queue_workers", name="default", workers=3)
    unknown = d.post("queue_pause", name="nope")
    assert unknown.status == 400 and unknown.kind == "QueueError", unknown.json


# --- errors ------------------------------------------------------------------------------------


def test_bad_input_is_refused_in_one_line_with_its_status(d: HttpDaemon) -> None:
    before = stored(d)
    cases = [
        (d.get("/api/v1/ls?limit=many"), 400, "ProtocolError", "limit must be int | None"),
        (d.get("/api/v1/ls?colour=red"), 400, "ProtocolError", 'ls does not take "colour"'),
        (d.get("/api/v1/ls?status=bogus"), 400, "ProtocolError", 'unknown status "bogus"'),
        (d.raw("POST", "/api/v1/submit", b"{not json"), 400, "ProtocolError", "not valid JSON"),
        (d.raw("POST", "/api/v1/submit", b"[1]"), 400, "ProtocolError", "not a JSON object"),
        (d.raw("POST", "/api/v1/submit", b'{"tasks": [{"type": "\\ud800"}]}'), 400, "NotText", "lone surrogate"),
        (d.raw("POST", "/api/v1/submit", b"\xff\xfe"), 400, "ProtocolError", "not UTF-8"),
        (d.post("submit", tasks=[{"type": "NOPE_TYPE"}]), 400, None, "NOPE_TYPE"),
        (d.post("submit", tasks=[{"type": "ECHO", "depends_on": ["ffffffff-0000"]}]), None, None, ""),
        (d.get("/api/v1/show?id=ab"), 400, "IdTooShort", "at least 4"),
        (d.get("/api/v1/show?id=ffffffff"), 404, "UnknownTask", "ffffffff"),
        (d.post("cancel", id="ffffffff"), 400, "ProtocolError", 'cancel does not take "id"'),
        (d.post("cancel"), 400, "ProtocolError", "give at least one id"),
        (d.get("/api/v1/nope"), 404, "ProtocolError", 'unknown request "nope"'),
        (d.get("/api/v1/cancel?id=x"), 405, "ProtocolError", "POST it"),
    ]
    for reply, status, kind, words in cases:
        assert reply.json["ok"] is False, reply.json
        if status is not None:
            assert reply.status == status, (reply.status, reply.json)
        else:
            assert reply.status in (400, 404), reply.json
        if kind is not None:
            assert reply.kind == kind, reply.json
        message = reply.json["error"]["message"]
        assert words in message and "\n" not in message, message
    assert stored(d) == before  # nothing was stored
    assert d.process.poll() is None


def test_a_body_over_the_socket_limit_is_refused_with_413(d: HttpDaemon) -> None:
    before = stored(d)
    body = json.dumps({"tasks": [{"type": "ECHO", "payload": {"blob": "x" * (10 * 1024 * 1024)}}]}).encode()
    reply = d.raw("POST", "/api/v1/submit", body)
    assert reply.status == 413 and reply.kind == "FrameTooLarge", reply.json
    # Without a length given up front (chunked), it is cut off once past the limit.
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    chunks = (b"x" * (1024 * 1024) for _ in range(10))
    try:
        conn.request("POST", "/api/v1/submit", body=chunks, encode_chunked=True,
                     headers={"Authorization": f"Bearer {d.token}"})
        response = conn.getresponse()
        assert response.status == 413, response.read()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while the client still sent: refused all the same
    finally:
        conn.close()
    assert stored(d) == before


def test_every_request_needs_the_token_but_the_page_files(d: HttpDaemon) -> None:
    wrong = "x" * len(d.token)
    for path in ("/api/v1/status", "/api/v1/ls", "/metrics", "/api/v1/events", "/api/v1/page/tasks"):
        for token in (None, wrong, d.token[:-1]):
            reply = d.get(path, token=token)
            assert reply.status == 401 and reply.kind == "PermissionDenied", (path, reply.status)
            assert reply.headers["www-authenticate"].startswith("Bearer")
    refused = d.raw("POST", "/api/v1/submit", json.dumps({"tasks": [{"type": "ECHO"}]}).encode(), token=None)
    assert refused.status == 401
    basic = d.get("/api/v1/status", token=None, headers={"Authorization": "Basic " + d.token})
    assert basic.status == 401
    for path in ("/", "/page.js", "/page.css"):
        page = d.get(path, token=None)
        assert page.status == 200 and page.body, path
        assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "<title>fredica</title>" in d.get("/", token=None).body.decode()


def test_no_cookies_and_cors_stays_closed(d: HttpDaemon) -> None:
    before = stored(d)
    preflight = d.raw("OPTIONS", "/api/v1/submit", token=None, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status == 403
    cross = d.raw("POST", "/api/v1/submit", json.dumps({"tasks": [{"type": "ECHO"}]}).encode(),
                  headers={"Origin": "http://evil.example"})
    assert cross.status == 403 and cross.kind == "PermissionDenied"
    same = d.get("/api/v1/status", headers={"Origin": d.base_url})
    assert same.status == 200
    for reply in (preflight, cross, same, d.get("/", token=None), d.get("/metrics")):
        assert not any(name.startswith("access-control-") for name in reply.headers), reply.headers
        assert "set-cookie" not in reply.headers
    assert stored(d) == before


# --- the page's reads --------------------------------------------------------------------------


def test_page_tasks_are_newest_first_and_paged(d: HttpDaemon) -> None:
    ids = [d.api("submit", tasks=[{"type": "ECHO", "payload": {"i": i}}])["tasks"][0]["id"] for i in range(3)]
    first = d.get("/api/v1/page/tasks?type=ECHO&limit=2").data
    assert [t["id"] for t in first["tasks"]] == [ids[2], ids[1]]
    assert first["total"] >= 3
    older = d.get(f"/api/v1/page/tasks?type=ECHO&limit=1&before={first['tasks'][-1]['seq']}").data
    assert older["tasks"][0]["id"] == ids[0]
    run = d.api("show", id=ids[1])["object"]["workflow_run_id"]
    assert [t["id"] for t in d.get(f"/api/v1/page/tasks?run={run[:8]}").data["tasks"]] == [ids[1]]
    assert d.get("/api/v1/page/tasks?status=bogus").status == 400
    assert d.get("/api/v1/page/tasks?limit=0").status == 400


def test_task_log_is_followed_until_the_task_ends(d: HttpDaemon) -> None:
    task_id = d.api("submit", tasks=[{"type": "PRINT"}])["tasks"][0]["id"]
    wait_status(d, task_id, "completed")
    texts = []
    for event, data in sse_events(d, f"/api/v1/page/log?id={task_id[:8]}"):
        if event == "end":
            break
        texts.append(data["text"])
    assert "hello on stdout" in "".join(texts)
    assert d.get("/api/v1/page/log?id=ffffffff").status == 404


def test_events_push_progress_and_the_end_of_a_task(d: HttpDaemon) -> None:
    stream = sse_events(d, "/api/v1/events")
    assert next(stream)[0] == "hello"
    task_id = count_task(d, n=40, step=0.05)
    progress: list[int] = []
    for event, data in stream:
        assert event == "tasks"
        mine = [t for t in data.get("tasks", []) if t["id"] == task_id]
        progress += [t["progress"] for t in mine]
        if any(t["status"] == "completed" for t in mine):
            break
    assert len(set(progress)) >= 3 and progress == sorted(progress) and progress[-1] == 100, progress
    stream.close()


# --- /metrics ----------------------------------------------------------------------------------


def test_metrics(d: HttpDaemon) -> None:
    task_id = d.api("submit", tasks=[{"type": "ECHO", "payload": {"m": 1}}])["tasks"][0]["id"]
    wait_status(d, task_id, "completed")
    hang_id = hang_task(d, "metrics-hang")
    wait_status(d, hang_id, "running")
    reply = d.get("/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.body.decode()
    completed = len(d.api("ls", status="completed"))
    assert metric(text, "fredica_tasks", status="completed", queue="default") == completed
    assert metric(text, "fredica_busy_workers", queue="default") >= 1
    assert metric(text, "fredica_workers", queue="default") == 3
    assert metric(text, "fredica_attempt_duration_seconds_count", type="ECHO") >= 1
    assert metric(text, "fredica_attempt_duration_seconds_bucket", type="ECHO", le="+Inf") >= 1
    assert metric(text, "fredica_database_faults_total") == 0
    assert metric(text, "fredica_database_fault_active") == 0
    act(d, "cancel", hang_id)
    wait_status(d, hang_id, "cancelled")
    assert metric(d.get("/metrics").body.decode(), "fredica_tasks_finished_total", status="cancelled") >= 1


# --- the token file, restarts, start and stop --------------------------------------------------


def test_token_file_is_private_kept_across_restarts_and_printed(tmp_path: Path, web_database: str | None) -> None:
    d = HttpDaemon(tmp_path / "d", database=web_database)
    try:
        d.start()
        token = d.token
        assert stat.S_IMODE(os.stat(d.token_file).st_mode) == 0o600 and len(token) >= 32
        printed = CliRunner().invoke(cli.main, ["http-token", "--config", str(d.config)])
        assert printed.exit_code == 0 and printed.output == token + "\n"
        hangs = [d.api("submit", tasks=[{"type": "HANG", "payload": {"ready_file": str(tmp_path / name)}}])
                 ["tasks"][0]["id"] for name in ("ready", "ready-too")]
        wait_for(lambda: (tmp_path / "ready").exists() and (tmp_path / "ready-too").exists(), 20)
        d.kill9()
        d.close_http()
        d.start()
        assert d.token == token
        entries = {e["task_id"]: e for e in d.get("/api/v1/restarts").data}
        assert sorted(entries) == sorted(hangs)
        text = d.get("/metrics").body.decode()
        assert metric(text, "fredica_restart_log_entries", disposition="pending_review") == 2
        [dismissed] = d.api("restarts_dismiss", ids=[str(entries[hangs[1]]["id"])])["results"]
        assert dismissed["ok"], dismissed
        recreated = d.api("restarts_recreate", ids=[str(entries[hangs[0]]["id"])])["results"]
        assert [r["ok"] for r in recreated] == [True] and recreated[0]["run_id"], recreated
        again = d.api("restarts_recreate", ids=[str(entries[hangs[0]]["id"])])["results"]
        assert [r["ok"] for r in again] == [False] and "\n" not in again[0]["message"], again
        assert d.get("/api/v1/restarts").data == []
        text = d.get("/metrics").body.decode()
        assert metric(text, "fredica_restart_log_entries", disposition="dismissed") == 1
        assert metric(text, "fredica_restart_log_entries", disposition="recreated") == 1
        # SIGTERM with a live stream open: the daemon still stops cleanly, and soon.
        stream = sse_events(d, "/api/v1/events")
        next(stream)
        act(d, "cancel", recreated[0]["new_id"])
        assert d.stop(signal.SIGTERM, timeout=20) == 0
        stream.close()
    finally:
        d.kill_if_running()


def test_no_token_yet_is_one_line() -> None:
    with CliRunner().isolated_filesystem() as where:
        Path("c.toml").write_text(f'[daemon]\ndatabase = "{where}/db/fredica.db"\n')
        result = CliRunner().invoke(cli.main, ["http-token", "--config", "c.toml"])
        assert result.exit_code == 1 and result.output.count("\n") == 1
        assert result.output.startswith("error: no HTTP token in ")


def test_two_daemons_making_the_token_file_at_once_end_with_the_same_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other daemon's whole start falls between this one's look and its write: each must end
    # with the token that is in the file, and never read it before a token is in it.
    from daemon.web import auth

    path = tmp_path / "state" / "http-token"
    made = iter(["mine", "theirs"])
    others: list[str] = []

    def token_urlsafe(_: int) -> str:
        token = next(made)
        if token == "mine":
            others.append(auth.load_or_create_token(path))  # the other daemon, meanwhile
        return token

    monkeypatch.setattr(auth.secrets, "token_urlsafe", token_urlsafe)
    assert auth.load_or_create_token(path) == others[0] == "theirs" == path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["http-token"]  # no file of a token left behind


def test_the_token_file_is_made_where_the_filesystem_has_no_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from daemon.web import auth

    def no_links(*_: object) -> None:  # as vfat, exFAT and some network mounts answer link(2)
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(auth.os, "link", no_links)
    path = tmp_path / "state" / "http-token"
    token = auth.load_or_create_token(path)
    assert token and path.read_text().strip() == token and auth.load_or_create_token(path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["http-token"]


def test_a_port_in_use_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    d = HttpDaemon(tmp_path / "d")
    import socket

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        taken.bind(("127.0.0.1", d.port))
        taken.listen(1)
        result = subprocess.run([sys.executable, "-m", "daemon", "daemon", "--config", str(d.config)],
                                env=d.env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1:] == [
        f"fredica: cannot listen for HTTP on 127.0.0.1:{d.port}: Address already in use"], result.stderr
    assert not d.token_file.exists()


@pytest.mark.parametrize("text", ["8765", "localhost", ":8765", "127.0.0.1:0", "127.0.0.1:70000", "h:x"])
def test_bad_listen_values_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"\[http\] listen must look like"):
        config.from_mapping({"http": {"listen": text}})


def test_http_config_keys() -> None:
    settings = config.from_mapping({"http": {"listen": "[::1]:9000", "token_file": "/srv/token"}})
    assert settings.http_listen == ("::1", 9000) and settings.token_file == Path("/srv/token")
    assert config.from_mapping({}).http_listen is None
    with pytest.raises(ConfigError, match="unknown key 'port'"):
        config.from_mapping({"http": {"port": 1}})


def test_keep_alive_replies_do_not_wait_for_delayed_acks(d: HttpDaemon) -> None:
    # Without TCP_NODELAY on the listening socket every reply (headers and body written apart)
    # waited out the client's delayed ACK: 40 ms a request instead of well under 2 ms.
    import time

    times = []
    for _ in range(41):
        started = time.perf_counter()
        assert d.get("/api/v1/status").status == 200
        times.append(time.perf_counter() - started)
    # Each reply that waits out a delayed ACK takes at least its 40 ms; the quickest of 40 tells
    # that apart from a loaded machine's slow ones (a median does not, at a load of 20).
    assert min(times[1:]) < 0.02, times


def test_open_streams_share_one_producer(d: HttpDaemon) -> None:
    # Five pages cost the database what one does: the producer's looks are bounded by its
    # interval (0.2 s), not multiplied by the streams.
    import threading
    import time

    streams = [sse_events(d, "/api/v1/events") for _ in range(5)]
    for stream in streams:
        assert next(stream)[0] == "hello"
    text = d.get("/metrics").body.decode()
    assert metric(text, "fredica_http_event_streams") == 5
    looks_before = metric(text, "fredica_http_event_looks_total")
    started = time.monotonic()
    task_id = count_task(d, n=60, step=0.02)  # commits all the way through
    seen = [0] * len(streams)

    def read(index: int) -> None:
        for _event, data in streams[index]:
            if any(t["id"] == task_id and t["status"] == "completed" for t in data.get("tasks", [])):
                seen[index] = 1
                return

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(streams))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(30)
    elapsed = time.monotonic() - started
    assert seen == [1] * 5
    looks = metric(d.get("/metrics").body.decode(), "fredica_http_event_looks_total") - looks_before
    assert 1 <= looks <= elapsed / 0.2 + 3, (looks, elapsed)
    for stream in streams:
        stream.close()
    wait_for(lambda: metric(d.get("/metrics").body.decode(), "fredica_http_event_streams") == 0, 10)


def test_clients_waiting_for_tasks_never_hold_up_other_requests(d: HttpDaemon) -> None:
    import concurrent.futures
    import time

    hang_id = hang_task(d, "wait-hang")
    wait_status(d, hang_id, "running")

    def wait_on_it() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        try:
            conn.request("GET", f"/api/v1/wait?ids={hang_id}&timeout=6",
                         headers={"Authorization": f"Bearer {d.token}"})
            return conn.getresponse().status
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(30) as clients:  # more than the handlers' pool
        waits = [clients.submit(wait_on_it) for _ in range(30)]
        started = time.monotonic()
        wait_for(lambda: metric(d.get("/metrics").body.decode(), "fredica_busy_workers", queue="default") >= 1, 5)
        assert d.get("/api/v1/status").status == 200
        assert d.get(f"/api/v1/show?id={hang_id}").status == 200
        assert time.monotonic() - started < 4, "requests waited for the waits"
        assert [w.result(60) for w in waits] == [200] * 30
    act(d, "cancel", hang_id)


def test_corruption_met_by_a_read_of_the_page_ends_the_daemon(tmp_path: Path) -> None:
    # The page's own reads (not an operation of the protocol) must report it as Handlers do:
    # the daemon must not go on answering from a database it cannot trust (SPEC §13).
    from tests.test_database_faults import corrupt_under

    web = HttpDaemon(tmp_path / "corrupt").start()
    try:
        web.api("submit", tasks=[{"type": "ECHO", "payload": {"i": i, "pad": "p" * 300}} for i in range(300)])
        wait_for(lambda: web.get("/api/v1/page/tasks?limit=1&status=completed").data["total"] == 300, timeout=60)
        corrupt_under(web.database)
        reply = web.get("/api/v1/page/tasks?limit=500")
        assert reply.status >= 500 and "corrupt" in reply.json["error"]["message"], (reply.status, reply.body[:300])
        assert web.process is not None and web.process.wait(30) == 1
    finally:
        web.kill_if_running()
