"""DOWNLOAD of an output that already exists, with neither a sha256 nor a size (issue 14 point 13):
it asks its server "changed since?" with the ETag / Last-Modified kept from the last download. A
real HTTP server on 127.0.0.1 (in a thread of the test) changes its file between two downloads, or
answers 304; one sends no validators at all."""

from __future__ import annotations

import http.server
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from executors import http_validators
from executors.download import DownloadExecutor
from tests import media
from tests.test_download import FileServer

FIRST = b"first version\n" * 5000
SECOND = b"second version, longer\n" * 5000


class ChangingServer(FileServer):
    """Serves `content` at /file.bin with the validators named in `send` ("etag", "last_modified"),
    each changed whenever the content is; answers a matching conditional request with 304."""

    def __init__(self, send: tuple[str, ...]) -> None:
        super().__init__()
        self.send = send
        self.asked: list[dict[str, str]] = []  # each request's headers, names in lower case
        self.answers: list[int] = []
        self.version = 0
        self.content = FIRST

    def change(self, content: bytes) -> None:
        self.content, self.version = content, self.version + 1

    def validators(self) -> dict[str, str]:
        found = {}
        if "etag" in self.send:
            found["ETag"] = f'"v{self.version}"'
        if "last_modified" in self.send:
            found["Last-Modified"] = f"Mon, 0{self.version + 1} Jun 2025 10:00:00 GMT"
        return found

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        headers = {name.lower(): value for name, value in h.headers.items()}
        self.asked.append(headers)
        current = self.validators()
        unchanged = (
            ("if-none-match" in headers and headers["if-none-match"] == current.get("ETag"))
            or ("if-none-match" not in headers and "if-modified-since" in headers
                and headers["if-modified-since"] == current.get("Last-Modified"))
        )
        code, body = (304, b"") if unchanged else (200, self.content)
        self.answers.append(code)
        h.send_response(code)
        for name, value in current.items():
            h.send_header(name, value)
        if code == 200:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


@pytest.fixture
def serve() -> Iterator[Any]:
    made: list[ChangingServer] = []

    def make(*send: str) -> ChangingServer:
        made.append(ChangingServer(send))
        return made[-1]

    yield make
    for server in made:
        server.close()


def download(server: ChangingServer, output: Path) -> dict[str, Any]:
    """A DOWNLOAD's result, as the supervisor gets it: `can_skip` first (in its loop), then
    `execute` (here in this process)."""
    executor, payload = DownloadExecutor(), {"url": server.url(), "output": str(output)}
    if executor.can_skip(media.make_task("DOWNLOAD", payload)):
        return {"skipped": True, "by": "can_skip"}
    result, _ = media.run_inline(executor, payload)
    assert result.error is None, result
    return result.result


@pytest.mark.parametrize("send", [("etag",), ("last_modified",), ("etag", "last_modified")])
def test_a_file_changed_on_the_server_is_fetched_again_and_replaces_the_output(
    serve: Any, tmp_path: Path, send: tuple[str, ...]
) -> None:
    server, output = serve(*send), tmp_path / "file"
    download(server, output)
    server.change(SECOND)

    result = download(server, output)

    assert result == {"output": str(output), "bytes": len(SECOND), "sha256": media.sha256(SECOND)}
    assert output.read_bytes() == SECOND and server.answers == [200, 200]
    asked = server.asked[1]
    assert asked.get("if-none-match") == ('"v0"' if "etag" in send else None)
    assert asked.get("if-modified-since") == ("Mon, 01 Jun 2025 10:00:00 GMT" if "last_modified" in send else None)
    kept = json.loads(http_validators.sidecar(output).read_text())
    assert kept["etag"] == ('"v1"' if "etag" in send else None) and kept["sha256"] == media.sha256(SECOND)


@pytest.mark.parametrize("send", [("etag",), ("last_modified",)])
def test_a_304_keeps_the_output_without_a_byte_of_it_sent(serve: Any, tmp_path: Path, send: tuple[str, ...]) -> None:
    server, output = serve(*send), tmp_path / "file"
    first = download(server, output)
    before = output.stat()

    result = download(server, output)

    assert server.answers == [200, 304]
    assert result == {**first, "skipped": True}
    assert output.read_bytes() == FIRST and output.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == [".file.validators", "file"]  # no .part left


def test_a_server_without_validators_gets_the_file_fetched_again_every_time(serve: Any, tmp_path: Path) -> None:
    server, output = serve(), tmp_path / "file"
    download(server, output)
    server.change(SECOND)

    download(server, output)

    assert output.read_bytes() == SECOND and server.answers == [200, 200]
    assert not {"if-none-match", "if-modified-since"} & set(server.asked[1])
    assert not http_validators.sidecar(output).exists()


def test_an_output_changed_since_its_download_is_not_vouched_for_by_old_validators(
    serve: Any, tmp_path: Path
) -> None:
    server, output = serve("etag"), tmp_path / "file"
    download(server, output)
    output.write_bytes(b"edited by hand")  # the server's file is still the same: a 304 would keep this

    download(server, output)

    assert "if-none-match" not in server.asked[1] and output.read_bytes() == FIRST


def test_validators_given_for_another_url_are_not_used(serve: Any, tmp_path: Path) -> None:
    one, other, output = serve("etag"), serve("etag"), tmp_path / "file"
    download(one, output)

    download(other, output)

    assert "if-none-match" not in other.asked[0] and other.answers == [200]
