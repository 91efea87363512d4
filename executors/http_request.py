"""The built-in HTTP_REQUEST executor: one HTTP(S) request on asyncio streams, an event-loop
executor (SPEC §15: many requests wait on one loop, in one process).

Payload: `{"url": "http(s)://host[:port]/path?query"}`, optional `"method"` (default GET),
`"headers"` (an object of one-line strings; Host, Content-Length, Transfer-Encoding and Connection
are the executor's), `"body"` (text, sent as UTF-8), `"timeout"` (seconds for the whole request,
time spent paused not counted; default 30, at most 3600), `"output"` (an absolute file path: the
body is saved there, through `<output>.part`, instead of returned) and `"max_body_bytes"` (how much
of the body the result holds; default 256 KiB).

Result: `{"status": 200, "reason": "OK", "headers": {lower-case name: value, repeated ones joined
by ", "}, "bytes": n}` and either `"body"` (the body as UTF-8 text, undecodable bytes replaced)
with `"truncated"` (true if the body went past `max_body_bytes`: the rest is not read), or
`"output"` (its path). Redirects are not followed: a 3xx is a result, with its `location` header.

Errors: `HTTP_<code>` for a 4xx or 5xx answer (retryable per the SPEC), but `AWAITING_CREDENTIAL`
for 401 and 407 (never retried: only new credentials help); `NETWORK` (no connection, a connection
dropped, an answer that is not HTTP); `TLS_ERROR` (https: a handshake or certificate that fails;
certificates are checked against the system's CAs); `REQUEST_TIMEOUT`; `IO_ERROR` (the output);
`PAYLOAD_ERROR` (never retried); `CANCELLED`.

- Progress: while a body with a Content-Length arrives, its percent.
- Cancel: stops at once (the request is cancelled and its connection closed, wherever it waits);
  a `.part` is removed.
- Pause: honoured between two reads of the body (the connection is kept; the server just sees a
  slow reader) and before the request is sent; not while connecting or waiting for the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import ssl
import urllib.parse
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping

from daemon import models
from executors import _process
from executors.base import ExecuteResult, TaskExecutor, check_keys

if TYPE_CHECKING:
    from daemon.models import Task
    from executors.base import AsyncTaskContext

CHUNK_SIZE = 64 * 1024
DEFAULT_TIMEOUT = 30.0
DEFAULT_BODY_BYTES = 256 * 1024
MAX_HEAD_BYTES = 64 * 1024  # status line and headers of an answer, at most
USER_AGENT = "fredica-worker HTTP_REQUEST (asyncio)"
OURS = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # lower case
_METHOD = re.compile(r"[A-Z]{1,20}")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: (.*))?\r?\n")


class BadAnswer(Exception):
    """What the server sent is not an HTTP/1.x answer."""


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """A validated HTTP_REQUEST payload."""

    method: str
    url: str
    https: bool
    host: str
    port: int
    authority: str  # the Host header
    target: str  # path and query
    headers: dict[str, str]
    body: bytes | None
    timeout: float
    output: Path | None
    max_body_bytes: int

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> RequestSpec:
        """Check the payload; PayloadError says what is wrong."""
        url = payload.get("url")
        _require(isinstance(url, str), "url (an http or https URL) is required")
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise _process.PayloadError(f"url is not a valid URL ({exc}): {url!r}") from None
        _require(parts.scheme in ("http", "https") and bool(parts.hostname), f"url must be an http(s) URL with a host, not {url!r}")
        _require(parts.username is None, "url must not hold credentials: send them in an Authorization header")
        _require(not set(url) & set(" \r\n\0"), "url must not contain spaces or line breaks")
        method = payload.get("method", "GET")
        _require(isinstance(method, str) and bool(_METHOD.fullmatch(method.upper())), f"method must be an HTTP method name, not {method!r}")
        headers = payload.get("headers") or {}
        _require(isinstance(headers, Mapping), "headers must be an object of strings")
        for name, value in headers.items():
            one_line = isinstance(name, str) and isinstance(value, str) and not set(name + value) & set("\r\n\0")
            _require(one_line and bool(name) and ":" not in name, f"header {name!r}: names and values must be one-line strings")
            _require(name.lower() not in OURS, f"the {name} header is the executor's")
        body = payload.get("body")
        _require(body is None or isinstance(body, str), "body must be text")
        timeout = payload.get("timeout", DEFAULT_TIMEOUT)
        _require(type(timeout) in (int, float) and 0 < timeout <= 3600, "timeout must be a number of seconds in (0, 3600]")
        output = payload.get("output")
        path = None if output is None else _process.output_path(output)
        limit = payload.get("max_body_bytes", DEFAULT_BODY_BYTES)
        _require(type(limit) is int and 0 <= limit <= 64 * 1024 * 1024, "max_body_bytes must be a whole number of bytes")
        https = parts.scheme == "https"
        host = parts.hostname or ""
        authority = parts.netloc
        return cls(
            method=method.upper(), url=url, https=https, host=host, port=port or (443 if https else 80),
            authority=authority, target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            headers=dict(headers), body=None if body is None else body.encode("utf-8", "surrogateescape"),
            timeout=float(timeout), output=path, max_body_bytes=limit,
        )

    def request(self) -> bytes:
        """The request as it goes on the wire."""
        given = {name.lower() for name in self.headers}
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {self.authority}"]
        lines += [] if "user-agent" in given else [f"User-Agent: {USER_AGENT}"]
        lines += [] if "accept-encoding" in given else ["Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        if self.body is not None or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body or b'')}")
        lines.append("Connection: close")  # the body then ends, at the latest, with the connection
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + (self.body or b"")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _process.PayloadError(message)


class HttpRequestExecutor(TaskExecutor):
    """One HTTP(S) request on asyncio, many at once in one process; pausable, cancellable."""

    task_type = "HTTP_REQUEST"
    pausable = True
    payload_keys = ("url", "method", "headers", "body", "timeout", "output", "max_body_bytes")

    @classmethod
    def validate(cls, payload: Mapping[str, Any]) -> None:
        """The payload's keys and values."""
        check_keys(payload, cls.payload_keys)
        RequestSpec.from_payload(payload)

    async def execute(self, task: Task, ctx: AsyncTaskContext) -> ExecuteResult:  # type: ignore[override]
        """Send the request and read the answer, until it is done or the task is cancelled."""
        try:
            spec = RequestSpec.from_payload(task.payload)
        except _process.PayloadError as exc:
            return _process.payload_error(exc)
        exchange = asyncio.ensure_future(Exchange(spec, ctx).run())
        cancel = asyncio.ensure_future(ctx.wait_cancelled())
        try:
            await asyncio.wait({exchange, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this coroutine itself is cancelled: nothing is left running
            cancel.cancel()
            if not exchange.done():
                exchange.cancel()
                await asyncio.wait({exchange})
        if exchange.cancelled():
            return _process.cancelled_result()
        return exchange.result()


class Exchange:
    """One request and its answer."""

    def __init__(self, spec: RequestSpec, ctx: AsyncTaskContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self._deadline: asyncio.Timeout | None = None

    async def run(self) -> ExecuteResult:
        """The task's result: the answer, or the error that stopped it."""
        spec = self.spec
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(spec.timeout) as self._deadline:
                await self._wait_if_paused()
                reader, writer = await asyncio.open_connection(
                    spec.host, spec.port, ssl=ssl.create_default_context() if spec.https else None,
                    limit=MAX_HEAD_BYTES,
                )
                writer.write(spec.request())
                await writer.drain()
                return await self._answer(reader)
        except TimeoutError:  # before OSError: it is one
            return ExecuteResult(error=f"no complete answer within {spec.timeout:g} s from {spec.url}", error_type="REQUEST_TIMEOUT")
        except ssl.SSLError as exc:  # before OSError: it is one
            return ExecuteResult(error=f"{spec.url}: TLS: {exc}", error_type="TLS_ERROR")
        except (OSError, EOFError, BadAnswer, ValueError) as exc:  # ValueError: asyncio's line limit
            return ExecuteResult(error=f"{spec.url}: {type(exc).__name__}: {exc}", error_type="NETWORK")
        finally:
            if writer is not None:
                writer.close()  # not awaited: a cancel stops at once

    async def _answer(self, reader: asyncio.StreamReader) -> ExecuteResult:
        status, reason, headers = await _head(reader)
        while 100 <= status < 200:  # an interim answer (we send no Expect, but a server may)
            status, reason, headers = await _head(reader)
        spec = self.spec
        if status >= 400:
            text = (await reader.read(500)).decode("utf-8", "replace")
            error_type = models.AWAITING_CREDENTIAL if status in (401, 407) else f"HTTP_{status}"
            return ExecuteResult(error=f"{spec.method} {spec.url}: {status} {reason}: {text}".rstrip(": "), error_type=error_type)
        no_body = spec.method == "HEAD" or status in (204, 304)
        result: dict[str, Any] = {"status": status, "reason": reason, "headers": headers}
        if spec.output is None:
            kept = bytearray()
            count = 0 if no_body else await self._body(reader, headers, kept, None)
            body = bytes(kept[: spec.max_body_bytes]).decode("utf-8", "replace")
            truncated = count > spec.max_body_bytes
            return ExecuteResult(result={**result, "body": body, "truncated": truncated, "bytes": min(count, spec.max_body_bytes)})
        return await self._save(reader, headers, result, no_body)

    async def _save(self, reader: asyncio.StreamReader, headers: dict[str, str], result: dict[str, Any], no_body: bool) -> ExecuteResult:
        output = self.spec.output
        assert output is not None
        part = output.with_name(output.name + ".part")
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            file = open(part, "wb")
        except OSError as exc:
            return ExecuteResult(error=f"cannot write {part}: {exc}", error_type="IO_ERROR")
        done = False
        try:
            with file:
                count = 0 if no_body else await self._body(reader, headers, None, file)
            os.replace(part, output)
            done = True
        except OSError as exc:
            if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
                raise
            return ExecuteResult(error=f"cannot write {output}: {exc}", error_type="IO_ERROR")
        finally:
            if not done:
                with contextlib.suppress(OSError):
                    part.unlink()
        return ExecuteResult(result={**result, "output": str(output), "bytes": count})

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str], kept: bytearray | None, file: IO[bytes] | None) -> int:
        """Read the body into `kept` (up to one byte past max_body_bytes, then stop) or `file`;
        the bytes read."""
        length = headers.get("content-length")
        total = int(length) if length is not None and length.isdigit() else None
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        count = 0
        async for data in _chunks(reader, total, chunked):
            if file is not None:
                file.write(data)
            else:
                assert kept is not None
                kept += data
            count += len(data)
            if total:
                self.ctx.progress(100 * count / total)
            if kept is not None and count > self.spec.max_body_bytes:
                break
            await self._wait_if_paused()
        return count

    async def _wait_if_paused(self) -> None:
        """Wait while paused; the timeout does not run meanwhile."""
        if await self.ctx.wait_if_paused(timeout=0):
            return
        loop = asyncio.get_running_loop()
        paused_at = loop.time()
        await self.ctx.wait_if_paused()
        if self._deadline is not None and self._deadline.when() is not None:
            self._deadline.reschedule(self._deadline.when() + loop.time() - paused_at)


async def _head(reader: asyncio.StreamReader) -> tuple[int, str, dict[str, str]]:
    """The status, reason and headers of an answer."""
    match = _STATUS_LINE.fullmatch(await reader.readline())
    if match is None:
        raise BadAnswer("the answer does not start with an HTTP/1.x status line")
    headers: dict[str, str] = {}
    size = 0
    while True:
        line = await reader.readline()
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise BadAnswer(f"the answer's headers take more than {MAX_HEAD_BYTES} bytes")
        if line in (b"\r\n", b"\n"):
            break
        if not line.endswith(b"\n"):
            raise EOFError("the connection ended inside the answer's headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise BadAnswer(f"not a header line: {line[:100]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(match.group(1)), (match.group(2) or b"").decode("latin-1").strip(), headers


async def _chunks(reader: asyncio.StreamReader, total: int | None, chunked: bool) -> Any:
    """The body's bytes as they arrive: chunked, `total` bytes, or up to the end of the connection."""
    if chunked:
        while True:
            size_line = await reader.readline()
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadAnswer(f"not a chunk size: {size_line[:100]!r}") from None
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            while size:
                data = await reader.read(min(size, CHUNK_SIZE))
                if not data:
                    raise EOFError("the connection ended inside a chunk")
                size -= len(data)
                yield data
            await reader.readline()
    elif total is not None:
        left = total
        while left:
            data = await reader.read(min(left, CHUNK_SIZE))
            if not data:
                raise EOFError(f"the connection ended {left} bytes before the end of the body")
            left -= len(data)
            yield data
    else:
        while data := await reader.read(CHUNK_SIZE):
            yield data
