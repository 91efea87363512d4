"""The built-in DOWNLOAD executor against a local HTTP server: resume, restart, pause, cancel, verify.

The server runs in a thread of the test process on 127.0.0.1 and nothing else is contacted. It can
drop a connection at a given byte, ignore Range requests, redirect, and hold a response at a byte
until the test opens a gate (how the tests pause and cancel mid-download without sleeping). A second
server on "localhost" is another origin for redirects; one with TLS (a throwaway certificate from
the openssl command) is an https origin.
"""

from __future__ import annotations

import fcntl
import http.server
import os
import random
import re
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon import models
from daemon.models import TaskStatus
from executors.download import DownloadExecutor
from tests import media
from tests.conftest import wait_for

SIZE = 3_000_000
HALF = SIZE // 2
CHUNK = 64 * 1024
DATA = random.Random(1234).randbytes(SIZE)
DATA_SHA = media.sha256(DATA)


class FileServer:
    """Serves DATA at /file.bin (with Range support unless `ranges` is False); records requests."""

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.scheme = "https" if tls else "http"
        self.ranges = True
        self.max_range: int | None = None  # answer an open range with at most this many bytes
        self.drop_at: list[int] = []  # byte offsets at which the next response breaks off (once each)
        self.gate_at: int | None = None  # the response waits here until the gate opens (or moves on)
        self.gate = threading.Event()  # set by open_gate: no more waiting
        self.waiting = threading.Event()  # set while a response waits at the gate
        self._gate_moved = threading.Condition()
        self.statuses: dict[str, list[int]] = {"/missing": [404], "/secret": [401]}
        self.redirects: dict[str, str] = {}  # path -> the Location of a 302
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                owner.handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str = "/file.bin") -> str:
        return f"{self.scheme}://{self.host}:{self.httpd.server_address[1]}{path}"

    def ranges_requested(self) -> list[str | None]:
        return [r["range"] for r in self.requests]

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        requested = h.headers.get("Range")
        headers = {name.lower(): value for name, value in h.headers.items()}
        self.requests.append({"path": h.path, "range": requested, "headers": headers})
        if h.path in self.redirects:
            h.send_response(302)
            h.send_header("Location", self.redirects[h.path])
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        codes = self.statuses.get(h.path)
        if codes:
            code = codes.pop(0) if len(codes) > 1 else codes[0]
            if code != 200:
                h.send_response(code)
                h.send_header("Content-Length", "0")
                h.send_header("Retry-After", "0")
                h.end_headers()
                return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", requested or "")
        if match and self.ranges:
            start = int(match.group(1))
            if start >= SIZE:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{SIZE}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            stop = min(SIZE, start + self.max_range) if self.max_range else SIZE
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{stop - 1}/{SIZE}")
        else:
            stop = SIZE
            h.send_response(200)
        h.send_header("Content-Length", str(stop - start))
        h.end_headers()
        try:
            self._send_body(h, start, stop)
        except OSError:
            pass  # the client went away (cancel, pause): nothing to do

    def _send_body(self, h: http.server.BaseHTTPRequestHandler, pos: int, stop: int) -> None:
        while pos < stop:
            stops = [stop, pos + CHUNK, *(d for d in self.drop_at if d > pos)]
            if self.gate_at is not None and self.gate_at > pos:
                stops.append(self.gate_at)
            end = min(stops)
            h.wfile.write(DATA[pos:end])
            pos = end
            if pos in self.drop_at:
                self.drop_at.remove(pos)
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)
                h.close_connection = True
                return
            if pos == self.gate_at and not self.gate.is_set():
                h.wfile.flush()
                with self._gate_moved:
                    self.waiting.set()
                    self._gate_moved.wait_for(lambda: self.gate.is_set() or self.gate_at != pos, timeout=20)

    def open_gate(self) -> None:
        """Let the held response send the rest."""
        with self._gate_moved:
            self.gate.set()
            self._gate_moved.notify_all()

    def step(self, nbytes: int) -> None:
        """Let the held response send `nbytes` more, then hold it again."""
        with self._gate_moved:
            self.waiting.clear()
            assert self.gate_at is not None
            self.gate_at += nbytes
            self._gate_moved.notify_all()

    def close(self) -> None:
        self.open_gate()
        self.httpd.shutdown()
        self.httpd.server_close()


class QuickPauseDownload(DownloadExecutor):
    """DOWNLOAD that closes its connection as soon as it is paused."""

    pause_hold_seconds = 0.0


class LongHoldDownload(DownloadExecutor):
    """DOWNLOAD that keeps its connection through any pause a test makes, however slow the machine."""

    pause_hold_seconds = 3600.0


@pytest.fixture
def server() -> Iterator[FileServer]:
    server = FileServer()
    yield server
    server.close()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[media.Launcher]:
    launcher = media.Launcher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture
def elsewhere() -> Iterator[FileServer]:
    """A server of another origin: host "localhost", its own port."""
    server = FileServer(host="localhost")
    yield server
    server.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate (and its key) for 127.0.0.1."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":  # .ci/run installs it: under CI this test must run
            raise AssertionError("the openssl command is not installed")
        pytest.skip("the openssl command is not installed")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def payload(server: FileServer, tmp_path: Path, path: str = "/file.bin", **extra: Any) -> dict[str, Any]:
    return {"url": server.url(path), "output": str(tmp_path / "dl" / "file.bin"), **extra}


def outputs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "dl" / "file.bin", tmp_path / "dl" / "file.bin.part"


def assert_downloaded(result: dict[str, Any], tmp_path: Path) -> None:
    output, part = outputs(tmp_path)
    assert result["error"] is None, result
    assert result["result"] == {"output": str(output), "bytes": SIZE, "sha256": DATA_SHA}
    assert output.read_bytes() == DATA and not part.exists()


# --- transfers --------------------------------------------------------------------------------------


def test_download_with_progress_and_checksum(server: FileServer, launcher: media.Launcher, tmp_path: Path) -> None:
    child = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA.upper()))
    assert_downloaded(launcher.finish(child), tmp_path)
    percents = media.progress_of(launcher.messages(child))
    assert percents == sorted(percents) and percents[-1] == 100 and len(percents) > 5
    assert server.ranges_requested() == [None]


def test_a_dropped_connection_resumes_with_range(server: FileServer, launcher: media.Launcher, tmp_path: Path) -> None:
    server.drop_at = [1_000_000, 2_000_000]
    child = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA))
    assert_downloaded(launcher.finish(child), tmp_path)
    assert server.ranges_requested() == [None, "bytes=1000000-", "bytes=2000000-"]
    assert "connection closed after 1000000 of 3000000 bytes" in child.log_path.read_text()


def test_a_server_without_ranges_gets_the_file_from_zero(server: FileServer, launcher: media.Launcher, tmp_path: Path) -> None:
    server.ranges = False
    server.drop_at = [1_000_000]
    child = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA))
    assert_downloaded(launcher.finish(child), tmp_path)
    assert server.ranges_requested() == [None, "bytes=1000000-"]  # asked, got a 200, started over


def test_transient_http_errors_are_retried_inside_the_attempt(server: FileServer, tmp_path: Path) -> None:
    server.statuses["/flaky"] = [503, 429, 200]
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, "/flaky"))
    assert result.ok and result.result["sha256"] == DATA_SHA
    assert len(server.requests) == 3


def test_a_range_answered_in_pieces_is_completed(server: FileServer, tmp_path: Path) -> None:
    server.max_range = 1_000_000
    server.drop_at = [500_000]
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, sha256=DATA_SHA))
    assert result.ok, result
    assert server.ranges_requested() == [None, "bytes=500000-", "bytes=1500000-", "bytes=2500000-"]


SECRETS = {"Authorization": "Bearer s3cret", "cookie": "session=s3cret", "PROXY-AUTHORIZATION": "Basic s3cret"}


def test_a_redirect_to_another_origin_drops_the_credentials(
    server: FileServer, elsewhere: FileServer, tmp_path: Path
) -> None:
    server.redirects["/here"] = server.url("/moved")  # same origin: the credentials go along
    server.redirects["/moved"] = elsewhere.url()  # another host and port: they must not
    headers = {**SECRETS, "X-Trace": "kept"}
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, "/here", sha256=DATA_SHA, headers=headers))
    assert result.ok and result.result["sha256"] == DATA_SHA, result
    secrets = {name.lower(): value for name, value in SECRETS.items()}
    assert [r["path"] for r in server.requests] == ["/here", "/moved"]
    assert all(r["headers"].items() >= secrets.items() for r in server.requests)
    [received] = elsewhere.requests
    assert received["path"] == "/file.bin" and received["headers"]["x-trace"] == "kept"
    assert not secrets.keys() & received["headers"].keys(), received["headers"]


def test_a_redirect_from_https_to_http_is_refused(
    certificate: tuple[Path, Path], elsewhere: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*certificate)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # the executor trusts the throwaway certificate
    secure = FileServer(tls=tls)
    try:
        secure.redirects["/moved"] = elsewhere.url()
        task_payload = {"url": secure.url("/moved"), "output": str(outputs(tmp_path)[0]), "headers": SECRETS}
        result, _ = media.run_inline(DownloadExecutor(), task_payload)
    finally:
        secure.close()
    assert result.error_type == models.PAYLOAD_ERROR, result
    assert f"refused the redirect from {secure.url('/moved')} to {elsewhere.url()}" in (result.error or "")
    assert "https does not fall back to http" in (result.error or "")
    assert [r["path"] for r in secure.requests] == ["/moved"] and elsewhere.requests == []
    assert not any(p.exists() for p in outputs(tmp_path))


def test_a_complete_part_file_is_finished_on_416(server: FileServer, tmp_path: Path) -> None:
    output, part = outputs(tmp_path)
    part.parent.mkdir()
    part.write_bytes(DATA)
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, sha256=DATA_SHA))
    assert result.ok and result.result["bytes"] == SIZE and output.read_bytes() == DATA
    assert server.ranges_requested() == [f"bytes={SIZE}-"]


# --- pause and cancel -------------------------------------------------------------------------------


def start_gated(server: FileServer, launcher: media.Launcher, tmp_path: Path, **launch: Any) -> Any:
    """A download held by the server at HALF; returns once the executor has all bytes before it."""
    server.gate_at = HALF
    child = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA), **launch)
    server.waiting.wait(15)
    launcher.wait_message(child, lambda m: m["type"] == "progress" and m["percent"] >= 50)
    return child


def see_the_pause(server: FileServer, launcher: media.Launcher, child: Any) -> None:
    """Let data through a chunk at a time until the executor reports it is paused.

    It looks at the pause between chunks, once its control reader has applied the command; on a
    loaded machine that can take longer than the rest of the file would if let through at once.
    """
    def paused() -> bool:
        return any(m["type"] == "progress" and m["text"].startswith("paused at") for m in launcher.messages(child))

    for _ in range(10):  # a few chunks of the half left: the file is never finished meanwhile
        server.step(CHUNK)
        try:
            wait_for(paused, timeout=2)
            return
        except AssertionError:
            continue  # not seen yet: one more chunk, one more look
    raise AssertionError("the executor never reported its pause")


def test_pause_then_resume_on_the_same_connection(server: FileServer, launcher: media.Launcher, tmp_path: Path) -> None:
    child = start_gated(server, launcher, tmp_path, ref="tests.test_download:LongHoldDownload")
    child.pause()
    see_the_pause(server, launcher, child)
    output, part = outputs(tmp_path)
    held = part.stat().st_size
    assert HALF <= held < SIZE and not output.exists() and child.is_alive()
    server.open_gate()
    child.resume()
    assert_downloaded(launcher.finish(child), tmp_path)
    assert server.ranges_requested() == [None]  # a short pause keeps the connection


def test_a_long_pause_closes_the_connection_and_resumes_with_range(
    server: FileServer, launcher: media.Launcher, tmp_path: Path
) -> None:
    child = start_gated(server, launcher, tmp_path, ref="tests.test_download:QuickPauseDownload")
    child.pause()
    see_the_pause(server, launcher, child)
    server.open_gate()
    wait_for(lambda: "closing the connection" in child.log_path.read_text())
    held = outputs(tmp_path)[1].stat().st_size
    child.resume()
    assert_downloaded(launcher.finish(child), tmp_path)
    assert server.ranges_requested() == [None, f"bytes={held}-"]


def test_cancel_leaves_the_part_and_the_retry_resumes_from_it(
    server: FileServer, launcher: media.Launcher, tmp_path: Path
) -> None:
    child = start_gated(server, launcher, tmp_path)
    child.request_cancel()  # the executor is blocked reading from the silent server
    assert launcher.finish(child, timeout=10)["error_type"] == models.CANCELLED
    output, part = outputs(tmp_path)
    assert part.stat().st_size == HALF and not output.exists()
    server.open_gate()
    retry = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA), retry_count=1)
    assert_downloaded(launcher.finish(retry), tmp_path)
    assert server.ranges_requested() == [None, f"bytes={HALF}-"]
    assert f"resuming from {HALF} bytes" in retry.log_path.read_text()


# --- failures ---------------------------------------------------------------------------------------


def test_a_checksum_mismatch_deletes_the_part(server: FileServer, tmp_path: Path) -> None:
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, sha256="0" * 64))
    assert result.error_type == "CHECKSUM" and f"got {DATA_SHA}" in (result.error or "")
    assert not any(p.exists() for p in outputs(tmp_path))


@pytest.mark.parametrize(("path", "error_type"), [("/missing", "HTTP_404"), ("/secret", models.AWAITING_CREDENTIAL)])
def test_http_errors(server: FileServer, tmp_path: Path, path: str, error_type: str) -> None:
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, path))
    assert result.error_type == error_type and server.url(path) in (result.error or "")
    assert not any(p.exists() for p in outputs(tmp_path))
    assert len(server.requests) == 1  # not retried inside the attempt


def test_a_refused_connection_is_network_after_reconnects(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    executor = DownloadExecutor()
    task_payload = {"url": f"http://127.0.0.1:{port}/x", "output": str(tmp_path / "x")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("executors.download.RECONNECT_DELAYS", (0.0, 0.0))
        result, _ = media.run_inline(executor, task_payload)
    assert result.error_type == "NETWORK" and "giving up after 3 failed connections" in (result.error or "")


def test_a_part_locked_by_another_task_is_output_busy(server: FileServer, tmp_path: Path) -> None:
    _, part = outputs(tmp_path)
    part.parent.mkdir()
    with open(part, "wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path))
    assert result.error_type == "OUTPUT_BUSY" and server.requests == []


def self_pauses(launcher: media.Launcher, child: Any) -> list[dict[str, Any]]:
    return [m for m in launcher.messages(child) if m["type"] in ("pause_request", "resume_request")]


def test_a_second_download_of_one_output_waits_for_the_first_and_finds_it_done(
    server: FileServer, launcher: media.Launcher, tmp_path: Path
) -> None:
    output, _ = outputs(tmp_path)
    first = start_gated(server, launcher, tmp_path)
    second = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA))
    pause = launcher.wait_message(second, lambda m: m["type"] == "pause_request")
    assert pause["reason"] == f"waiting for {output}"
    server.open_gate()
    assert_downloaded(launcher.finish(first), tmp_path)
    result = launcher.finish(second)
    # Resumed once the first was done, it found the output with its sha256: nothing to download.
    assert result["error"] is None and result["result"]["skipped"] is True
    assert [m["type"] for m in self_pauses(launcher, second)] == ["pause_request", "resume_request"]
    assert len(server.requests) == 1 and sorted(p.name for p in output.parent.iterdir()) == ["file.bin"]


def test_a_download_waiting_for_its_output_can_be_cancelled(
    server: FileServer, launcher: media.Launcher, tmp_path: Path
) -> None:
    first = start_gated(server, launcher, tmp_path)
    second = launcher.launch("DOWNLOAD", payload(server, tmp_path, sha256=DATA_SHA))
    launcher.wait_message(second, lambda m: m["type"] == "pause_request")
    second.request_cancel()
    assert launcher.finish(second)["error_type"] == models.CANCELLED
    server.open_gate()  # the first never noticed
    assert_downloaded(launcher.finish(first), tmp_path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"url": "ftp://example.org/x"}, "url must be an http(s) URL"),
        ({"url": None}, "url (an http or https URL) is required"),
        ({"output": "relative/file"}, "output must be an absolute path"),
        ({"sha256": "abc"}, "sha256 must be 64 hex digits"),
        ({"headers": {"Range": "bytes=0-"}}, "the Range header is managed by the executor"),
        ({"headers": {"X-A": "1\r\nX-B: 2"}}, "names and values must be one-line strings"),
        ({"size": -1}, "size must be a whole number of bytes"),
        ({"url": "http://[::1/x"}, "url is not a valid URL (Invalid IPv6 URL)"),
        ({"url": "http://127.0.0.1:99999/x"}, "url is not a valid URL (Port out of range"),
        ({"output": "~fredica-no-such-user/file.bin"}, "output: cannot expand the ~"),
        ({"output": "{tmp}/dl/file\0.bin"}, "output must not contain a NUL byte"),
        ({"output": "{tmp}/" + "a" * 300 + "/file.bin"}, "output is not a usable path (File name too long)"),
    ],
)
def test_bad_payloads(server: FileServer, tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    filled = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in bad.items()}
    task_payload = {**payload(server, tmp_path), **filled}
    result, _ = media.run_inline(DownloadExecutor(), task_payload)
    assert result.error_type == models.PAYLOAD_ERROR and message in (result.error or ""), result
    assert server.requests == []
    assert not DownloadExecutor().can_skip(media.make_task("DOWNLOAD", task_payload))  # does not raise


def test_can_skip_never_reads_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # can_skip runs in the supervisor's loop: hashing a large output there stalls the loop.
    output = tmp_path / "file.bin"
    executor = DownloadExecutor()

    def skip(**extra: Any) -> bool:
        return executor.can_skip(media.make_task("DOWNLOAD", {"url": "http://127.0.0.1:9/f", "output": str(output), **extra}))

    def no_hashing(*args: Any) -> str:
        raise AssertionError("can_skip hashed the output")

    monkeypatch.setattr("executors.download.sha256_of", no_hashing)
    assert not skip() and not skip(size=0)
    output.write_bytes(DATA)
    assert skip(size=SIZE)
    assert not skip()  # neither size nor sha256: execute asks the server whether it changed
    assert not skip(size=SIZE + 1) and not skip(sha256="bad")
    assert not skip(sha256=DATA_SHA) and not skip(sha256=DATA_SHA, size=SIZE)  # execute checks it
    # What the tasks that depend on a skipped download read, e.g. "{download.output}".
    task = media.make_task("DOWNLOAD", {"url": "http://127.0.0.1:9/f", "output": str(output)})
    assert executor.skipped_result(task) == {"output": str(output), "bytes": SIZE}


def test_an_output_with_the_expected_sha256_is_not_downloaded_again(server: FileServer, tmp_path: Path) -> None:
    output, part = outputs(tmp_path)
    output.parent.mkdir()
    output.write_bytes(DATA)
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, sha256=DATA_SHA, size=SIZE))
    assert result.result == {"output": str(output), "bytes": SIZE, "sha256": DATA_SHA, "skipped": True}, result
    assert server.requests == [] and output.read_bytes() == DATA and not part.exists()


@pytest.mark.parametrize("content", [DATA[::-1], DATA[:HALF]], ids=["other-content", "shorter"])
def test_an_output_that_does_not_match_is_downloaded_again(server: FileServer, tmp_path: Path, content: bytes) -> None:
    output, _ = outputs(tmp_path)
    output.parent.mkdir()
    output.write_bytes(content)
    result, _ = media.run_inline(DownloadExecutor(), payload(server, tmp_path, sha256=DATA_SHA))
    assert result.ok and "skipped" not in result.result, result
    assert server.ranges_requested() == [None] and output.read_bytes() == DATA


def test_end_to_end_through_the_supervisor(server: FileServer, tmp_path: Path) -> None:
    sup = media.start_supervisor(tmp_path)
    try:
        server.drop_at = [HALF]
        task_payload = payload(server, tmp_path, sha256=DATA_SHA)
        task = media.wait_ended(sup, media.submit(sup, "DOWNLOAD", task_payload))
        assert task.status is TaskStatus.COMPLETED and task.progress == 100
        assert task.result == {"output": task_payload["output"], "bytes": SIZE, "sha256": DATA_SHA}
        requests = len(server.requests)
        # With a sha256 the executor checks the existing output; with only a size, can_skip skips the task.
        again = media.wait_ended(sup, media.submit(sup, "DOWNLOAD", task_payload))
        assert again.status is TaskStatus.COMPLETED and again.result == {**task.result, "skipped": True}
        unverified = {**{k: v for k, v in task_payload.items() if k != "sha256"}, "size": SIZE}
        skipped = media.wait_ended(sup, media.submit(sup, "DOWNLOAD", unverified))
        assert skipped.status is TaskStatus.COMPLETED
        assert skipped.result == {"skipped": True, "output": task_payload["output"], "bytes": SIZE}
        assert len(server.requests) == requests
        missing_payload = payload(server, tmp_path, "/missing", output=str(tmp_path / "missing.bin"))
        missing = media.wait_ended(sup, media.submit(sup, "DOWNLOAD", missing_payload, max_retries=1))
        assert missing.status is TaskStatus.FAILED and missing.error_type == "HTTP_404" and missing.retry_count == 1
        assert os.path.getsize(task_payload["output"]) == SIZE
    finally:
        sup.stop(grace=0, timeout=20)
