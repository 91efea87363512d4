"""The control-socket protocol: length-framed JSON requests and replies, versioned and bounded.

A frame (`executors.framing`) is a 4-byte big-endian length followed by that many bytes of UTF-8
JSON (an object).

Request: ``{"v": 1, "op": "<name>", "args": {...}}``
Reply:   ``{"v": 1, "ok": true, "data": ...}`` or
         ``{"v": 1, "ok": false, "error": {"kind": "<ErrorClass>", "message": "<one line>"}}``

Requests are small (a batch submission is the largest), so they are capped at `MAX_REQUEST`;
replies may carry many tasks and are capped at `MAX_REPLY`. A streamed operation
(`Operation.streams`: `ls_pages`) answers with a sequence of ok frames whose data is a page,
``{"items": [...], "more": true}``, the last one without `more` and with what is known only at the
end (`total`); an error frame ends it early. Neither side then holds more than a page. Every string in a message is text:
JSON lets a `\\ud800` escape name half a character, which no UTF-8 encoder (SQLite's, a
terminal's) accepts, so such a message is refused whole, on either side, naming where it is.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from typing import Any, Callable, Iterator, Mapping, TypedDict

from executors import framing

from daemon.errors import ProtocolError, FrameTooLarge, ConnectionClosed, NotText  # noqa: F401 (re-exported: this module's errors live in the catalogue)

VERSION = 1
HEADER = framing.HEADER
MAX_REQUEST = 4 * 1024 * 1024
MAX_REPLY = 256 * 1024 * 1024
READ_SIZE = 1 << 18  # bytes asked of the socket at once
_SHOWN = 40  # characters of a bad value quoted in an error
NOT_TEXT = "undecodable bytes, or a lone surrogate like \\ud800"  # what a string that is not text holds

# The fields a task object of a `submit` request may have (`daemon.submission` checks them).
TASK_FIELDS = frozenset(
    {"id", "key", "type", "payload", "priority", "depends_on", "max_retries", "idempotency_key", "material_id",
     "timeout", "queue", "hold"}
)


def _integer(value: Any) -> bool:
    # bool is an int in Python, and SQLite binds only 64-bit integers.
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


# The JSON types an argument may be declared as, each with its test.
JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda value: isinstance(value, str),
    "int": _integer,
    "float": lambda value: _integer(value) or isinstance(value, float),
    "bool": lambda value: isinstance(value, bool),
    "None": lambda value: value is None,
    "list[str]": lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value),
    "Any": lambda value: True,  # checked by the handler itself (a submission's task objects)
}


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of a request: the JSON types it may have, and whether it must be there."""

    types: str  # "str | None": names of JSON_TYPES joined by "|", as the error says it
    required: bool = False

    def accepts(self, value: Any) -> bool:
        return any(JSON_TYPES[name.strip()](value) for name in self.types.split("|"))


@dataclasses.dataclass(frozen=True)
class Operation:
    """One request type: its arguments, whether the supervisor's loop must run it (a write), and
    whether its reply is a stream of pages (`Pages`)."""

    name: str
    arguments: Mapping[str, Argument]
    writes: bool = False
    streams: bool = False
    # An acting operation (`daemon.bulk`): by selectors it may reach 50,000 tasks, which its
    # handler hands to the loop a chunk at a time, so that the loop goes on between chunks.
    bulk: bool = False

    def runs_on_loop(self, args: Mapping[str, Any]) -> bool:
        """Whether the whole request may run on the loop thread, handed over as it is: a write,
        unless it is a bulk one naming its targets by selectors (ids are bounded by the size of
        a request the loop takes whole)."""
        return self.writes and not (self.bulk and not args.get("ids"))

    def check(self, args: Mapping[str, Any]) -> None:
        """Refuse an unknown or missing argument, or one of the wrong JSON type, in one line."""
        unknown = sorted(set(args) - set(self.arguments))
        if unknown:
            raise ProtocolError(f"{self.name} does not take {', '.join(shown(name) for name in unknown)}")
        for name, argument in self.arguments.items():
            if name not in args:
                if argument.required:
                    raise ProtocolError(f"bad arguments for {self.name}: {name} is required")
            elif not argument.accepts(args[name]):
                raise ProtocolError(
                    f"bad arguments for {self.name}: {name} must be {argument.types}, not {described(args[name])}"
                )


def _operation(op: str, /, writes: bool = False, bulk: bool = False, streams: bool = False, **arguments: Argument
               ) -> tuple[str, Operation]:
    # `op` positional-only: an argument may be called `name` (a queue's).
    return op, Operation(op, arguments, writes or bulk, streams, bulk)


_ID = Argument("str", required=True)
# What every acting operation takes (`daemon.bulk`): ids, or selectors that all must match. It
# replies with a ResultsReply.
_BULK = {"ids": Argument("list[str]"), "run": Argument("str | None"), "status": Argument("str | list[str] | None"),
         "type": Argument("str | None")}
# The restart log's: entry ids (as text, a number each), or every entry awaiting review, or a run's.
_ENTRIES = {"ids": Argument("list[str]"), "all": Argument("bool"), "run": Argument("str | None")}

# Every request type the daemon answers, with what it takes: the one table both sides check
# requests against (the client before sending, the daemon before a handler runs).
OPERATIONS: dict[str, Operation] = dict([
    _operation("status"),
    _operation("submit", writes=True, tasks=Argument("Any", required=True), template=Argument("str"),
               material_id=Argument("str | None")),
    _operation("run", writes=True, template=Argument("str", required=True), material_id=Argument("str | None"),
               params=Argument("Any")),
    _operation("ls", status=Argument("str | list[str] | None"), run=Argument("str | None"),
               type=Argument("str | None"), limit=Argument("int | None")),
    # `ls` sorted, filtered and limited, streamed a page at a time; with total: how many match.
    _operation("ls_pages", streams=True, status=Argument("str | list[str] | None"), run=Argument("str | None"),
               type=Argument("str | None"), limit=Argument("int | None"), sort=Argument("str | None"),
               since=Argument("float | None"), total=Argument("bool")),
    _operation("runs", status=Argument("str | None"), limit=Argument("int | None")),
    _operation("show", id=_ID, tasks_limit=Argument("int | None")),
    _operation("wait", ids=Argument("list[str]", required=True), timeout=Argument("float | None")),
    # The acting operations (SPEC §14 Bulk): ids, or the selectors, as `daemon.bulk` takes them.
    _operation("cancel", bulk=True, **_BULK),
    _operation("pause", bulk=True, **_BULK),
    _operation("resume", bulk=True, **_BULK),
    _operation("hold", bulk=True, **_BULK),
    _operation("release", bulk=True, **_BULK),
    _operation("priority", bulk=True, priority=Argument("int", required=True), **_BULK),
    _operation("log_path", id=Argument("str | None")),
    _operation("restarts", all=Argument("bool")),
    _operation("restarts_dismiss", bulk=True, **_ENTRIES),
    # Not `writes`: its handler thread hands the loop one chunk after another (each committed on
    # its own), which a handler run on the loop itself could not do. Asked again, it removes only
    # what is still there to remove.
    _operation("clean", older_than=Argument("float", required=True), status=Argument("str | None"),
               dry_run=Argument("bool")),
    _operation("restarts_recreate", bulk=True, **_ENTRIES),
    _operation("retry", bulk=True, **_BULK),
    _operation("queues"),
    _operation("types"),
    _operation("templates"),
    _operation("queue_pause", writes=True, name=Argument("str", required=True)),
    _operation("queue_resume", writes=True, name=Argument("str", required=True)),
    _operation("queue_workers", writes=True, name=Argument("str", required=True),
               workers=Argument("int", required=True)),
])


# What the replies hold (the `data` of an ok reply), for both sides' type hints.
class SubmittedTask(TypedDict):
    id: str
    created: bool  # False: an active task with its idempotency key was there; this is its id


class SubmitReply(TypedDict):
    run_id: str | None  # None when every task was already active
    tasks: list[SubmittedTask]


class CleanReply(TypedDict):
    runs: int
    tasks: int
    logs: int  # tasks whose log files were removed (or, dry run, are there)
    done: bool  # False: the request's time ran out first; ask again for the rest


class Result(TypedDict, total=False):
    """One target's line of an acting operation's reply (`daemon.bulk`); an operation may add keys
    of its own (cancel: `cancelled`, `stopping`, `dependents`)."""

    id: str  # required: the full id, or the text given when it names nothing
    ok: bool  # required
    message: str  # required: one line, what was done or why not
    kind: str  # a refusal's error class in `daemon.errors`, for a client to raise it as such
    new_id: str  # retry, recreate: the copy (or the active task that holds its idempotency key)
    run_id: str | None  # retry, recreate: the new run
    copies: list[str]  # retry, recreate: the copies of the tasks its failure cancelled


class ResultsReply(TypedDict):
    results: list[Result]  # one per id asked, in order


class ShowReply(TypedDict):
    kind: str  # "task" or "run"
    object: dict[str, Any]  # a run's has `tasks` too


class WaitReply(TypedDict):
    tasks: list[dict[str, Any]]  # in the order asked
    ended: bool  # False: the timeout came first, and some of them are still active


class Pages:
    """A streamed reply (`Operation.streams`): its pages are made one at a time, as the one before
    has been written, so the daemon holds one page of it at once. `final` is sent with the last."""

    def __init__(self, pages: Iterator[list[Any]], final: Callable[[], Mapping[str, Any]] = dict) -> None:
        self._pages = pages
        self._final = final
        self._next: list[Any] | None = next(pages, None)  # made at once: a refusal comes before any frame
        self._failed: Exception | None = None

    def next_frame(self) -> tuple[dict[str, Any], bool]:
        """The next frame's message, and whether it is the last; a page is read ahead to know it.
        An error reading ahead is raised by the call after: the page read before it goes out first."""
        if self._failed is not None:
            raise self._failed
        items = self._next or []
        try:
            self._next = next(self._pages, None)
        except Exception as exc:
            self._failed = exc
            return ok({"items": items, "more": True}), False
        if self._next is not None:
            return ok({"items": items, "more": True}), False
        return ok({"items": items, **self._final()}), True

    def close(self) -> None:
        """Stop early (the client is gone): what the pages hold (a read cursor) is let go."""
        close = getattr(self._pages, "close", None)
        if close is not None:
            close()


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
    try:
        return framing.encode(body, limit)
    except framing.Oversized as exc:
        raise FrameTooLarge(str(exc)) from None


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


class FrameReader(framing.Frames):
    """Frames assembled from the pieces a socket gives, on either side of it (`framing.Frames`),
    with an oversized one refused as the protocol's FrameTooLarge."""

    def feed(self, data: bytes = b"") -> bytes | None:
        """The body of the next frame once it is whole, else None; FrameTooLarge from the header.
        `feed()` with nothing looks for a frame that came behind the last one."""
        try:
            return super().feed(data)
        except framing.Oversized as exc:
            raise FrameTooLarge(str(exc)) from None


def read_frame(sock: socket.socket, limit: int, frames: FrameReader | None = None) -> dict[str, Any]:
    """Read one frame from a blocking socket (through `frames`, which keeps what came after it, for
    a connection that carries more); ProtocolError if it is truncated, too large or not a JSON
    object of text."""
    frames = frames if frames is not None else FrameReader(limit)
    body = frames.feed()
    while body is None:
        chunk = sock.recv(READ_SIZE)
        if not chunk:
            raise ConnectionClosed(f"connection closed with {frames.missing()}")
        body = frames.feed(chunk)
    return decode(body)


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
    OPERATIONS[op].check(args)
    return op, args


def ok(data: Any) -> dict[str, Any]:
    return {"v": VERSION, "ok": True, "data": data}


def error(kind: str, message: str) -> dict[str, Any]:
    # One line: the CLI prints it as is.
    return {"v": VERSION, "ok": False, "error": {"kind": kind, "message": " ".join(message.split())}}
