"""The HTTP API's bearer token and the checks every request passes before it reaches a route.

The token lives in `token_file` (created 0600 at the first start with `[http] listen`, kept
across restarts). Every request that reads or changes anything must carry it as
`Authorization: Bearer <token>`, loopback included: on a shared machine anyone can connect to
127.0.0.1. The page's own files (`/`, its script and style) hold no data and are served without
it, since a browser cannot send a header when it navigates; the page then asks for the token.

No cookies are set and CORS stays closed: no `Access-Control-Allow-Origin` is ever sent, a
preflight (OPTIONS) is refused, and so is any request whose `Origin` is not the server itself, so
another site open in the same browser can neither read nor drive the API.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import structlog

from daemon import paths
from daemon.errors import CannotStart

log = structlog.get_logger("fredica.http")

# The page's own files, served without the token (see the module's docstring).
PUBLIC_PATHS = frozenset({"/", "/page.js", "/page.css", "/favicon.ico"})
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def load_or_create_token(path: Path) -> str:
    """The token kept in `path`, created there (0600, from `secrets`) if there is none yet;
    CannotStart naming the file if it cannot be read or written.

    Made whole in a file of its own, then linked to `path`: two daemons starting at once on one
    host (sharing the default file) both end with the one token that got there first, and neither
    reads the file before its token is in it."""
    if path.exists():
        return read_token(path)
    try:
        # Beside a SQLite database its directory exists; a PostgreSQL queue's default is the
        # state directory, which nothing else may have made on this host.
        paths.private_dir(path.parent)
        fd, made = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
    except OSError as exc:
        raise CannotStart(f"cannot create the HTTP token file {path}: {exc.strerror}") from None
    try:
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        try:
            os.link(made, path)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            _create_in_place(path, token)  # vfat, exFAT, some network and FUSE mounts
    except FileExistsError:
        return read_token(path)  # another daemon's, made meanwhile
    except OSError as exc:
        raise CannotStart(f"cannot create the HTTP token file {path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(made)
    log.info("http_token_created", path=str(path))
    return token


# What link(2) says on a filesystem that has no hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _create_in_place(path: Path, token: str) -> None:
    """Where no hard link can be made: created under its name (0600, FileExistsError if another
    daemon was first), then written. A daemon starting in that moment may read it empty."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")


def read_token(path: Path) -> str:
    """The token in `path`; CannotStart if it is missing, unreadable or empty."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        token = path.read_text().strip()
    except OSError as exc:
        raise CannotStart(f"cannot read the HTTP token file {path}: {exc.strerror}") from None
    if not token:
        raise CannotStart(f"the HTTP token file {path} is empty: remove it and a new token is made at start")
    if mode & 0o077:
        # Not fatal (the user chose the file), but the token is as good as public.
        log.warning("http_token_file_not_private", path=str(path), mode=oct(mode))
    return token


async def _refuse(send: Send, status: int, kind: str, message: str,
                  extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"ok": False, "error": {"kind": kind, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def same_origin(scope: Scope) -> bool:
    """Whether the request comes from no page, or from a page this server served."""
    origin = _header(scope, b"origin")
    if origin is None:
        return True  # not a browser's cross-site request: curl, a script, a navigation
    host = _header(scope, b"host")
    return host is not None and origin in (b"http://" + host, b"https://" + host)


class Guard:
    """ASGI middleware: the token on every request but the page's files, and no cross-origin use."""

    def __init__(self, app: App, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    def authorized(self, scope: Scope) -> bool:
        given = _header(scope, b"authorization") or b""
        return hmac.compare_digest(given, self._expected)  # constant time: no guessing by timing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS" or not same_origin(scope):
            return await _refuse(send, 403, "PermissionDenied", "cross-origin requests are refused")
        if scope["path"] not in PUBLIC_PATHS and not self.authorized(scope):
            return await _refuse(send, 401, "PermissionDenied", "a valid bearer token is required (fredica http-token)",
                                 [(b"www-authenticate", b'Bearer realm="fredica"')])
        await self.app(scope, receive, send)
