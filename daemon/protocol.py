"""The control-socket protocol: length-framed JSON requests and replies, versioned and bounded.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (an object).

Request: ``{"v": 1, "op": "<name>", "args": {...}}``
Reply:   ``{"v": 1, "ok": true, "data": ...}`` or
         ``{"v": 1, "ok": false, "error": {"kind": "<ErrorClass>", "message": "<one line>"}}``

Requests are small (a batch submission is the largest), so they are capped at `MAX_REQUEST`;
replies may carry many tasks and are capped at `MAX_REPLY`. Every string in a message is text:
JSON lets a `\\ud800` escape name half a character, which no UTF-8 encoder (SQLite's, a
terminal's) accepts, so such a message is refused whole, on either side, naming where it is.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Mapping

from daemon.errors import FredicaError

VERSION = 1
HEADER = 4
MAX_REQUEST = 4 * 1024 * 1024
MAX_REPLY = 256 * 1024 * 1024
_SHOWN = 40  # characters of a bad value quoted in an error
NOT_TEXT = "undecodable bytes, or a lone surrogate like \\ud800"  # what a string that is not text holds

# Every request type the daemon answers, with the argument names it accepts.
OPERATIONS: dict[str, frozenset[str]] = {
    "status": frozenset(),
    "submit": frozenset({"tasks", "template", "material_id"}),
    "run": frozenset({"template", "material_id", "params"}),
    "ls": frozenset({"status", "run", "type", "limit"}),
    "runs": frozenset({"status", "limit"}),
    "show": frozenset({"id"}),
    "cancel": frozenset({"id"}),
    "pause": frozenset({"id"}),
    "resume": frozenset({"id"}),
    "log_path": frozenset({"id"}),
    "restarts": frozenset({"all"}),
    "restarts_dismiss": frozenset({"id"}),
    "restarts_recreate": frozenset({"id"}),
    "queues": frozenset(),
    "queue_pause": frozenset({"name"}),
    "queue_resume": frozenset({"name"}),
    "queue_workers": frozenset({"name", "workers"}),
}


class ProtocolError(FredicaError):
    """The message does not follow the control protocol."""


class FrameTooLarge(ProtocolError):
    """The message is larger than the protocol allows."""


class ConnectionClosed(ProtocolError):
    """The other side closed the connection before a whole message arrived."""


class NotText(ProtocolError):
    """A string of the message is not text: undecodable bytes (as Python keeps them from a command
    line) or a lone surrogate, neither of which UTF-8 can carry."""


def shown(value: str) -> str:
    """`value` quoted for an error line: short, and in ASCII, so that whatever it holds (a lone
    surrogate, a newline) can always be printed."""
    return json.dumps(value if len(value) <= _SHOWN else value[: _SHOWN - 3] + "...")


def described(value: Any) -> str:
    """A value of any JSON type, for an error line: a short quote of a string or a number, the
    kind of anything larger (which may be huge, or too deep to write out again)."""
    if isinstance(value, str):
        return shown(value)
    if value is None or isinstance(value, (bool, int, float)):
        return shown(json.dumps(value))[1:-1]
    return "a list" if isinstance(value, (list, tuple)) else "an object"


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _member(path: str, key: Any) -> str:
    key = str(key)
    name = f".{key}" if key.isidentifier() else f"[{shown(key)}]"
    return (path + name).lstrip(".")


def non_text(value: Any, root: str = "") -> str | None:
    """Where in a JSON value (named `root`) the first string that is not text is, said in one
    phrase (`args.tasks[0].payload.url is not text: "\\udcff"`), or None if all of them are."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:  # depth first, in document order; no recursion (a deep value is no error here)
        item, path = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return f"{path or 'the value'} is not text: {shown(item)}"
        elif isinstance(item, Mapping):
            for key in item:
                if isinstance(key, str) and not _is_text(key):
                    return f"the name {shown(key)}{' in ' + path if path else ''} is not text"
            stack.extend((child, _member(path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{index}]") for index, child in reversed(list(enumerate(item))))
    return None


def encode(message: Mapping[str, Any], limit: int) -> bytes:
    """The frame of `message`; a ProtocolError (NotText, FrameTooLarge) if it cannot be sent."""
    try:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise NotText(f"{non_text(message)} ({NOT_TEXT})") from None
    except ValueError as exc:  # NaN or infinity, which JSON has no spelling for
        raise ProtocolError(f"message is not JSON: {exc}") from None
    if len(body) > limit:
        raise FrameTooLarge(f"message of {len(body)} bytes is over the {limit} byte limit")
    return len(body).to_bytes(HEADER, "big") + body


def frame_size(header: bytes, limit: int) -> int:
    """The body size a frame's header announces; FrameTooLarge over `limit`."""
    size = int.from_bytes(header, "big")
    if size > limit:
        raise FrameTooLarge(f"message of {size} bytes is over the {limit} byte limit")
    return size


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(body: bytes) -> dict[str, Any]:
    """The message a frame's body holds; ProtocolError if it is not UTF-8 JSON text, an object."""
    try:
        text = body.decode()  # strictly UTF-8: json.loads would also guess UTF-16 and UTF-32
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"message is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        message = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ProtocolError(f"message is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("message is nested too deeply") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    if "\\ud" in text or "\\uD" in text:  # an escape of a surrogate may be there: look closer
        where = non_text(message)
        if where is not None:
            raise NotText(f"{where} (a lone surrogate escape)")
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionClosed(f"connection closed with {remaining} of {size} bytes missing")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, limit: int) -> dict[str, Any]:
    """Read one frame from a blocking socket; ProtocolError if it is truncated, too large or not
    a JSON object of text."""
    size = frame_size(_read_exactly(sock, HEADER), limit)
    return decode(_read_exactly(sock, size))


class FrameReader:
    """One frame assembled from the pieces a non-blocking socket gives: `feed` them as they come."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.received = bytearray()
        self.size: int | None = None  # the body's, once the header is in

    def feed(self, data: bytes) -> bytes | None:
        """The body once it is whole (bytes past it are ignored); FrameTooLarge from the header."""
        self.received += data
        if self.size is None and len(self.received) >= HEADER:
            self.size = frame_size(bytes(self.received[:HEADER]), self.limit)
        if self.size is not None and len(self.received) >= HEADER + self.size:
            return bytes(self.received[HEADER : HEADER + self.size])
        return None

    def missing(self) -> str:
        """What is still to come, for the error that says the rest never did."""
        if self.size is None:
            return f"{HEADER - len(self.received)} of the {HEADER} header bytes missing"
        return f"{HEADER + self.size - len(self.received)} of {self.size} bytes missing"


def write_frame(sock: socket.socket, message: Mapping[str, Any], limit: int) -> None:
    sock.sendall(encode(message, limit))


def request(op: str, **args: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, "args": args}


def parse_request(message: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(op, args) of a well-formed request; ProtocolError naming what is wrong otherwise."""
    version = message.get("v")
    # type(): JSON's true is Python's 1, and 1.0 equals it too; neither is a version.
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"unsupported protocol version {described(version)} (this daemon speaks {VERSION})")
    op = message.get("op")
    if not isinstance(op, str) or op not in OPERATIONS:
        raise ProtocolError(f"unknown request {described(op)}")
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object")
    unknown = sorted(set(args) - OPERATIONS[op])
    if unknown:
        raise ProtocolError(f"{op} does not take {', '.join(shown(name) for name in unknown)}")
    return op, args


def ok(data: Any) -> dict[str, Any]:
    return {"v": VERSION, "ok": True, "data": data}


def error(kind: str, message: str) -> dict[str, Any]:
    # One line: the CLI prints it as is.
    return {"v": VERSION, "ok": False, "error": {"kind": kind, "message": " ".join(message.split())}}
