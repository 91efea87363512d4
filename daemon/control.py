"""The control socket: a Unix socket server; what each request does is `operations.Handlers`.

The socket lives in a private directory (created 0700) and is itself 0600; on top of that every
connection's peer credentials are checked, so only the daemon's own user and root are answered.
Each connection is served by its own thread: one request, one reply, close. Every frame gets a
reply or a closed connection, never silence.
"""

from __future__ import annotations

import os
import select
import socket
import stat
import struct
import threading
from pathlib import Path
from typing import Any, Callable

import structlog

from daemon import handoff, paths, protocol
from daemon.errors import FredicaError

log = structlog.get_logger("fredica.control")
READ_TIMEOUT = 10.0  # a client that sends half a frame and stalls is dropped after this long
MAX_CLIENTS = 64  # connections served at once (a thread each)
ACCEPT_BACKOFF = 0.1  # seconds to wait after accept() failed (EMFILE: no descriptor left)
PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return uid


def _still_connected(conn: socket.socket) -> bool:
    """Whether the client is still there, waiting for its answer: not if it has closed its socket
    (it gave up). One that only shut down its sending side (socat, `nc -N`) still reads the
    answer. A poll, never a read: the socket has a timeout, and a read would wait it out."""
    poller = select.poll()
    poller.register(conn.fileno(), 0)  # POLLHUP and POLLERR are always reported
    return not any(mask & (select.POLLHUP | select.POLLERR) for _, mask in poller.poll(0))


def _answers(path: Path) -> bool:
    """Whether something may be listening on the Unix socket at `path`: only a refused connection
    (or no socket any more) says it is stale. A full backlog (EAGAIN), a permission error or a
    timeout say someone is there."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


class ControlServer:
    """Listens on the control socket and serves each connection on a thread of its own."""

    def __init__(self, path: Path, handle: Callable[[str, dict[str, Any]], Any]) -> None:
        self.path = Path(path)
        self.handle = handle
        self.allowed_uids = {os.getuid(), 0}
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def bind(self) -> None:
        """Create the socket (listening, so clients queue while recovery runs); `serve` answers them."""
        directory = self.path.parent
        if not directory.exists():
            paths.private_dir(directory)
        elif stat.S_IMODE(directory.stat().st_mode) & 0o077:
            # Not fatal: the socket is 0600 and peers are checked. Changing the mode of a directory
            # the user chose (their home, /tmp) would be worse.
            log.warning("socket_directory_not_private", directory=str(directory))
        if self.path.exists() or self.path.is_symlink():
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise FredicaError(f"{self.path} exists and is not a socket: refusing to replace it")
            # The database lock says no daemon owns our database; one on another database may
            # still listen here (two configs naming one socket).
            if _answers(self.path):
                raise FredicaError(f"another daemon is listening on {self.path}: refusing to take its socket")
            self.path.unlink()  # stale: left by a daemon that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600, with no window where it is wider
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(128)
        self._sock = sock

    def serve(self) -> None:
        """Start answering in a background thread."""
        self._thread = threading.Thread(target=self._accept_loop, name="fredica-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        try:
            if self.path.exists() and stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(5)

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            # At most MAX_CLIENTS served at once; the others wait in the listen backlog.
            self._slots.acquire()
            try:
                conn, _ = self._sock.accept()
            except OSError:
                self._slots.release()
                if self._closing.is_set():
                    return
                # Out of file descriptors or memory: wait rather than spin on accept.
                self._closing.wait(ACCEPT_BACKOFF)
                continue
            try:
                threading.Thread(target=self._serve_one, args=(conn,), name="fredica-client", daemon=True).start()
            except RuntimeError:  # no thread to be had: drop this client, keep accepting
                conn.close()
                self._slots.release()
                log.warning("client_dropped", reason="cannot start a thread")
                self._closing.wait(ACCEPT_BACKOFF)

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                reply = self._reply_for(conn)
                protocol.write_frame(conn, reply, protocol.MAX_REPLY)
            except protocol.ProtocolError as exc:  # too large, or not text: say so instead
                reply = protocol.error(type(exc).__name__, f"the reply cannot be sent: {exc.message}")
                self._send_quietly(conn, reply)
            except OSError:
                pass  # the client went away; nothing to tell it
            except Exception:  # a bug of ours: into the daemon's log, never its stderr
                log.exception("client_failed")
            finally:
                self._slots.release()

    def _reply_for(self, conn: socket.socket) -> dict[str, Any]:
        uid = peer_uid(conn)
        conn.settimeout(READ_TIMEOUT)
        if uid not in self.allowed_uids:
            log.warning("client_refused", uid=uid)
            # Let the client finish sending (its request is read, never acted on): closing first
            # would fail its write with EPIPE before it could read why it was refused.
            try:
                protocol.read_frame(conn, protocol.MAX_REQUEST)
            except (protocol.ProtocolError, OSError):
                pass
            return protocol.error("PermissionDenied", f"user {uid} may not control this daemon")
        try:
            message = protocol.read_frame(conn, protocol.MAX_REQUEST)
            op, args = protocol.parse_request(message)
        except socket.timeout:
            return protocol.error("ProtocolError", "incomplete request: timed out waiting for the rest")
        except protocol.ProtocolError as exc:
            log.warning("bad_request", error=exc.message)
            return protocol.error(type(exc).__name__, exc.message)
        try:
            with handoff.on_behalf_of(lambda: _still_connected(conn)):
                return protocol.ok(self.handle(op, args))
        except FredicaError as exc:
            return protocol.error(type(exc).__name__, exc.message)
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("request_failed", op=op)
            return protocol.error("InternalError", f"{op} failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _send_quietly(conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            protocol.write_frame(conn, reply, protocol.MAX_REPLY)
        except OSError:
            pass
