"""The HTTP server inside the daemon: Starlette on uvicorn, in its own thread with its own event loop.

Starlette with uvicorn rather than aiohttp: it adds about half the import time to the daemon's
start (~100 ms against ~200 ms here) and answers `GET /api/v1/status` well inside the 2 ms target
from a keep-alive client (benchmarks/http_api.py). The socket is bound by the daemon's start-up,
so a port in use stops the daemon with one line; the thread then serves on it until `close`.

Nothing here blocks the event loop: every handler runs on `pool` (`api.Api.run`), and the
supervisor's loop is only ever reached through the handlers, as from the control socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.resources
import socket
import threading
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from daemon import config, protocol
from daemon.errors import CannotStart
from daemon.web import api, auth, events, metrics, views

log = structlog.get_logger("fredica.http")
POOL_THREADS = 16  # handlers at once
WAIT_THREADS = 32  # `wait` requests at once, each held up to 10 s; more queue for a thread
STOP_GRACE = 2.0  # seconds open streams get to end when the daemon stops
# The page's files: (name in daemon/web/page, content type).
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript; charset=utf-8"),
              "/page.css": ("page.css", "text/css; charset=utf-8")}
# The page loads nothing from elsewhere, and may not be framed by another site.
PAGE_HEADERS = {"content-security-policy": "default-src 'self'; frame-ancestors 'none'", "x-frame-options": "DENY",
                "cache-control": "no-cache", "referrer-policy": "no-referrer"}


def bind(listen: tuple[str, int]) -> socket.socket:
    """The listening socket; CannotStart naming the address if it cannot be had."""
    host, port = listen
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say it, and without it
        # a reply's headers and body, written apart, wait out the client's delayed ACK (40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        raise CannotStart(f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def _page_file(name: str) -> bytes:
    return importlib.resources.files("daemon.web").joinpath("page", name).read_bytes()


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204)  # browsers ask for one; there is none


class HttpServer:
    """Serves the API, the page, the events and /metrics on `settings.http_listen`."""

    def __init__(self, settings: config.Settings, handle: api.Handle, supervisor: Any) -> None:
        assert settings.http_listen is not None
        self.settings = settings
        self.sock = bind(settings.http_listen)  # first: a port in use makes no token file
        self.token = auth.load_or_create_token(settings.token_file)
        self.pool = concurrent.futures.ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="fredica-http")
        self.waits = concurrent.futures.ThreadPoolExecutor(WAIT_THREADS, thread_name_prefix="fredica-http-wait")
        self.api = api.Api(handle, self.pool, self.waits)
        self.changes = events.TaskChanges(settings.database, supervisor.commits, supervisor.wait_for_commit,
                                          report_corruption=supervisor.report_corruption)
        self.metrics = metrics.Metrics(supervisor, self.changes)
        supervisor.attempt_observers.append(self.metrics.observe_attempt)
        self._stopping = threading.Event()
        self.views = views.Views(settings.database, self.api, self._stopping.is_set, supervisor.report_corruption)
        self.page = {path: (_page_file(name), kind) for path, (name, kind) in PAGE_FILES.items()}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def app(self) -> auth.App:
        routes = [Route(path, self._serve_page_file) for path in self.page]
        routes += [
            Route("/favicon.ico", _no_icon),
            Route("/metrics", self._metrics),
            Route("/api/v1/events", self._events),
            Route("/api/v1/page/tasks", self.views.tasks),
            Route("/api/v1/page/log", self.views.log),
            Route("/api/v1/page/operations", self._operations),
            Route("/api/v1/{op}", self.api.endpoint, methods=["GET", "POST"]),
        ]
        return auth.Guard(Starlette(routes=routes), self.token)

    async def _serve_page_file(self, request: Request) -> Response:
        body, kind = self.page[request.url.path]
        return Response(body, media_type=kind, headers=PAGE_HEADERS)

    async def _operations(self, request: Request) -> Response:
        """The operations this daemon has, with their arguments: the page shows a button only
        for an operation that exists, and passes it `ids` or `id` as the operation takes."""
        table = {name: {"writes": op.writes, "arguments": {arg: spec.types for arg, spec in op.arguments.items()}}
                 for name, op in protocol.OPERATIONS.items()}
        return api.json_response({"ok": True, "data": table})

    async def _metrics(self, request: Request) -> Response:
        text = await asyncio.get_running_loop().run_in_executor(self.pool, self.metrics.text)
        return Response(text, media_type=metrics.CONTENT_TYPE)

    async def _events(self, request: Request) -> Response:
        return StreamingResponse(self.changes.stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    def serve(self) -> None:
        """Start serving in a background thread."""
        cfg = uvicorn.Config(self.app(), log_config=None, access_log=False, lifespan="off",
                             timeout_graceful_shutdown=STOP_GRACE, timeout_keep_alive=30)
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._run, name="fredica-http", daemon=True)
        self._thread.start()
        self._started.wait(10)
        log.info("http_listening", listen=f"{self.settings.http_listen[0]}:{self.port}")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self.changes.start(loop)
        try:
            loop.call_soon(self._started.set)
            assert self._server is not None
            loop.run_until_complete(self._server.serve(sockets=[self.sock]))
        except BaseException:  # noqa: BLE001 (a failure here must not take the daemon down)
            log.exception("http_server_failed")
        finally:
            self._started.set()
            loop.close()

    def close(self) -> None:
        """Stop: the streams end, the open requests get STOP_GRACE, then the thread ends."""
        self._stopping.set()
        self.changes.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_GRACE + 5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.waits.shutdown(wait=False, cancel_futures=True)
        self.sock.close()
