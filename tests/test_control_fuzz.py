"""Hostile frames against the real daemon's control socket (SPEC §13): every frame gets a reply or
a closed connection, never silence; nothing a refused request names is changed; nothing reaches
SQLite that it cannot bind (an internal error is a bug of ours, and fails here).

Hypothesis writes the frames: raw bytes with any header, and requests of every shape (an `op` or
`args` of any JSON type, argument names and values of any type, strings with lone surrogates,
batches whose last task can never be stored). A few hundred examples, a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import protocol
from tests.daemon_harness import Daemon

EXAMPLES = int(os.environ.get("FREDICA_FUZZ_EXAMPLES", "250"))
MISSING_ID = str(uuid.UUID(int=1))  # names no task: a batch that depends on it is refused whole
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Text with everything in it: lone surrogates (from `\ud800` escapes), NULs, newlines, emoji.
TEXT = st.text(st.characters(exclude_categories=()) | st.sampled_from(["\ud800", "\udfff", "\x00", "\n", "😀"]),
               max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
ARGUMENT_NAMES = sorted(set().union(*(o.arguments for o in protocol.OPERATIONS.values())))
SPEC_FIELDS = ["type", "payload", "priority", "depends_on", "max_retries", "idempotency_key",
               "material_id", "timeout", "key", "id"]


def body_of(message: Any, ascii_only: bool, raw_surrogates: bool) -> bytes:
    """A message as a frame body: escaped (`\\ud800`), in UTF-8, or with surrogates encoded as
    bytes (which strict UTF-8 refuses)."""
    text = json.dumps(message, ensure_ascii=ascii_only, allow_nan=False)
    return text.encode("utf-8", "surrogatepass" if raw_surrogates else "backslashreplace")


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(protocol.HEADER, "big") + body


@st.composite
def task_specs(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(SPEC_FIELDS) | TEXT, max_size=5, unique=True))
    spec = {name: draw(JSON | st.sampled_from(["ECHO", MISSING_ID, "x"]) | st.integers(-5, 5)) for name in fields}
    if draw(st.booleans()):
        spec["type"] = "ECHO"
    return spec


@st.composite
def requests(draw: st.DrawFn, ids: list[str]) -> dict[str, Any]:
    """A request of any shape; a `submit` is never one that could be stored."""
    known = draw(st.integers(0, 4)) > 0
    op = draw(st.sampled_from(sorted(protocol.OPERATIONS))) if known else draw(JSON)
    if draw(st.integers(0, 9)) == 0:
        args: Any = draw(JSON)
    else:
        # Mostly the op's own argument names, so that most requests reach its handler.
        own = sorted(protocol.OPERATIONS[op].arguments) if known else []
        anything = st.sampled_from(ARGUMENT_NAMES) | TEXT
        names = st.sampled_from(own) if own and draw(st.integers(0, 4)) > 0 else anything
        values = st.sampled_from(ids + ["pending", "completed", "adhoc", MISSING_ID]) | st.integers(-3, 3) | JSON
        args = draw(st.dictionaries(names, values, max_size=4))
        if op == "submit" and draw(st.booleans()):
            args["tasks"] = draw(st.lists(task_specs(), max_size=3))
    if op == "submit" and isinstance(args, dict) and isinstance(args.get("tasks"), list):
        # Whatever comes before, a last task that depends on nothing there is: the batch is
        # refused whole, so the task table must stay as it was.
        args["tasks"].append({"type": "ECHO", "depends_on": [MISSING_ID]})
    version = 1 if draw(st.integers(0, 4)) > 0 else draw(st.sampled_from([2, True, 1.0, "1", None]))
    message: dict[str, Any] = {"v": version, "op": op, "args": args}
    if draw(st.integers(0, 9)) == 0:
        del message[draw(st.sampled_from(["v", "op", "args"]))]
    return message


@st.composite
def raw_frames(draw: st.DrawFn) -> bytes:
    """Bytes that may or may not be a frame: any header, any body, cut anywhere."""
    body = draw(st.binary(max_size=64) | st.just(b'{"v": 1, "op": "status"}'))
    sizes = st.sampled_from([len(body), len(body) + 1, 0, protocol.MAX_REQUEST + 1, 2**32 - 1]) | st.integers(0, 200)
    size = draw(sizes)
    data = size.to_bytes(protocol.HEADER, "big") + body
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


def exchange(path: Path, data: bytes, half_close: bool) -> dict[str, Any] | None:
    """Send `data`; the reply, or None if the daemon closed the connection without one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)  # far longer than the daemon's request_timeout: silence fails here
        sock.connect(str(path))
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered early (a frame too large) and closed: its reply is still to be read
        first = sock.recv(1)
        if not first:
            return None
        return protocol.read_frame(_Prefixed(first, sock), protocol.MAX_REPLY)  # type: ignore[arg-type]


class _Prefixed:
    """A socket whose first byte was already read."""

    def __init__(self, first: bytes, sock: socket.socket) -> None:
        self.pending, self.sock = first, sock

    def recv(self, size: int) -> bytes:
        if self.pending:
            data, self.pending = self.pending[:size], self.pending[size:]
            return data
        return self.sock.recv(size)


def check_reply(reply: dict[str, Any] | None, sent: bytes) -> None:
    if reply is None:
        assert sent == b"", "only a connection that sent nothing is closed without a reply"
        return
    assert reply["v"] == protocol.VERSION and reply["ok"] in (True, False), reply
    if not reply["ok"]:
        error = reply["error"]
        assert error["kind"] != "InternalError", error  # a refusal, not a bug of ours
        assert error["message"] and "\n" not in error["message"], error
        error["message"].encode()  # text, whatever the request held


def tables(d: Daemon) -> tuple[Any, ...]:
    return d.data("ls"), d.data("runs"), d.data("restarts", all=True)


def test_every_frame_gets_a_reply_or_a_close_and_refusals_change_nothing(daemons) -> None:
    d = daemons().start()
    done = d.wait_task(d.submit("ECHO", payload={"x": 1}), "completed")
    ids = [done["id"], done["workflow_run_id"]]
    before = tables(d)

    @FUZZ_SETTINGS
    @given(message=requests(ids), ascii_only=st.booleans(), raw_surrogates=st.booleans(), half_close=st.booleans())
    def shaped(message: dict[str, Any], ascii_only: bool, raw_surrogates: bool, half_close: bool) -> None:
        data = frame(body_of(message, ascii_only, raw_surrogates))
        reply = exchange(d.socket, data, half_close)
        check_reply(reply, data)

    @FUZZ_SETTINGS
    @given(data=raw_frames())
    def raw(data: bytes) -> None:
        check_reply(exchange(d.socket, data, half_close=True), data)

    shaped()
    raw()
    assert tables(d) == before
    assert d.process.poll() is None
    bugs = ("request_failed", "client_failed", "control_socket_failed", "request_thread_failed")
    failures = [e for e in d.log_events() if e.get("event") in bugs]
    assert not failures, failures
    assert "Traceback" not in d.output.read_text()
