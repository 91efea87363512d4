"""The built-in DOWNLOAD executor: HTTP(S) to a file, resumable, pausable, with progress.

Payload: `{"url": "http(s)://...", "output": "/abs/path"}`, optional `"sha256"` (hex), `"headers"`
(strings; not Range, which is ours), `"size"` (expected bytes, checked at the end and by `can_skip`),
`"stall_timeout"` (seconds without data before a connection counts as dropped; default 60).
Result: `{"output": path, "bytes": n, "sha256": hex}`, plus `"skipped": true` when the output was
already there (below).

- An output that already exists: `can_skip` runs in the supervisor's loop, so it never reads the
  file (hashing a large one would stall the loop) nor asks the network: without a sha256 it skips
  the task when the output exists with the payload's size; with a sha256 it does not skip, and
  `execute` hashes the existing output first: if it matches, the task ends at once without any
  request, else the file is downloaded again. With neither, `execute` asks the server whether the
  file changed, with the ETag and Last-Modified it gave last time (`executors.http_validators`,
  kept beside the output): a 304 keeps the output (`"skipped": true`), a 200 brings the new file,
  which replaces the output as any download does (`.part`, then a rename). An output with no such
  validators (its server sent none, or the file was changed since) is downloaded again: keeping
  it could keep a stale file for ever.

- The output is locked while the task writes it (`executors.output_lock`): a second task for it
  pauses itself, "waiting for <output>", until the first is done. Data goes to `<output>.part`
  (flock-ed too, against writers that skip the output's lock), renamed to `output` once complete
  and verified. An existing `.part` is resumed with `Range: bytes=N-`: after a dropped
  connection (reconnected inside the attempt, up to 5 times in a row without progress, waiting 0,
  0.5, 1, 2, 4 s), after a pause that closed the connection, on a retry or by a later task. A 200
  answer to a Range request restarts from byte 0; a 416 for a complete `.part` finishes it.
- Pause: reading stops between chunks; the connection is kept `pause_hold_seconds` (5 s: a quick
  pause costs nothing), then closed rather than pinned for a server that would time it out anyway;
  resume reconnects with Range.
- Cancel: stops at once (even a read blocked on a silent server) and leaves the `.part`, so a later
  task for the same output resumes rather than starts over. An empty `.part` is removed.

Errors, retryable per the SPEC unless noted: `NETWORK` (after the reconnects), `HTTP_<code>` (e.g.
`HTTP_404`; 408, 429 and 5xx are first retried inside the attempt, honouring a short Retry-After),
`AWAITING_CREDENTIAL` for 401/407 (never retried: only new credentials help), `CHECKSUM` (the `.part`
is deleted so a retry starts clean), `SIZE_MISMATCH`, `TLS_ERROR`, `OUTPUT_BUSY`, `IO_ERROR`,
`PAYLOAD_ERROR` (never retried), `CANCELLED`. A 404 is not a PAYLOAD_ERROR: the payload is well
formed and the file may not be published yet; `max_retries` bounds how long that is waited for.

Redirects are followed, but the payload's credentials stay with the origin it names: a redirect to
another scheme, host or port goes without Authorization, Cookie and Proxy-Authorization. A redirect
from https to http (or to anything but http(s)) is refused as a `PAYLOAD_ERROR`: no retry makes the
server stop asking for clear text, and only a payload naming the http URL itself should allow it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import http.client
import os
import re
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from daemon import models
from executors import _http, _process, http_validators, output_lock
from executors.base import ExecuteResult, TaskExecutor, check_keys

if TYPE_CHECKING:
    from daemon.models import Task
    from executors.base import TaskContext

CHUNK_SIZE = 64 * 1024
HASH_BLOCK = 1024 * 1024
PROGRESS_INTERVAL = 0.5  # at most this often a progress message whose percent did not change
RECONNECT_DELAYS = (0.0, 0.5, 1.0, 2.0, 4.0)  # one per consecutive failure without progress
MAX_RETRY_AFTER = 30.0
USER_AGENT = "fredica-worker DOWNLOAD (urllib)"
TRANSIENT_HTTP = frozenset({408, 429}) | frozenset(range(500, 600))
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class DownloadSpec:
    """A validated DOWNLOAD payload."""

    url: str
    output: Path
    sha256: str | None
    headers: dict[str, str]
    size: int | None
    stall_timeout: float

    @property
    def part(self) -> Path:
        """Where the data goes until it is complete."""
        return self.output.with_name(self.output.name + ".part")

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> DownloadSpec:
        """Check the payload; PayloadError says what is wrong."""
        url, output = payload.get("url"), payload.get("output")
        if not isinstance(url, str):
            raise _process.PayloadError("url (an http or https URL) is required")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 (a port out of range or not a number raises here)
        except ValueError as exc:
            raise _process.PayloadError(f"url is not a valid URL ({exc}): {url!r}") from None
        _require(parts.scheme in ("http", "https") and bool(parts.hostname),
                 f"url must be an http(s) URL with a host, not {url!r}")
        path = _process.output_path(output)
        sha256 = payload.get("sha256")
        _require(sha256 is None or (isinstance(sha256, str) and bool(_SHA256.fullmatch(sha256))),
                 "sha256 must be 64 hex digits")
        headers = payload.get("headers") or {}
        _require(isinstance(headers, Mapping), "headers must be an object of strings")
        for name, value in headers.items():
            one_line = isinstance(name, str) and isinstance(value, str) and not set(name + value) & set("\r\n\0")
            _require(one_line, f"header {name!r}: names and values must be one-line strings")
            _require(name.lower() != "range", "the Range header is managed by the executor (resume)")
        size = payload.get("size")
        _require(size is None or (type(size) is int and size >= 0), "size must be a whole number of bytes")
        stall = payload.get("stall_timeout", 60.0)
        _require(type(stall) in (int, float) and 0 < stall <= 3600,
                 "stall_timeout must be a number of seconds in (0, 3600]")
        return cls(url, path, sha256.lower() if sha256 else None, dict(headers), size, float(stall))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _process.PayloadError(message)


class _Failure(Exception):
    """A failed connection; `retry`: another connection may fix it (drop, stall, 5xx, 429...)."""

    def __init__(self, message: str, error_type: str = "NETWORK", *, retry: bool = True,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.error_type, self.retry, self.retry_after = error_type, retry, retry_after


class PartFile:
    """The locked `.part` file and the running sha256 of its content."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: another task has it
        except OSError:
            os.close(self.fd)
            raise
        self.size = 0
        self.hasher = hashlib.sha256()

    def load(self, ctx: TaskContext) -> bool:
        """Hash what earlier attempts wrote (new data is appended after it); False if cancelled."""
        loaded = _hash_blocks(lambda n: os.read(self.fd, n), self.hasher, ctx)
        if loaded is None:
            return False
        self.size += loaded
        return True

    def truncate(self) -> None:
        """Start over from byte 0."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.size = 0
        self.hasher = hashlib.sha256()

    def write(self, data: bytes) -> None:
        """Append `data` and hash it."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.hasher.update(data)
        self.size += len(data)

    def close(self, *, remove: bool) -> None:
        """Release the file (and its lock), deleting it first if `remove`."""
        if remove:  # while still locked, so it cannot be another task's new .part
            self.path.unlink(missing_ok=True)
        os.close(self.fd)


def _retry_after(headers: Any) -> float | None:
    """Retry-After in seconds (capped), or None; an HTTP-date there is rare and left to the backoff."""
    try:
        return min(max(float(headers.get("Retry-After")), 0.0), MAX_RETRY_AFTER)
    except (AttributeError, TypeError, ValueError):
        return None


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


class _Transfer:
    """One attempt: connections to the server until the `.part` holds the whole file."""

    def __init__(
        self, executor: DownloadExecutor, spec: DownloadSpec, part: PartFile, ctx: TaskContext
    ) -> None:
        self.executor = executor
        self.spec = spec
        self.part = part
        self.ctx = ctx
        self.total: int | None = None
        self.tracker = _http.SocketTracker()
        self.opener = _http.opener(spec.url, self.tracker)
        self._reported: tuple[int, float] = (-1, 0.0)
        self.conditional: dict[str, str] = {}  # If-None-Match etc., for a request from byte 0
        self.not_modified = False  # the server answered the conditional request with 304
        self.validators: tuple[str | None, str | None] = (None, None)  # ETag, Last-Modified of the file

    def run(self) -> ExecuteResult | None:
        """Download; None when the `.part` is complete, else the result to return."""
        failures = 0
        stop_watching = threading.Event()
        watcher = threading.Thread(target=self._watch_cancel, args=(stop_watching,), daemon=True)
        watcher.start()
        try:
            while True:
                if self.ctx.cancelled:
                    return _process.cancelled_result()
                before = self.part.size
                try:
                    if self._connection():
                        return None
                    continue  # closed for a long pause, or restarted from 0: reconnect now
                except _Failure as exc:
                    if self.ctx.cancelled:  # the failure is our own interrupt
                        return _process.cancelled_result()
                    if not exc.retry:
                        return ExecuteResult(error=str(exc), error_type=exc.error_type)
                    failures = 1 if self.part.size > before else failures + 1
                    if failures > len(RECONNECT_DELAYS):
                        return ExecuteResult(
                            error=f"giving up after {failures} failed connections: {exc}", error_type=exc.error_type
                        )
                    delay = max(RECONNECT_DELAYS[failures - 1], exc.retry_after or 0.0)
                    self.ctx.log.warning("download interrupted (%s); reconnecting in %.1f s", exc, delay)
                    if self.ctx.wait_cancelled(delay):
                        return _process.cancelled_result()
        finally:
            stop_watching.set()
            watcher.join()

    def _watch_cancel(self, stop: threading.Event) -> None:
        # A read blocked on a silent server would not see the cancel until the stall timeout.
        while not stop.is_set():
            if self.ctx.wait_cancelled(0.1):
                self.tracker.interrupt()
                return

    def _connection(self) -> bool:
        """One request and its body; True when the file is complete, False to reconnect at once."""
        offset = self.part.size
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **self.spec.headers}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        else:
            headers.update(self.conditional)
        request = urllib.request.Request(self.spec.url, headers=headers)
        try:
            response = self.opener.open(request, timeout=self.spec.stall_timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                return self._http_error(exc, offset)
        except _http.RedirectRefused as exc:
            raise _Failure(str(exc), models.PAYLOAD_ERROR, retry=False) from None
        except (http.client.InvalidURL, ValueError) as exc:
            raise _Failure(f"invalid url {self.spec.url!r}: {exc}", models.PAYLOAD_ERROR, retry=False) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise _Failure(f"TLS certificate verification failed: {exc.reason}", "TLS_ERROR", retry=False) from None
            raise _Failure(f"cannot connect: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Failure(f"cannot connect: {exc!r}") from None
        try:
            return self._body(response, offset)
        finally:
            self.tracker.forget()
            response.close()

    def _http_error(self, exc: urllib.error.HTTPError, offset: int) -> bool:
        if exc.code == 304 and self.conditional and not offset:
            self.not_modified = True
            return True
        if exc.code == 416 and offset:
            match = _UNSATISFIED_RANGE.match(exc.headers.get("Content-Range") or "")
            remote = int(match.group(1)) if match else None
            if remote is None or remote == offset:
                self.total = offset  # nothing beyond what we have: the .part is complete
                return True
            self.ctx.log.warning("the .part (%d bytes) does not fit the remote file (%d); restarting", offset, remote)
            self.part.truncate()
            return False
        reason = f"HTTP {exc.code} {exc.reason} for {self.spec.url}"
        if exc.code in (401, 407):
            raise _Failure(reason, models.AWAITING_CREDENTIAL, retry=False)
        transient = exc.code in TRANSIENT_HTTP
        raise _Failure(reason, f"HTTP_{exc.code}", retry=transient, retry_after=_retry_after(exc.headers))

    def _body(self, response: http.client.HTTPResponse, offset: int) -> bool:
        status = response.status
        if status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range") or "")
            if match is None or int(match.group(1)) != offset:
                self.part.truncate()
                raise _Failure(f"the server answered the range request with {response.headers.get('Content-Range')!r}")
            end: int | None = int(match.group(2)) + 1
            self.total = int(match.group(3)) if match.group(3) != "*" else None
        elif status == 200:
            if offset:
                self.ctx.log.info("the server ignored the Range request; downloading from byte 0")
                self.part.truncate()
            length = response.headers.get("Content-Length") or ""
            end = self.total = int(length) if length.isdigit() else None
        else:
            raise _Failure(f"unexpected HTTP status {status} {response.reason}", f"HTTP_{status}", retry=False)
        self.validators = http_validators.from_headers(response.headers)
        hold = self.executor.pause_hold_seconds
        while True:
            if self.ctx.cancelled:
                return False
            if not self.ctx.wait_if_paused(timeout=0):
                self._report(force=True, paused=True)
                if not self.ctx.wait_if_paused(timeout=hold):
                    self.ctx.log.info("paused for over %.0f s: closing the connection", hold)
                    self.tracker.forget()
                    response.close()
                    self.ctx.wait_if_paused()  # a cancel sets the resume Event too
                    self._report(force=True)
                    return False
                self._report(force=True)
                continue
            try:
                chunk = response.read1(CHUNK_SIZE)  # what has arrived: a slow server still shows progress
            except (OSError, http.client.HTTPException) as exc:
                raise _Failure(f"connection lost after {self.part.size} bytes: {exc!r}") from None
            if not chunk:
                break
            try:
                self.part.write(chunk)
            except OSError as exc:
                raise _Failure(f"cannot write {self.part.path}: {exc}", "IO_ERROR", retry=False) from None
            self._report()
        if end is not None and self.part.size < end:
            raise _Failure(f"connection closed after {self.part.size} of {end} bytes")
        # A server may answer an open range with only a piece of it: then ask for the rest.
        return self.total is None or self.part.size >= self.total

    def _report(self, force: bool = False, paused: bool = False) -> None:
        done, total = self.part.size, self.total
        percent = int(100 * done / total) if total else 0
        now = time.monotonic()
        last_percent, last_time = self._reported
        if not force and percent == last_percent and now - last_time < PROGRESS_INTERVAL:
            return
        self._reported = (percent, now)
        text = f"{_mib(done)} of {_mib(total)}" if total else _mib(done)
        self.ctx.progress(percent, f"paused at {text}" if paused else text)


class DownloadExecutor(TaskExecutor):
    """Downloads a URL to a file over HTTP(S): resumable, pausable, verified."""

    task_type = "DOWNLOAD"
    pausable = True
    pause_hold_seconds = 5.0  # a pause longer than this closes the connection
    payload_keys = ("url", "output", "sha256", "headers", "size", "stall_timeout")

    @classmethod
    def validate(cls, payload: Mapping[str, Any]) -> None:
        """The payload's keys and values."""
        check_keys(payload, cls.payload_keys)
        DownloadSpec.from_payload(payload)

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        """Download to `<output>.part`, verify, rename to `output`, holding the output's lock."""
        try:
            spec = DownloadSpec.from_payload(task.payload)
        except _process.PayloadError as exc:
            return _process.payload_error(exc)
        return output_lock.run_locked(spec.output, ctx, lambda: self._download(spec, ctx))

    def _download(self, spec: DownloadSpec, ctx: TaskContext) -> ExecuteResult:
        # After the lock: a task that waited for another one's download may find it done.
        if spec.sha256 is not None:
            done = _existing_output(spec, ctx)
            if done is not None:
                return done
        # Neither a sha256 nor a size to vouch for an existing output: ask its server (below).
        kept = http_validators.for_existing(spec.output, spec.url, ctx.log) if spec.sha256 is None and spec.size is None else None
        try:
            part = PartFile(spec.part)
        except BlockingIOError:
            return ExecuteResult(error=f"{spec.part} is locked by another process", error_type="OUTPUT_BUSY")
        except OSError as exc:
            return ExecuteResult(error=f"cannot open {spec.part}: {exc}", error_type="IO_ERROR")
        outcome: ExecuteResult | None = None
        renamed = False
        try:
            if not part.load(ctx):
                return _process.cancelled_result()
            if part.size:
                ctx.log.info("resuming from %d bytes already in %s", part.size, spec.part)
            transfer = _Transfer(self, spec, part, ctx)
            if kept is not None and not part.size:  # a .part is a newer download under way: resumed
                transfer.conditional = kept.conditional_headers()
            outcome = transfer.run()
            if outcome is None and transfer.not_modified and kept is not None:
                ctx.log.info("%s has not changed on the server (304): keeping it", spec.output)
                return ExecuteResult(result={"output": str(spec.output), "bytes": kept.size, "sha256": kept.sha256,
                                             "skipped": True})
            outcome = outcome or _verify(spec, part)
            if outcome is not None:
                return outcome
            os.fsync(part.fd)
            os.replace(spec.part, spec.output)  # still locked: nobody can touch it meanwhile
            renamed = True
            _fsync_dir(spec.output.parent)
            http_validators.keep(spec.output, spec.url, transfer.validators, part.hasher.hexdigest(), ctx.log)
            return ExecuteResult(
                result={"output": str(spec.output), "bytes": part.size, "sha256": part.hasher.hexdigest()}
            )
        except OSError as exc:
            return ExecuteResult(error=f"{spec.part}: {exc}", error_type="IO_ERROR")
        finally:
            # A corrupt or foreign .part goes, so the next attempt starts clean; so does an empty one.
            corrupt = outcome is not None and outcome.error_type in ("CHECKSUM", "SIZE_MISMATCH")
            part.close(remove=not renamed and (corrupt or part.size == 0))

    def can_skip(self, task: Task) -> bool:
        """True when the output exists with the payload's size and there is no sha256.

        It runs in the supervisor's loop, so it never reads the file nor asks the server: a sha256
        is checked by `execute`, in the executor's process, which then ends at once if the output
        matches; with neither a sha256 nor a size, `execute` asks the server whether it changed.
        """
        try:
            spec = DownloadSpec.from_payload(task.payload)
        except _process.PayloadError:
            return False  # execute reports the problem
        if spec.sha256 is not None or spec.size is None:
            return False
        try:
            info = spec.output.stat()
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_size == spec.size

    def skipped_result(self, task: Task) -> dict[str, Any]:
        """What a skipped download's dependents read: its output, and its size."""
        spec = DownloadSpec.from_payload(task.payload)
        return {"output": str(spec.output), "bytes": spec.output.stat().st_size}


def _existing_output(spec: DownloadSpec, ctx: TaskContext) -> ExecuteResult | None:
    """The result when the output already is the payload's file (size and sha256), else None."""
    try:
        info = spec.output.stat()
        if not stat.S_ISREG(info.st_mode) or (spec.size is not None and info.st_size != spec.size):
            return None
        ctx.progress(0, f"checking the existing {_mib(info.st_size)}")
        digest = sha256_of(spec.output, ctx)
    except OSError:
        return None  # unreadable: the download writes it anew
    if digest is None:
        return _process.cancelled_result()
    if digest != spec.sha256:
        ctx.log.info("%s exists but its sha256 is %s: downloading it again", spec.output, digest)
        return None
    ctx.log.info("%s already has the expected sha256: nothing to download", spec.output)
    return ExecuteResult(
        result={"output": str(spec.output), "bytes": info.st_size, "sha256": digest, "skipped": True}
    )


def _verify(spec: DownloadSpec, part: PartFile) -> ExecuteResult | None:
    """The error if the complete `.part` is not what the payload expects, else None."""
    digest = part.hasher.hexdigest()
    if spec.size is not None and part.size != spec.size:
        return ExecuteResult(error=f"got {part.size} bytes, expected {spec.size}", error_type="SIZE_MISMATCH")
    if spec.sha256 is not None and digest != spec.sha256:
        return ExecuteResult(error=f"sha256 mismatch: got {digest}, expected {spec.sha256}", error_type="CHECKSUM")
    return None


def sha256_of(path: Path, ctx: TaskContext) -> str | None:
    """The hex sha256 of a file's content; None if the task is cancelled meanwhile."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        return None if _hash_blocks(f.read, hasher, ctx) is None else hasher.hexdigest()


def _hash_blocks(read: Callable[[int], bytes], hasher: Any, ctx: TaskContext) -> int | None:
    """Feed `hasher` what `read` gives, a block at a time, to the end; how many bytes, or None if
    the task is cancelled meanwhile (a large file takes a while)."""
    total = 0
    while block := read(HASH_BLOCK):
        if ctx.cancelled:
            return None
        hasher.update(block)
        total += len(block)
    return total


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory is synced; not every filesystem allows it.
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
