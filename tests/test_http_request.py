"""The built-in HTTP_REQUEST executor, run in a real event-loop executor process against a local
http.server started in a thread of the test."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon import models
from executors import _process
from executors.http_request import RequestSpec
from tests.loop_harness import LoopProcess, forkserver, start  # noqa: F401 (fixtures)

REF = "executors.http_request:HttpRequestExecutor"
BIG = 400 * 1024


class Handler(http.server.BaseHTTPRequestHandler):
    """/hello, /echo (POST), /big (BIG bytes), /gated (half of BIG, the rest once `release` is set),
    /slow (headers, then waits), /chunked, /missing (404), /private (401)."""

    release: threading.Event

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/hello":
            self._send(200, b"hello world", {"X-Test": "1"})
        elif self.path in ("/big", "/gated"):
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            for i in range(BIG // 4096):
                if self.path == "/gated" and i == BIG // 8192:
                    self.wfile.flush()
                    if not self.release.wait(30):
                        return
                self.wfile.write(b"b" * 4096)
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.flush()
            self.release.wait(30)
        elif self.path == "/chunked":
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"first ", b"second ", b"third"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/private":
            self._send(401, b"who are you?", {"WWW-Authenticate": "Basic"})
        else:
            self._send(404, b"no such thing", {})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        echo = {"method": self.command, "body": body.decode(), "token": self.headers.get("X-Token")}
        self._send(201, json.dumps(echo).encode(), {"Content-Type": "application/json"})

    def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[tuple[str, threading.Event]]:
    release = threading.Event()
    handler = type("BoundHandler", (Handler,), {"release": release})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", release
    release.set()
    httpd.shutdown()
    httpd.server_close()


def request(loop: LoopProcess, payload: dict[str, Any], task_id: str = "req", **options: Any) -> str:
    return loop.assign("HTTP_REQUEST", payload, task_id=task_id, ref=REF, **options)


def test_get_post_chunked_and_errors_run_side_by_side(start: Callable[..., LoopProcess], server: Any) -> None:
    base, _ = server
    loop = start()
    get = request(loop, {"url": f"{base}/hello"}, "get")
    post = request(loop, {"url": f"{base}/echo", "method": "post", "body": "ça va?", "headers": {"X-Token": "t1"}}, "post")
    chunked = request(loop, {"url": f"{base}/chunked"}, "chunked")
    missing = request(loop, {"url": f"{base}/missing"}, "missing")
    private = request(loop, {"url": f"{base}/private"}, "private")
    truncated = request(loop, {"url": f"{base}/big", "max_body_bytes": 100}, "truncated")
    got = loop.result(get)["result"]
    assert got["status"] == 200 and got["body"] == "hello world" and got["headers"]["x-test"] == "1"
    assert got["truncated"] is False and got["bytes"] == 11
    posted = loop.result(post)["result"]
    assert posted["status"] == 201 and json.loads(posted["body"]) == {"method": "POST", "body": "ça va?", "token": "t1"}
    assert loop.result(chunked)["result"]["body"] == "first second third"
    failed = loop.result(missing)
    assert failed["error_type"] == "HTTP_404" and "no such thing" in failed["error"]
    assert loop.result(private)["error_type"] == models.AWAITING_CREDENTIAL
    cut = loop.result(truncated)["result"]
    assert cut["truncated"] is True and cut["body"] == "b" * 100


def test_a_body_saved_to_its_output_with_progress(start: Callable[..., LoopProcess], server: Any, tmp_path: Path) -> None:
    base, _ = server
    loop = start()
    output = tmp_path / "out" / "big.bin"
    token = request(loop, {"url": f"{base}/big", "output": str(output)})
    result = loop.result(token)["result"]
    assert result == {"status": 200, "reason": "OK", "headers": result["headers"], "output": str(output), "bytes": BIG}
    assert output.read_bytes() == b"b" * BIG and not output.with_name("big.bin.part").exists()
    percents = [m["percent"] for m in loop.of(token) if m["type"] == "progress"]
    assert len(percents) > 3 and percents == sorted(percents) and percents[-1] == 100


def test_a_cancel_mid_body_stops_it_at_once(start: Callable[..., LoopProcess], server: Any, tmp_path: Path) -> None:
    base, _ = server
    loop = start()
    output = tmp_path / "gated.bin"
    token = request(loop, {"url": f"{base}/gated", "output": str(output)}, cancel_grace=30.0)
    loop.until(lambda m: m.get("attempt") == token and m["type"] == "progress" and m["percent"] >= 45)
    loop.command("cancel", token, "cancel")
    assert loop.result(token, timeout=5)["error_type"] == models.CANCELLED  # long before the grace
    assert not output.exists() and not output.with_name("gated.bin.part").exists()


def test_a_request_past_its_timeout(start: Callable[..., LoopProcess], server: Any) -> None:
    base, _ = server
    loop = start()
    result = loop.result(request(loop, {"url": f"{base}/slow", "timeout": 0.3}))
    assert result["error_type"] == "REQUEST_TIMEOUT" and "within 0.3 s" in result["error"]


def test_a_pause_mid_body_holds_the_request(start: Callable[..., LoopProcess], server: Any) -> None:
    base, release = server
    loop = start(heartbeat=0.05)
    token = request(loop, {"url": f"{base}/gated", "timeout": 30, "max_body_bytes": BIG})
    loop.until(lambda m: m.get("attempt") == token and m["type"] == "progress" and m["percent"] >= 45)
    loop.command("pause", token)
    release.set()  # the rest of the body comes, but it is paused after one more read ...
    for _ in range(10):  # half a second of the loop running
        loop.until(lambda m: m["type"] == "alive")
    percents = [m["percent"] for m in loop.of(token) if m["type"] == "progress"]
    assert not [m for m in loop.of(token) if m["type"] == "result"] and percents[-1] < 100
    loop.command("resume", token)  # ... until resumed
    assert loop.result(token)["result"]["bytes"] == BIG


def test_https_to_a_plain_http_server_is_a_tls_error(start: Callable[..., LoopProcess], server: Any) -> None:
    base, _ = server
    loop = start()
    result = loop.result(request(loop, {"url": base.replace("http:", "https:") + "/hello"}))
    assert result["error_type"] == "TLS_ERROR"


@pytest.mark.skipif(
    shutil.which("openssl") is None and os.environ.get("CI") != "true",
    reason="openssl makes the test's certificate (apt-get install openssl); with CI=true it runs regardless",
)
def test_https_with_a_certificate_nobody_vouches_for_is_a_tls_error(
    start: Callable[..., LoopProcess], server: Any, tmp_path: Path
) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        loop = start()
        result = loop.result(request(loop, {"url": f"https://127.0.0.1:{httpd.server_address[1]}/hello"}))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result["error_type"] == "TLS_ERROR" and "CERTIFICATE_VERIFY_FAILED" in result["error"]


def test_nothing_listening_is_a_network_error(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    result = loop.result(request(loop, {"url": "http://127.0.0.1:1/"}))
    assert result["error_type"] == "NETWORK"


def test_a_bad_payload_is_a_payload_error_from_the_process(start: Callable[..., LoopProcess]) -> None:
    loop = start()
    result = loop.result(request(loop, {"url": "ftp://example.org/x"}))
    assert result["error_type"] == models.PAYLOAD_ERROR and "http(s) URL" in result["error"]


@pytest.mark.parametrize("payload, says", [
    ({}, "url (an http or https URL) is required"),
    ({"url": "http://"}, "with a host"),
    ({"url": "http://h:99999/"}, "not a valid URL"),
    ({"url": "http://user:pw@h/"}, "must not hold credentials"),
    ({"url": "http://h/a b"}, "spaces"),
    ({"url": "http://h/", "method": "GE T"}, "HTTP method"),
    ({"url": "http://h/", "headers": {"A": "b\r\nX: y"}}, "one-line"),
    ({"url": "http://h/", "headers": {"Content-Length": "3"}}, "the executor's"),
    ({"url": "http://h/", "headers": ["A"]}, "object of strings"),
    ({"url": "http://h/", "body": {"a": 1}}, "body must be text"),
    ({"url": "http://h/", "timeout": 0}, "timeout"),
    ({"url": "http://h/", "timeout": True}, "timeout"),
    ({"url": "http://h/", "output": "relative.bin"}, "absolute path"),
    ({"url": "http://h/", "max_body_bytes": -1}, "max_body_bytes"),
])
def test_bad_payloads_say_what_is_wrong(payload: dict[str, Any], says: str) -> None:
    with pytest.raises(_process.PayloadError, match=None) as caught:
        RequestSpec.from_payload(payload)
    assert says in str(caught.value)


def test_the_request_on_the_wire() -> None:
    spec = RequestSpec.from_payload({"url": "http://h:8080/p?q=1", "method": "put", "body": "hi", "headers": {"User-Agent": "me"}})
    assert spec.request() == (
        b"PUT /p?q=1 HTTP/1.1\r\nHost: h:8080\r\nAccept-Encoding: identity\r\nUser-Agent: me\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\nhi"
    )
