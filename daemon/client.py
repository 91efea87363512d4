"""The blocking client the CLI uses: one request, one reply, one connection per call; and the
reader of the daemon's log files, which live on the same machine (the daemon says where)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from daemon import protocol
from daemon.errors import FredicaError
from executors import tasklog

_START_HINT = "start it with `fredica daemon`"
CONNECT_RETRY = 0.02  # seconds between connects while the daemon's listen backlog is full


class DaemonUnreachable(FredicaError):
    """The daemon is not running or does not answer."""


class RemoteError(FredicaError):
    """The daemon refused the request."""

    def __init__(self, kind: str, message: str | None = None) -> None:
        self.kind = kind
        super().__init__(message)


class Client:
    """Talks to the daemon's control socket; each `call` opens its own connection."""

    # Longer than the daemon lets a request wait for its loop (supervisor.CALL_TIMEOUT): a busy
    # daemon then answers "nothing was done" before the client gives up.
    def __init__(self, socket_path: str | Path, timeout: float = 30.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return the data of its reply.

        Raises DaemonUnreachable when nothing answers, RemoteError when the daemon refuses, and
        protocol.ProtocolError (before connecting) for a request that cannot be sent: over the
        size limit (FrameTooLarge), or with a string that is not text (NotText).
        """
        try:
            frame = protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST)
        except protocol.NotText:
            # Said of the arguments the caller gave, not of the frame built around them.
            raise protocol.NotText(f"{op} not sent: {protocol.non_text(args)} ({protocol.NOT_TEXT})") from None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            self._connect(sock)
            reply = self._exchange(sock, frame)
        return _unwrap(reply)

    def _connect(self, sock: socket.socket) -> None:
        path = self.socket_path
        try:
            self._connect_once_there_is_room(sock)
        except FileNotFoundError:
            problem = f"no daemon socket at {path}: the daemon is not running ({_START_HINT})"
        except ConnectionRefusedError:
            problem = f"nothing is listening on {path}: the daemon is not running ({_START_HINT})"
        except PermissionError:
            problem = f"permission denied on {path}: the daemon answers only the user that runs it"
        except TimeoutError:
            problem = f"the daemon at {path} did not accept a connection within {self.timeout:g}s"
        except OSError as exc:
            problem = f"cannot connect to the daemon at {path}: {exc.strerror or exc}"
        else:
            return
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

    def _exchange(self, sock: socket.socket, frame: bytes) -> dict[str, Any]:
        path = self.socket_path
        try:
            sock.sendall(frame)
            return protocol.read_frame(sock, protocol.MAX_REPLY)
        except TimeoutError:
            raise DaemonUnreachable(f"the daemon at {path} did not answer within {self.timeout:g}s") from None
        except (protocol.ConnectionClosed, ConnectionResetError, BrokenPipeError):
            raise DaemonUnreachable(f"the daemon at {path} closed the connection without a reply") from None
        except protocol.ProtocolError as exc:
            raise RemoteError("ProtocolError", f"the daemon's reply is malformed: {exc.message}") from None


def _unwrap(reply: dict[str, Any]) -> Any:
    if reply.get("v") != protocol.VERSION:
        raise RemoteError(
            "ProtocolError",
            f"the daemon speaks protocol version {reply.get('v')!r}, this client {protocol.VERSION}",
        )
    if reply.get("ok") is True:
        return reply.get("data")
    error = reply.get("error")
    if reply.get("ok") is False and isinstance(error, dict):
        raise RemoteError(str(error.get("kind") or "Error"), str(error.get("message") or "") or None)
    raise RemoteError("ProtocolError", "the daemon's reply is malformed: neither ok nor error")


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
