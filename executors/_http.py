"""HTTP plumbing of the DOWNLOAD executor: connections another thread can interrupt, redirects that
keep the payload's credentials to their origin, and no proxy for our own loopback."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import threading
import urllib.parse
import urllib.request
from typing import Any

CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})  # lower case
DEFAULT_PORTS = {"http": 80, "https": 443}


class RedirectRefused(Exception):
    """A redirect that would downgrade https to http, or leave http(s)."""


class SocketTracker:
    """Knows the socket of the current connection, so another thread can interrupt a blocked read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def connection_class(self, base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
        """`base` (HTTPConnection or HTTPSConnection), reporting each new socket to this tracker."""
        tracker = self

        class Tracked(base):  # type: ignore[valid-type, misc]
            def connect(self) -> None:
                super().connect()
                with tracker._lock:
                    tracker._sock = self.sock

        return Tracked

    def forget(self) -> None:
        """Call before closing the response: the socket's fd is about to be released."""
        with self._lock:
            self._sock = None

    def interrupt(self) -> None:
        """Shut the connection down: a read blocked on it returns at once."""
        with self._lock:
            if self._sock is not None:
                try:
                    # The plain socket's shutdown, also for TLS: the SSL object's own state stays
                    # untouched while the reading thread is inside it.
                    socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
                except OSError:
                    pass


def opener(url: str, tracker: SocketTracker) -> urllib.request.OpenerDirector:
    """A urllib opener for `url` whose connections `tracker` can interrupt, with our redirects."""
    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(tracker.connection_class(http.client.HTTPConnection), req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            context = getattr(self, "_context", None)  # the handler's TLS settings, if any
            return self.do_open(tracker.connection_class(http.client.HTTPSConnection), req, context=context)

    handlers: list[urllib.request.BaseHandler] = [HTTPHandler(), HTTPSHandler(), RedirectHandler()]
    if _is_loopback(urllib.parse.urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))  # a proxy cannot reach our own loopback
    return urllib.request.build_opener(*handlers)


class RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows a redirect, keeping the payload's credentials to the origin the payload names."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        source, target = _origin(req.full_url), _origin(new.full_url)
        if target[0] not in DEFAULT_PORTS or (source[0], target[0]) == ("https", "http"):
            fp.close()  # urllib closes it only when it follows the redirect
            why = (
                "https does not fall back to http; to accept clear text, give the http URL in the payload"
                if target[0] == "http" else "only http and https are followed"
            )
            raise RedirectRefused(f"refused the redirect from {req.full_url} to {new.full_url}: {why}")
        if target != source:
            # urllib copies every header to the new request; credentials are for the original origin.
            for name in [n for n in new.headers if n.lower() in CREDENTIAL_HEADERS]:
                del new.headers[name]
        return new


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of `url`; ("", "", None) if it cannot be parsed."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return "", "", None


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
