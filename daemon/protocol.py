"""The control-socket protocol: length-framed JSON requests and replies, versioned and bounded.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (an object).

Request: ``{"v": 1, "op": "<name>", "args": {...}}``
Reply:   ``{"v": 1, "ok": true, "data": ...}`` or
         ``{"v": 1, "ok": false, "error": {"kind": "<ErrorClass>", "message": "<one line>"}}``

Requests are small (a batch submission is the largest), so they are capped at `MAX_REQUEST`;
replies may carry many tasks and are capped at `MAX_REPLY`.
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
}


class ProtocolError(FredicaError):
    """The message does not follow the control protocol."""


class FrameTooLarge(ProtocolError):
    """The message is larger than the protocol allows."""


class ConnectionClosed(ProtocolError):
    """The other side closed the connection before a whole message arrived."""


def encode(message: Mapping[str, Any], limit: int) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if len(body) > limit:
        raise FrameTooLarge(f"message of {len(body)} bytes is over the {limit} byte limit")
    return len(body).to_bytes(HEADER, "big") + body


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
    """Read one frame; ProtocolError if it is truncated, too large or not a JSON object."""
    header = _read_exactly(sock, HEADER)
    size = int.from_bytes(header, "big")
    if size > limit:
        raise FrameTooLarge(f"message of {size} bytes is over the {limit} byte limit")
    body = _read_exactly(sock, size)
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"message is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("message is nested too deeply") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    return message


def write_frame(sock: socket.socket, message: Mapping[str, Any], limit: int) -> None:
    sock.sendall(encode(message, limit))


def request(op: str, **args: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, "args": args}


def parse_request(message: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(op, args) of a well-formed request; ProtocolError naming what is wrong otherwise."""
    if message.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {message.get('v')!r} (this daemon speaks {VERSION})")
    op = message.get("op")
    if op not in OPERATIONS:
        raise ProtocolError(f"unknown request {op!r}")
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object")
    unknown = sorted(set(args) - OPERATIONS[op])
    if unknown:
        raise ProtocolError(f"{op} does not take {', '.join(unknown)}")
    return op, args


def ok(data: Any) -> dict[str, Any]:
    return {"v": VERSION, "ok": True, "data": data}


def error(kind: str, message: str) -> dict[str, Any]:
    # One line: the CLI prints it as is.
    return {"v": VERSION, "ok": False, "error": {"kind": kind, "message": " ".join(message.split())}}
