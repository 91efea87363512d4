"""The public Python client of the daemon, which the CLI uses too; and the reader of the daemon's
log files, which live on the same machine (the daemon says where).

    from daemon.client import Client

    with Client() as fredica:                      # the config as `fredica` finds it
        task_id = fredica.submit("SHELL", {"argv": ["true"]}, priority=5)
        [task] = fredica.wait(task_id, timeout=60)

A `Client` keeps one connection to the daemon's control socket open between calls. A refusal is
raised as the `daemon.errors` class the daemon raised, with its message.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from daemon import errors, models, protocol
from daemon.errors import DaemonNotRunning, DaemonUnreachable, RemoteError  # noqa: F401 (their old home: the CLI's and scripts')
from executors import tasklog

_START_HINT = "start it with `fredica daemon`"
CONNECT_RETRY = 0.02  # seconds between connects while the daemon's listen backlog is full
# The fields `submit` takes beside type and payload: those of a task object (batch lines also
# have `key` and `id`, which name tasks within one submission).
SUBMIT_FIELDS = protocol.TASK_FIELDS - {"type", "payload", "key", "id"}


class Client:
    """Talks to the daemon's control socket over one connection, kept open between calls.

    `config`: the config file that names the socket, found as `fredica` finds it when omitted
    (`$FREDICA_CONFIG`, `~/.config/fredica/config.toml`, `/etc/fredica/config.toml`); or
    `socket_path` names the socket itself. Safe to share between threads (calls take turns).
    """

    # Longer than the daemon lets a request wait for its loop (engine.requests.CALL_TIMEOUT): a busy
    # daemon then answers "nothing was done" before the client gives up.
    def __init__(self, config: str | Path | None = None, *, socket_path: str | Path | None = None,
                 timeout: float = 30.0) -> None:
        if socket_path is None:
            from daemon import config as config_file  # not at import: `fredica status` is timed

            socket_path = config_file.load_for_client(config).socket
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._frames = protocol.FrameReader(protocol.MAX_REPLY)
        self._turn = threading.Lock()

    # --- the operations -------------------------------------------------------------------------

    def submit(self, type: str, payload: Mapping[str, Any] | None = None, **fields: Any) -> str:
        """Submit one task (its own run) and return its id; with an idempotency key that an active
        task holds, that task's id. `fields` as `fredica submit`'s options: priority, depends_on
        (an id or a list of ids), max_retries, idempotency_key, material_id, timeout, queue, and
        hold (True: stored held, claimed only once released)."""
        _check_fields(fields)
        spec: dict[str, Any] = {"type": type, **fields}
        if payload is not None:
            spec["payload"] = dict(payload)
        if isinstance(spec.get("depends_on"), str):
            spec["depends_on"] = [spec["depends_on"]]
        material = {} if fields.get("material_id") is None else {"material_id": fields["material_id"]}
        reply: protocol.SubmitReply = self.call("submit", tasks=[spec], **material)
        return reply["tasks"][0]["id"]

    def submit_batch(self, lines: Iterable[Mapping[str, Any] | str]) -> list[str]:
        """Submit many tasks as one run, atomically; their ids in order. Each line is a task object
        (or its JSON text) as in `fredica submit --batch`: `type` and the optional fields, `key`
        and `depends_on` naming earlier lines' keys or ids."""
        specs = []
        for number, line in enumerate(lines, 1):
            if isinstance(line, str):
                try:
                    line = json.loads(line)
                except ValueError as exc:
                    raise errors.SubmissionRefused(f"batch line {number} is not valid JSON: {exc}") from None
            if not isinstance(line, Mapping):
                raise errors.SubmissionRefused(f"batch line {number} is not a JSON object")
            specs.append(dict(line))
        if not specs:
            raise errors.SubmissionRefused("the batch has no tasks")
        reply: protocol.SubmitReply = self.call("submit", tasks=specs)
        return [task["id"] for task in reply["tasks"]]

    def run(self, template: str, *, material_id: str | None = None, **params: str) -> str | None:
        """Start a workflow run from a configured template; its id (None when every task of it was
        already active, by idempotency key). `params` are the template's parameters."""
        reply: protocol.SubmitReply = self.call("run", template=template, material_id=material_id, params=params)
        return reply["run_id"]

    def get(self, id: str) -> dict[str, Any]:
        """One task or workflow run in full: the object of `fredica show --json`."""
        reply: protocol.ShowReply = self.call("show", id=id)
        return reply["object"]

    def list(self, **filters: Any) -> list[dict[str, Any]]:
        """Tasks in submission order, in one reply; filters: status (one or a list), run, type,
        limit. `stream("ls_pages", ...)` reads them as `fredica ls --json` does: newest first (or
        `sort=`), `since=` a Unix time, a page at a time."""
        return self.call("ls", **filters)

    def stream(self, op: str, **args: Any) -> Streamed:
        """A streamed operation's items (`protocol.Operation.streams`: `ls_pages`), read a frame at
        a time as they are iterated, so that a listing of any length costs one page of memory.
        The connection is this stream's until it is read to its end (or closed, which drops it)."""
        operation, frame = self._request(op, args)
        if not operation.streams:
            raise protocol.ProtocolError(f"{op} is not a streamed operation: call() it")
        streamed = Streamed()
        streamed.pages = self._pages(frame, operation, streamed)
        return streamed

    def status(self) -> dict[str, Any]:
        """The daemon's health, as `fredica status --json`."""
        return self.call("status")

    def cancel(self, *ids: str, **selectors: Any) -> list[protocol.Result]:
        """Cancel each task, or every unfinished task of each run; or, by `selectors` (run,
        status, type), every task they all match. One result per task (`"ok"`, `"message"`; a
        task's `"dependents"` count); see `act` for refusals."""
        return self.act("cancel", *ids, **selectors)

    def retry(self, *ids: str, **selectors: Any) -> list[protocol.Result]:
        """Run failed or cancelled tasks again as new tasks, with the tasks their failure cancelled
        (`fredica retry`), named by ids or by `selectors` (run, status, type): a result per task,
        in order (`ok`, `message`, and `new_id`, `run_id`, `copies` for a copy). A refused id is
        a result with `ok` False, not an exception."""
        reply: protocol.ResultsReply = self.call("retry", **({"ids": list(ids)} if ids else {}), **selectors)
        return reply["results"]

    def pause(self, id: str) -> dict[str, Any]:
        """Pause a running, pausable task; the task as it is then (`act("pause", ...)` for many)."""
        self.act("pause", id)
        return self.get(id)

    def resume(self, id: str) -> dict[str, Any]:
        """Resume a paused task; the task as it is then (`act("resume", ...)` for many)."""
        self.act("resume", id)
        return self.get(id)

    def hold(self, *ids: str, **selectors: Any) -> list[protocol.Result]:
        """Hold each waiting task (never claimed until released); see `act`."""
        return self.act("hold", *ids, **selectors)

    def release(self, *ids: str, **selectors: Any) -> list[protocol.Result]:
        """Release each held task; see `act`."""
        return self.act("release", *ids, **selectors)

    def priority(self, priority: int, *ids: str, **selectors: Any) -> list[protocol.Result]:
        """Give each waiting task `priority`, which the next claim honours; see `act`."""
        return self.act("priority", *ids, priority=priority, **selectors)

    def act(self, op: str, *ids: str, **args: Any) -> list[protocol.Result]:
        """An acting operation (cancel, pause, resume, hold, release, priority) on `ids`, or on the
        tasks that the selectors `run`, `status` and `type` all match: one result per task, in
        order. Every task is acted on; if any was refused, the first refusal is raised then, as
        its `daemon.errors` class, with every result in its `results`."""
        reply: protocol.ResultsReply = self.call(op, **({"ids": list(ids)} if ids else {}), **args)
        results = reply["results"]
        for result in results:
            if not result["ok"]:
                known = errors.by_kind(result.get("kind", "")) or errors.FredicaError
                error = known.from_wire(result["message"])
                error.results = results  # type: ignore[attr-defined]
                raise error
        return results

    def wait(self, *ids: str, timeout: float | None = None) -> list[dict[str, Any]]:
        """Block until every task named (a run's id names its tasks) has ended; the tasks then.
        The daemon waits on its side, woken by its commits: no polling. Raises WaitTimedOut,
        which holds the tasks as they were, when `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            reply: protocol.WaitReply = self.call("wait", ids=list(ids), timeout=left)
            if reply["ended"]:
                return reply["tasks"]
            if deadline is not None and time.monotonic() >= deadline:
                active = [task["id"] for task in reply["tasks"] if task["status"] in models.ACTIVE_STATUSES]
                raise errors.WaitTimedOut(
                    f"{len(active)} of {len(reply['tasks'])} tasks still active after {timeout:g}s", reply["tasks"])

    def clean(self, older_than: float, *, status: str | None = None, dry_run: bool = False) -> protocol.CleanReply:
        """Remove the workflow runs finished more than `older_than` seconds ago (only those of
        `status`, if given) with their tasks, logs and restart-log entries; what was removed (or,
        `dry_run`, would be). The daemon answers every few seconds: asked again until it is done."""
        total: protocol.CleanReply = {"runs": 0, "tasks": 0, "logs": 0, "done": False}
        while not total["done"]:
            reply: protocol.CleanReply = self.call("clean", older_than=older_than, status=status, dry_run=dry_run)
            total = {"runs": total["runs"] + reply["runs"], "tasks": total["tasks"] + reply["tasks"],
                     "logs": total["logs"] + reply["logs"], "done": reply["done"]}
        return total

    # --- the connection -------------------------------------------------------------------------

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return the data of its reply.

        Checked first against the protocol's table (ProtocolError, nothing sent), and refused
        before connecting if it cannot be sent: over the size limit (FrameTooLarge), or with a
        string that is not text (NotText). Raises DaemonUnreachable when nothing answers, and the
        daemon's own error class when it refuses.
        """
        operation, frame = self._request(op, args)
        if operation.streams:  # all of it, joined (`stream` reads it a page at a time)
            return [item for item in self.stream(op, **args)]
        with self._turn:
            return _unwrap(self._exchange(frame, operation))

    @staticmethod
    def _request(op: str, args: Mapping[str, Any]) -> tuple[protocol.Operation, bytes]:
        operation = protocol.OPERATIONS.get(op)
        if operation is None:
            raise protocol.ProtocolError(f"unknown request {protocol.shown(op)}")
        operation.check(args)
        try:
            return operation, protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST)
        except protocol.NotText:
            # Said of the arguments the caller gave, not of the frame built around them.
            raise protocol.NotText(f"{op} not sent: {protocol.non_text(args)} ({protocol.NOT_TEXT})") from None

    def _pages(self, frame: bytes, operation: protocol.Operation, streamed: Streamed) -> Iterator[list[Any]]:
        """Each page of a streamed reply as its frame arrives; the last frame's other keys into
        `streamed.final`. A stream left before its end leaves frames unread: the connection goes."""
        with self._turn:
            ended = False
            try:
                data = _unwrap(self._exchange(frame, operation))
                while True:
                    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
                        raise protocol.ProtocolError("the daemon's reply is malformed: a page without items")
                    yield data["items"]
                    if not data.get("more"):
                        ended = True
                        streamed.final = {key: value for key, value in data.items() if key not in ("items", "more")}
                        return
                    data = _unwrap(self._next_frame(operation))
            finally:
                if not ended:
                    self._disconnect()

    def _next_frame(self, operation: protocol.Operation) -> dict[str, Any]:
        """The next frame of a streamed reply under way."""
        assert self._sock is not None
        try:
            return protocol.read_frame(self._sock, protocol.MAX_REPLY, self._frames)
        except TimeoutError:
            self._disconnect()
            raise DaemonUnreachable(self._maybe_done(operation, f"stopped answering for {self.timeout:g}s")) from None
        except (protocol.ConnectionClosed, ConnectionResetError, BrokenPipeError):
            self._disconnect()
            raise DaemonUnreachable(self._maybe_done(operation, "closed the connection in the middle of a reply")) from None
        except protocol.ProtocolError as exc:
            self._disconnect()
            raise protocol.ProtocolError(f"the daemon's reply is malformed: {exc.message}") from None

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        with self._turn:
            self._disconnect()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _exchange(self, frame: bytes, operation: protocol.Operation) -> dict[str, Any]:
        reused = self._sock is not None and self._still_open()
        if not reused:
            self._connect()
        assert self._sock is not None
        try:
            try:
                self._sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # Closed by the daemon (idle too long) just now: it never read this request.
                self._connect()
                self._sock.sendall(frame)
            return protocol.read_frame(self._sock, protocol.MAX_REPLY, self._frames)
        except TimeoutError:
            self._disconnect()  # a late reply must not be taken for the next call's
            raise DaemonUnreachable(self._maybe_done(operation, f"did not answer within {self.timeout:g}s")) from None
        except (protocol.ConnectionClosed, ConnectionResetError, BrokenPipeError):
            self._disconnect()
            if reused and not operation.writes:
                return self._exchange(frame, operation)  # a read, asked again: harmless
            raise DaemonUnreachable(self._maybe_done(operation, "closed the connection without a reply")) from None
        except protocol.ProtocolError as exc:
            self._disconnect()
            raise protocol.ProtocolError(f"the daemon's reply is malformed: {exc.message}") from None

    def _maybe_done(self, operation: protocol.Operation, what: str) -> str:
        said = f"the daemon at {self.socket_path} {what}"
        # Never sent again: a write whose reply was lost may have been done, or not.
        return f"{said}: the {operation.name} may or may not have been done" if operation.writes else said

    def _still_open(self) -> bool:
        """Whether the kept connection is still usable: not if the daemon has closed it (it reads
        as ready, at its end) or sent something unasked."""
        assert self._sock is not None
        if select.select([self._sock], [], [], 0)[0]:
            self._disconnect()
            return False
        return True

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._frames = protocol.FrameReader(protocol.MAX_REPLY)

    def _connect(self) -> None:
        self._disconnect()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        path = self.socket_path
        try:
            self._connect_once_there_is_room(sock)
        except FileNotFoundError:
            sock.close()
            raise DaemonNotRunning(f"no daemon socket at {path}: the daemon is not running ({_START_HINT})") from None
        except ConnectionRefusedError:
            sock.close()
            raise DaemonNotRunning(
                f"nothing is listening on {path}: the daemon is not running ({_START_HINT})") from None
        except PermissionError:
            problem = f"permission denied on {path}: the daemon answers only the user that runs it"
        except TimeoutError:
            problem = f"the daemon at {path} did not accept a connection within {self.timeout:g}s"
        except OSError as exc:
            problem = f"cannot connect to the daemon at {path}: {exc.strerror or exc}"
        else:
            self._sock = sock
            return
        sock.close()
        raise DaemonUnreachable(problem)

    def _connect_once_there_is_room(self, sock: socket.socket) -> None:
        """connect(), again while the daemon's listen backlog is full: a socket with a timeout gets
        EAGAIN then, where a blocking one would have waited (TimeoutError after `timeout`)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock.connect(str(self.socket_path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError from None
                time.sleep(CONNECT_RETRY)


class Streamed:
    """The items of a streamed reply, iterated as they arrive; `final` holds what its last frame
    says besides them (`total`), once iterated to the end."""

    def __init__(self) -> None:
        self.pages: Iterator[list[Any]] = iter(())
        self.final: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        for page in self.pages:
            yield from page

    def close(self) -> None:
        """Stop reading (the rest of the reply is dropped with the connection)."""
        close = getattr(self.pages, "close", None)
        if close is not None:
            close()


def _check_fields(fields: Mapping[str, Any]) -> None:
    unknown = sorted(set(fields) - SUBMIT_FIELDS)
    if not unknown:
        return
    raise TypeError(f"submit() got an unexpected field {', '.join(map(repr, unknown))} "
                    f"(it takes {', '.join(sorted(SUBMIT_FIELDS))})")


def _unwrap(reply: dict[str, Any]) -> Any:
    """The data of an ok reply; a refusal raised as the daemon's error class."""
    if reply.get("v") != protocol.VERSION:
        raise protocol.ProtocolError(
            f"the daemon speaks protocol version {reply.get('v')!r}, this client {protocol.VERSION}")
    if reply.get("ok") is True:
        return reply.get("data")
    error = reply.get("error")
    if reply.get("ok") is False and isinstance(error, dict):
        kind, message = str(error.get("kind") or "Error"), str(error.get("message") or "")
        known = errors.by_kind(kind)
        if known is None:
            raise RemoteError(kind, message or None)
        raise known.from_wire(message) if message else known()
    raise protocol.ProtocolError("the daemon's reply is malformed: neither ok nor error")


class LogFile:
    """A log file read from its end, then followed across rotation and truncation. Rotated by
    renaming (the daemon's log: a new file at the path), or by copying to `<path>.1` and
    truncating (a task's log, `executors.tasklog`): either way `<path>.1` holds what came before,
    and is read too."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rotated = Path(tasklog.rotated(str(path)))
        self.handle: Any = None
        self.partial = b""
        self._rotated_seen: tuple[int, ...] | None = None  # `rotated` as it was when last looked at

    def _open(self) -> bool:
        try:
            self.handle = open(self.path, "rb")
        except FileNotFoundError:
            return False
        self._rotated_seen = _identity(self.rotated)
        return True

    def last(self, count: int, keep_partial: bool) -> list[str] | None:
        """The last `count` lines (None when there is no file yet); the position stays at the end.
        Those the file lacks come from the end of `<path>.1`.

        With keep_partial an unfinished last line is held back, to be completed while following.
        """
        if not self._open():
            return None
        lines, fragment = _last_lines(self.handle, count)
        if fragment and keep_partial:
            self.partial = fragment
        elif fragment:
            lines.append(fragment)
        if len(lines) < count:
            try:
                with open(self.rotated, "rb") as older:
                    earlier, fragment = _last_lines(older, count - len(lines))
            except FileNotFoundError:
                earlier, fragment = [], b""
            lines = earlier + ([fragment] if fragment else []) + lines
        return [_decode(line) for line in lines[-count:]] if count else []

    def follow(
        self,
        emit: Callable[[str], None],
        still_active: Callable[[], bool] | None,
        *,
        poll: float = 0.2,
        recheck: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Emit lines as they are appended, looking every `poll` seconds; return once
        `still_active` (asked every `recheck` seconds) says no, or never when it is None."""
        next_check = time.monotonic() + recheck
        while True:
            self._read_new(emit)
            if still_active is not None and time.monotonic() >= next_check:
                if not still_active():
                    # The task has ended, so its log is complete: print the rest and stop.
                    self._read_new(emit)
                    self._flush(emit)
                    return
                next_check = time.monotonic() + recheck
            sleep(poll)

    def _read_new(self, emit: Callable[[str], None]) -> None:
        if self.handle is None and not self._open():
            return
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            on_disk = None  # rotated away and not yet recreated: keep reading the old file
        if on_disk is not None:
            ours = os.fstat(self.handle.fileno())
            if (on_disk.st_ino, on_disk.st_dev) != (ours.st_ino, ours.st_dev):
                self._drain(emit)
                self._flush(emit)
                self.handle.close()
                self.handle = None
                if not self._open():
                    return
            elif (rotated := _identity(self.rotated)) != self._rotated_seen:
                self._rotated_seen = rotated
                # Copied there, not renamed there (halfway through the daemon log's renames, our
                # file may be about to become `<path>.1`, or just have).
                if rotated is not None and rotated[:2] != (ours.st_ino, ours.st_dev):
                    self._read_rotated(emit)
                    self.handle.seek(0)
            elif on_disk.st_size < self.handle.tell():
                self._flush(emit)
                self.handle.seek(0)
        self._drain(emit)

    def _read_rotated(self, emit: Callable[[str], None]) -> None:
        """The file was copied to `<path>.1` and truncated: what followed our position is there."""
        position = self.handle.tell()
        try:
            with open(self.rotated, "rb") as older:
                head = older.readline()
                left_out = tasklog.dropped(head)
                if left_out is None:
                    older.seek(position)
                elif position >= left_out:  # only the end was kept, after a line that says so
                    older.seek(len(head) + position - left_out)
                else:  # we were behind what was kept: what is left starts with that line
                    self._flush(emit)
                    older.seek(0)
                self._drain(emit, older)
        except FileNotFoundError:
            pass
        self._flush(emit)

    def _drain(self, emit: Callable[[str], None], handle: Any = None) -> None:
        while chunk := (handle or self.handle).read(1 << 16):
            *lines, self.partial = (self.partial + chunk).split(b"\n")
            for line in lines:
                emit(_decode(line))

    def _flush(self, emit: Callable[[str], None]) -> None:
        if self.partial:
            emit(_decode(self.partial))
            self.partial = b""

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _last_lines(handle: Any, count: int) -> tuple[list[bytes], bytes]:
    """The last `count` whole lines of an open file, and the unfinished line after them (b"" if
    the file ends with a newline); the file is left positioned at its end."""
    end = handle.seek(0, os.SEEK_END)
    data, start = b"", end
    while start > 0 and count > 0 and data.rstrip(b"\n").count(b"\n") < count:
        step = min(1 << 16, start)
        start -= step
        handle.seek(start)
        data = handle.read(step) + data
    handle.seek(end)
    lines = data.split(b"\n")
    fragment = lines.pop()
    return (lines[-count:] if count else []), fragment


def _identity(path: Path) -> tuple[int, ...] | None:
    """Tells one file at `path` from the next one put there (None: no file)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return (found.st_ino, found.st_dev, found.st_mtime_ns)


def _decode(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")
