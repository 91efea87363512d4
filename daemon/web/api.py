"""Every control-socket operation as JSON under `/api/v1/<op>`, generic over `protocol.OPERATIONS`.

`POST /api/v1/<op>` takes the operation's arguments as a JSON object body and works for every
operation; `GET /api/v1/<op>?name=value` works for those that only read (`writes` false), a value
read as JSON where the argument's type takes it (`limit=5`, `all=true`) and as text otherwise, a
repeated name as a list. Both go through `protocol.parse_request`, the same check the control
socket makes, and then through the same handler (`operations.Handlers.handle`), run on a thread
of this server's pool: never on the event loop, which must keep serving. Writes reach the
supervisor's loop thread the way the socket's do, through the handlers.

Replies have the control protocol's shape (`{"ok": true, "data": ...}` or `{"ok": false,
"error": {"kind", "message"}}`), with the HTTP status said by the error's class (`STATUS`). A
streamed operation (`Operation.streams`, `ls_pages`) answers `application/x-ndjson`: a line per
frame of the socket's stream (`{"ok": true, "data": {"items": [...], "more": true}}`, the last
without `more`), or an error as its last line once the stream has begun.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any, AsyncIterator, Callable, Mapping

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from daemon import errors, protocol

log = structlog.get_logger("fredica.http")
Handle = Callable[[str, dict[str, Any]], Any]

# The HTTP status of a refusal, by the error's class or its nearest ancestor listed here: a kind
# another module adds under one of these classes gets its status without a line here.
STATUS: dict[type[errors.FredicaError], int] = {
    errors.FredicaError: 400,  # bad input, by default
    errors.FrameTooLarge: 413,
    errors.UnknownTask: 404,
    errors.UnknownRun: 404,
    errors.UnknownRestartEntry: 404,
    errors.LogElsewhere: 404,  # not on this host: the error names the one that has it
    errors.InvalidTransition: 409,
    errors.NotPausable: 409,
    errors.PermissionDenied: 403,
    errors.ShuttingDown: 503,
    errors.LoopBusy: 503,
    errors.RequesterGone: 503,
    errors.Busy: 503,
    errors.DatabaseFault: 503,
    errors.InternalError: 500,
}


def status_of(kind: type[errors.FredicaError]) -> int:
    for cls in kind.__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


def json_response(body: Any, status: int = 200) -> Response:
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(text.encode(), status, media_type="application/json", headers={"cache-control": "no-store"})


def refusal(exc: errors.FredicaError) -> Response:
    reply = protocol.error(exc.kind, exc.message)
    return json_response({"ok": False, "error": reply["error"]}, status_of(type(exc)))


def query_args(op: str, query: Any) -> dict[str, Any]:
    """A GET request's query string as the operation's arguments (see the module's docstring)."""
    operation = protocol.OPERATIONS[op]
    args: dict[str, Any] = {}
    for name in query.keys():
        values = query.getlist(name)
        argument = operation.arguments.get(name)
        if argument is None:
            args[name] = values[-1]  # refused by the check, which names it
        elif len(values) > 1:
            args[name] = values
        else:
            args[name] = _query_value(values[0], argument)
    return args


def _query_value(text: str, argument: protocol.Argument) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if argument.accepts(value):
        return value
    if argument.accepts(text):
        return text
    if argument.accepts([text]):
        return [text]
    return value  # refused by the check, which says what the type must be


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused (FrameTooLarge) as soon as it passes `limit`, before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.FrameTooLarge(f"request of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise errors.FrameTooLarge(f"request exceeds the limit of {limit} bytes")
    return bytes(body)


# Operations whose handler may block for long (`wait`: up to 10 s): they get threads of their own,
# so that clients waiting for tasks never hold up the others' requests.
BLOCKING = frozenset({"wait"})


class Api:
    """The `/api/v1/<op>` endpoint: parse, check, run the handler on the pool, answer."""

    def __init__(self, handle: Handle, pool: concurrent.futures.Executor,
                 waits: concurrent.futures.Executor | None = None) -> None:
        self.handle = handle
        self.pool = pool
        self.waits = waits if waits is not None else pool

    async def run(self, op: str, args: Mapping[str, Any]) -> Any:
        """The handler's reply to a checked request, run on a pool (FredicaError if refused)."""
        loop = asyncio.get_running_loop()
        pool = self.waits if op in BLOCKING else self.pool
        return await loop.run_in_executor(pool, self._handled, op, dict(args))

    def _handled(self, op: str, args: dict[str, Any]) -> Any:
        try:
            return self.handle(op, args)
        except errors.FredicaError:
            raise
        except Exception as exc:  # a bug of ours: reported, the server goes on
            log.exception("http_request_failed", op=op)
            raise errors.InternalError(f"{op} failed: {type(exc).__name__}: {exc}") from None

    async def _lines(self, op: str, pages: protocol.Pages) -> AsyncIterator[bytes]:
        """A streamed reply (`Operation.streams`) as JSON lines, one frame's message a line, each
        page made on the pool once the line before has gone; an error is the last line."""
        loop = asyncio.get_running_loop()
        last = False
        while not last:
            try:
                message, last = await loop.run_in_executor(self.pool, pages.next_frame)
            except errors.FredicaError as exc:
                message, last = protocol.error(exc.kind, exc.message), True
            except Exception as exc:  # a bug of ours: the stream ends with it said
                log.exception("http_request_failed", op=op)
                message, last = protocol.error(errors.InternalError.kind, f"{op} failed: {type(exc).__name__}"), True
            message.pop("v", None)
            yield (json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode()

    async def endpoint(self, request: Request) -> Response:
        op = request.path_params["op"]
        try:
            if op not in protocol.OPERATIONS:
                return json_response({"ok": False, "error": {"kind": "ProtocolError",
                                                             "message": f"unknown request {protocol.shown(op)}"}}, 404)
            operation = protocol.OPERATIONS[op]
            if request.method == "GET":
                if operation.writes:
                    return json_response({"ok": False, "error": {
                        "kind": "ProtocolError", "message": f"{op} changes things: POST it"}}, 405)
                args = query_args(op, request.query_params)
                where = protocol.non_text(args, "args")
                if where is not None:
                    raise errors.NotText(f"{where} ({protocol.NOT_TEXT})")
            else:
                body = await read_body(request, protocol.MAX_REQUEST)
                args = protocol.decode(body) if body.strip() else {}
            _, args = protocol.parse_request({"v": protocol.VERSION, "op": op, "args": args})
            data = await self.run(op, args)
            if isinstance(data, protocol.Pages):
                return StreamingResponse(self._lines(op, data), media_type="application/x-ndjson",
                                         headers={"cache-control": "no-store"})
            return json_response({"ok": True, "data": data})
        except errors.FredicaError as exc:
            if isinstance(exc, errors.ProtocolError):
                log.warning("bad_http_request", op=op, error=exc.message)
            return refusal(exc)
