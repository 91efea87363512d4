"""The control socket: a Unix socket server that reads each request whole before anything acts on it.

The socket lives in a private directory (created 0700) and is itself 0600; on top of that every
connection's peer credentials are checked, so only the daemon's own user and root are answered.

One thread owns every connection: it accepts, reads and writes with non-blocking sockets, so a
client that connects and sends nothing, or trickles its request a byte at a time, costs a
descriptor and a buffer, never a thread. A connection carries requests one after another (the
public client keeps its connection open between calls): each must arrive whole within
`request_timeout` seconds of its first byte, and a connection that sends nothing for as long, at
first or between requests, is closed. Only a whole request goes to the threads that run the
handlers (`operations.Handlers`); its reply comes back to be written, and then the connection
reads the next request. Every frame gets a reply or a closed connection, never silence; after a
frame that breaks the framing (too large, cut short) the reply is the connection's last.

A small write request (`protocol.Operation.writes`) skips the handler threads once the loop runs:
the I/O thread parses it and hands its handler straight to the supervisor's loop thread
(`writes_to_loop`), and writes the reply when the loop's commit answers it. The loop alone writes
the database, so a handler thread would only wait there; reads, which do not need the loop, and
large requests (whose parsing must not hold the loop) still go to the handler threads.

In the daemon the I/O thread is the supervisor's loop thread itself (`serve(driven=True)`): the
loop waits on this server's selector beside its executors' pipes and calls `step` when it is
ready, and writes the replies of the requests it has just committed at once (`flush`). A write
request then costs no thread switch at all: read, run, committed and answered by one thread, which
is what makes a submit take a fraction of a millisecond (a switch between two threads that share
the interpreter costs more than the insert). Nothing here blocks: every socket is non-blocking.

A streamed reply (`protocol.Pages`, `ls_pages`) is written a frame at a time, each frame made on
a handler thread once the one before has gone out: a listing of any length holds one page in
memory, a slow reader only slows itself, and no page is ever read on the I/O thread (the loop's).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import os
import queue
import resource
import select
import selectors
import socket
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import structlog

from daemon import config, errors, handoff, paths, protocol
from daemon.errors import FredicaError
from daemon.handler_threads import HandlerThreads  # noqa: F401 (part of this module's API)

log = structlog.get_logger("fredica.control")
HANDLER_THREADS = 64  # requests handled at once; more wait for a thread, already read whole
MAX_CONNECTIONS = 1024  # open at once; more wait in the listen backlog (see _connection_cap)
ACCEPT_BACKOFF = 0.1  # seconds to stop accepting after accept() failed (EMFILE: no descriptor left)
CLOSE_GRACE = 1.0  # seconds a closing server still lets the replies being prepared go out
READ_SIZE = protocol.READ_SIZE
PEERCRED = struct.Struct("3i")  # pid, uid, gid
# Write requests up to this size are handed straight to the loop; larger ones (a big batch, whose
# parsing must not hold the loop) go through a handler thread.
DIRECT_MAX = 64 * 1024
# What hands a write's handler to the loop: (handler, still_waiting) -> its future, answered once
# committed, or None while no loop runs (`Supervisor.hand_over`).
HandOver = Callable[[Callable[[], Any], Callable[[], bool]], "concurrent.futures.Future[Any] | None"]


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return uid


def _still_connected(conn: socket.socket) -> bool:
    """Whether the client is still there, waiting for its answer: not if it has closed its socket
    (it gave up). One that only shut down its sending side (socat, `nc -N`) still reads the
    answer. A poll, never a read: the request's bytes are the reading thread's."""
    if conn.fileno() < 0:  # closed by the server: it is shutting down
        return False
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


def _connection_cap() -> int:
    """MAX_CONNECTIONS, or half the descriptors this process may open if that is fewer: clients
    must never take the descriptors the supervisor needs for executors, pipes and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(1, min(MAX_CONNECTIONS, soft // 2))


class Connection:
    """One client, from accept to the end of its reply: reading (with a deadline), handled (on a
    handler thread, no deadline: the handler's own bounds apply), then writing its reply."""

    def __init__(self, sock: socket.socket, uid: int) -> None:
        self.sock = sock
        self.uid = uid
        self.frame = protocol.FrameReader(protocol.MAX_REQUEST)
        self.deadline: float | None = None
        self.reply: memoryview | None = None
        self.last_reply = False  # closed once this reply is written: the framing is lost
        # A write handed to the loop (`writes_to_loop`), until its answer is taken; `op` is its name.
        self.pending: concurrent.futures.Future[Any] | None = None
        self.op = ""
        # A streamed reply whose next frame is still to be made (None while a handler makes it).
        self.stream: protocol.Pages | None = None
        self.events = 0  # what the selector watches it for
        self.closed = False


class ControlServer:
    """Listens on the control socket; one thread does all its I/O, a pool runs the handlers."""

    def __init__(self, path: Path, handle: Callable[[str, dict[str, Any]], Any], *,
                 request_timeout: float = config.Settings.request_timeout) -> None:
        self.path = Path(path)
        self.handle = handle
        self.request_timeout = request_timeout
        self.allowed_uids = {os.getuid(), 0}
        self.max_connections = _connection_cap()
        self.request_threads = HandlerThreads(HANDLER_THREADS)
        self.connections: set[Connection] = set()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        # Replies to write (None: close), or the answered futures of writes handed to the loop.
        # A streamed reply's frame comes with the stream still to be written (None: its last).
        self._replies: queue.SimpleQueue[tuple[Connection, bytes | tuple[bytes, protocol.Pages | None]
                                               | concurrent.futures.Future[Any] | None]] = queue.SimpleQueue()
        self._hand_over: HandOver | None = None
        self.call_timeout = 0.0
        self._deadlines: list[tuple[float, int, Connection]] = []  # a heap; stale entries are skipped
        self._order = itertools.count()  # ties in the heap, never compared further
        self._accepting = False
        self._accept_again_at: float | None = None
        self._closing_refusal: FredicaError = errors.ShuttingDown("the daemon is shutting down: nothing was done")
        self._driven = False  # `step` is called by the supervisor's loop, not by our own thread
        self._driver: int | None = None  # the thread that drives it, once it has

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
        # A burst of clients may come faster than one thread, sharing the interpreter with the
        # loop, accepts them: the kernel queues them meanwhile (up to net.core.somaxconn).
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
        self._sock = sock

    def writes_to_loop(self, hand_over: HandOver, call_timeout: float) -> None:
        """From now on, hand small write requests to the loop from the I/O thread (see the module's
        docstring). One the loop has not taken within `call_timeout` seconds is withdrawn and
        refused (LoopBusy), as `Supervisor.call` does: nothing of it was done."""
        self._hand_over = hand_over
        self.call_timeout = call_timeout

    def serve(self, *, driven: bool = False) -> None:
        """Start answering: in a background thread, or, `driven`, by whoever calls `step` when
        `fileno()` is ready (the supervisor's loop) from the thread that calls it."""
        assert self._sock is not None
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._accept_from_now()
        if driven:
            self._driven = True
            return
        self._thread = threading.Thread(target=self._run, name="fredica-control", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        """Readable when `step` has something to do (the selector's own descriptor)."""
        return self._selector.fileno()

    def next_step_in(self, now: float) -> float | None:
        """Seconds until `step` must run even if nothing arrives (a deadline), None: no need."""
        wake_at = [t for t in (self._next_deadline(), self._accept_again_at) if t is not None]
        return max(0.0, min(wake_at) - now) if wake_at else None

    def step(self) -> None:
        """Do, without waiting, what the sockets are ready for (driven mode, the driving thread)."""
        self._driver = threading.get_ident()
        self._step(None, timeout=0.0)

    def flush(self) -> None:
        """Write the replies that are ready now, without waiting for the next `step` (driven mode:
        the loop has just committed, and answered, the requests it ran)."""
        self._take_replies()

    def close(self, refusal: FredicaError | None = None) -> None:
        """Stop accepting, let the replies being prepared go out (CLOSE_GRACE), close the rest.
        A request still arriving meanwhile is answered with `refusal` (default: the daemon is
        shutting down), never cut off: a client learns why, and that nothing was done."""
        if refusal is not None:
            self._closing_refusal = refusal
        self._closing.set()
        if self._thread is not None:
            self._wake()
            self._thread.join(CLOSE_GRACE + 5)
        elif self._driven:  # its driver has stopped: the grace runs on the closing thread
            self._driver = threading.get_ident()
            # What the loop answered last (refusals at its end) was queued with no wake-up, for
            # a flush that never came: written now, before the grace.
            self._take_replies()
            self._run()
        else:  # never served: nothing to wait for
            self._close_sockets()
        try:
            if self.path.exists() and stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except OSError:
            pass

    # --- the I/O thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            grace_ends: float | None = None
            while True:
                if self._closing.is_set() and grace_ends is None:
                    grace_ends = time.monotonic() + CLOSE_GRACE
                    if self._accepting:
                        self._accept()  # those in the backlog: answered (refused), not reset
                    self._stop_accepting()
                    if self._sock is not None:  # new clients are refused now, not left in the backlog
                        self._sock.close()
                        self._sock = None
                if grace_ends is not None and (not self.connections or time.monotonic() >= grace_ends):
                    return
                self._step(grace_ends)
        except Exception:  # a bug of ours: into the daemon's log; the socket is gone with this thread
            log.exception("control_socket_failed")
        finally:
            for conn in list(self.connections):
                self._drop(conn)
            self.request_threads.stop()
            self._close_sockets()

    def _close_sockets(self) -> None:
        self._selector.close()
        for sock in (self._sock, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    def _step(self, grace_ends: float | None, timeout: float | None = None) -> None:
        if timeout is None:
            wake_at = [t for t in (self._next_deadline(), self._accept_again_at, grace_ends) if t is not None]
            timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
        for key, events in self._selector.select(timeout):
            conn = key.data
            try:
                if key.fileobj is self._wake_r:
                    self._take_replies()
                elif key.fileobj is self._sock:
                    self._accept()
                elif conn.closed:
                    continue  # dropped while handling an earlier event of this round
                elif events & selectors.EVENT_WRITE:
                    self._write(conn)
                else:
                    self._read(conn)
            except Exception:  # a bug of ours: into the daemon's log; the other clients go on
                log.exception("control_socket_failed")
                if isinstance(conn, Connection):
                    self._drop(conn)
        now = time.monotonic()
        if self._accept_again_at is not None and now >= self._accept_again_at and not self._closing.is_set():
            self._accept_from_now()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._deadlines)
            if not conn.closed and conn.deadline == deadline:
                self._expire(conn)

    def _next_deadline(self) -> float | None:
        while self._deadlines:
            deadline, _, conn = self._deadlines[0]
            if not conn.closed and conn.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def _set_deadline(self, conn: Connection, deadline: float | None) -> None:
        conn.deadline = deadline
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._order), conn))

    def _watch(self, conn: Connection, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        elif events == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _accept_from_now(self) -> None:
        self._accept_again_at = None
        if not self._accepting and self._sock is not None:
            self._selector.register(self._sock, selectors.EVENT_READ, None)
            self._accepting = True

    def _stop_accepting(self) -> None:
        if self._accepting and self._sock is not None:
            self._selector.unregister(self._sock)
            self._accepting = False

    def _accept(self) -> None:
        assert self._sock is not None
        while len(self.connections) < self.max_connections:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # Out of descriptors or memory: accept() would fail at once, again and again.
                log.warning("accept_failed", error=exc.strerror or str(exc))
                self._stop_accepting()
                self._accept_again_at = time.monotonic() + ACCEPT_BACKOFF
                return
            self._admit(sock)
        self._stop_accepting()  # at the cap: the rest wait in the backlog until one is closed

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            uid = peer_uid(sock)
        except OSError:  # gone already
            sock.close()
            return
        conn = Connection(sock, uid)
        self.connections.add(conn)
        self._set_deadline(conn, time.monotonic() + self.request_timeout)  # to send its first byte
        self._watch(conn, selectors.EVENT_READ)

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:  # the client closed its end, or shut down its sending side only
            if conn.frame.buffered:
                self._refuse(conn, protocol.ConnectionClosed(f"connection closed with {conn.frame.missing()}"))
            else:
                self._drop(conn)
            return
        if not conn.frame.buffered:
            self._set_deadline(conn, time.monotonic() + self.request_timeout)  # for the whole request
        try:
            body = conn.frame.feed(data)
        except protocol.FrameTooLarge as exc:
            self._refuse(conn, exc)
            return
        if body is not None:
            self._handle(conn, body)

    def _handle(self, conn: Connection, body: bytes) -> None:
        """A whole request: to a handler thread (nothing more is read meanwhile)."""
        self._watch(conn, 0)
        self._set_deadline(conn, None)
        if self._closing.is_set():  # read whole while closing: refused, nothing of it done
            conn.last_reply = True
            refusal = self._closing_refusal
            self._send(conn, protocol.error(refusal.kind, refusal.message))
        elif conn.uid not in self.allowed_uids:
            # Read whole, never acted on: closing first would fail the client's write with EPIPE
            # before it could read why it was refused.
            log.warning("client_refused", uid=conn.uid)
            conn.last_reply = True
            self._send(conn, protocol.error(errors.PermissionDenied.kind,
                                            f"user {conn.uid} may not control this daemon"))
        elif self._hand_over is not None and len(body) <= DIRECT_MAX:
            self._handle_small(conn, body)
        elif not self.request_threads.submit(lambda: self._answer(conn, lambda: self._reply_for(conn, body))):
            log.warning("client_dropped", reason="cannot start a thread")
            self._send(conn, protocol.error(errors.Busy.kind, "the daemon cannot start a thread to answer: try again"))

    def _handle_small(self, conn: Connection, body: bytes) -> None:
        """Parsed here; a write to the loop (answered by `_take_replies`), a read to a handler thread."""
        try:
            op, args = self._parse(body)
        except protocol.ProtocolError as exc:
            self._send(conn, protocol.error(exc.kind, exc.message))
            return
        assert self._hand_over is not None
        if protocol.OPERATIONS[op].runs_on_loop(args):
            future = self._hand_over(lambda: self.handle(op, args), lambda: _still_connected(conn.sock))
            if future is not None:
                conn.pending, conn.op = future, op
                self._set_deadline(conn, time.monotonic() + self.call_timeout)
                future.add_done_callback(lambda done: self._reply_later(conn, done))
                return
        if not self.request_threads.submit(lambda: self._answer(conn, lambda: self._handled(conn, op, args))):
            log.warning("client_dropped", reason="cannot start a thread")
            self._send(conn, protocol.error(errors.Busy.kind, "the daemon cannot start a thread to answer: try again"))

    def _reply_later(self, conn: Connection, answered: concurrent.futures.Future[Any]) -> None:
        """A handed-over write is answered (on the loop thread, after its commit): to the I/O thread.
        When that is the loop thread itself, it writes the reply in its `flush`, with no wake-up
        (which would only make it look at its selector once more for nothing)."""
        self._replies.put((conn, answered))
        if threading.get_ident() != self._driver:
            self._wake()

    def _refuse(self, conn: Connection, exc: protocol.ProtocolError) -> None:
        """A frame that breaks the framing: where the next one would start is unknown, so the
        refusal is the connection's last reply."""
        log.warning("bad_request", error=exc.message)
        conn.last_reply = True
        self._send(conn, protocol.error(exc.kind, exc.message))

    def _expire(self, conn: Connection) -> None:
        if conn.pending is not None:
            if conn.pending.cancel():  # not taken by the loop: withdrawn, so refused honestly
                conn.pending = None
                self._send(conn, protocol.error(errors.LoopBusy.kind, (
                    f"the daemon did not take the request within {self.call_timeout:g} s (it is busy): "
                    "nothing was done")))
            else:  # running: its answer comes with the commit of the tick it runs in
                self._set_deadline(conn, None)
        elif conn.reply is not None:
            self._drop(conn)  # it does not read its reply
        elif conn.frame.buffered:
            timeout = f"{self.request_timeout:g}"
            self._refuse(conn, protocol.ProtocolError(
                f"incomplete request: {conn.frame.missing()} after {timeout}s (a request must arrive whole "
                f"within {timeout}s of its first byte)"))
        else:
            log.debug("client_idle_closed")
            self._drop(conn)

    def _send(self, conn: Connection, reply: dict[str, Any]) -> None:
        self._start_reply(conn, protocol.encode(reply, protocol.MAX_REPLY))

    def _start_reply(self, conn: Connection, data: bytes) -> None:
        conn.reply = memoryview(data)
        self._set_deadline(conn, time.monotonic() + self.request_timeout)
        self._write(conn)
        if not conn.closed and conn.reply is not None:  # the rest when the client reads
            self._watch(conn, selectors.EVENT_WRITE)

    def _write(self, conn: Connection) -> None:
        assert conn.reply is not None
        try:
            sent = conn.sock.send(conn.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away; nothing to tell it
            self._drop(conn)
            return
        conn.reply = conn.reply[sent:]
        if not conn.reply:
            self._next_request(conn)
        elif sent:
            self._set_deadline(conn, time.monotonic() + self.request_timeout)  # it reads: give it time

    def _next_request(self, conn: Connection) -> None:
        """The reply is written: read the connection's next request (one may be in already), or
        have the next frame of a streamed reply made."""
        conn.reply = None
        if conn.stream is not None:
            stream, conn.stream = conn.stream, None
            self._watch(conn, 0)
            self._set_deadline(conn, None)  # the frame is being made: the handler's bounds apply
            if not self.request_threads.submit(lambda: self._answer_page(conn, stream)):
                log.warning("client_dropped", reason="cannot start a thread")
                self._drop(conn)  # in the middle of a reply: nothing else can be said on it
            return
        if conn.last_reply or self._closing.is_set():
            self._drop(conn)
            return
        try:
            body = conn.frame.feed()
        except protocol.FrameTooLarge as exc:
            self._refuse(conn, exc)
            return
        if body is not None:
            self._handle(conn, body)
            return
        # Idle until its next request, or cut off when it sends nothing for as long.
        self._set_deadline(conn, time.monotonic() + self.request_timeout)
        self._watch(conn, selectors.EVENT_READ)

    def _drop(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.stream is not None:  # between two frames: no handler thread holds it
            conn.stream.close()
            conn.stream = None
        if conn.pending is not None:
            conn.pending.cancel()  # nobody would hear its answer: not run, if not begun
        self._watch(conn, 0)
        conn.sock.close()
        self.connections.discard(conn)
        if not self._accepting and self._accept_again_at is None and not self._closing.is_set():
            self._accept_from_now()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop will look anyway), or closed with the loop
            pass

    def _take_replies(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, data = self._replies.get_nowait()
            except queue.Empty:
                return
            if conn.closed:
                if isinstance(data, tuple) and data[1] is not None:
                    data[1].close()  # its client is gone: the rest of its pages are never read
                continue
            if isinstance(data, concurrent.futures.Future):
                if data is not conn.pending:
                    continue  # withdrawn and refused already
                conn.pending = None
                data = self._encoded(self._outcome(conn.op, lambda: data.result(0)))
            elif isinstance(data, tuple):  # a frame of a streamed reply, and the rest of it (None: done)
                data, conn.stream = data
            if data is None:
                self._drop(conn)
            else:
                self._start_reply(conn, data)

    # --- the handler threads --------------------------------------------------------------------

    def _answer(self, conn: Connection, reply_for: Callable[[], dict[str, Any]]) -> None:
        """Run one whole request and hand its encoded reply to the I/O thread (None: close)."""
        data = None
        try:
            reply = reply_for()
            data = self._frame_of(reply) if isinstance(reply, protocol.Pages) else self._encoded(reply)
        except Exception:  # a bug of ours: into the daemon's log, never its stderr
            log.exception("client_failed")
        finally:
            self._replies.put((conn, data))
            self._wake()

    def _answer_page(self, conn: Connection, stream: protocol.Pages) -> None:
        """Make the next frame of a streamed reply and hand it to the I/O thread."""
        self._replies.put((conn, self._frame_of(stream)))
        self._wake()

    def _frame_of(self, stream: protocol.Pages) -> tuple[bytes, protocol.Pages | None]:
        """The next frame of `stream`, and the stream if more frames follow. An error making it
        is the stream's last frame."""
        last = True
        try:
            message, last = stream.next_frame()
        except FredicaError as exc:
            message = protocol.error(exc.kind, exc.message)
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("request_failed", op="stream")
            message = protocol.error(errors.InternalError.kind, f"the listing failed: {type(exc).__name__}: {exc}")
        if last:
            stream.close()
        return self._encoded(message), None if last else stream

    @staticmethod
    def _encoded(reply: dict[str, Any]) -> bytes:
        try:
            return protocol.encode(reply, protocol.MAX_REPLY)
        except protocol.ProtocolError as exc:
            return protocol.encode(protocol.error(exc.kind, f"the reply cannot be sent: {exc.message}"),
                                   protocol.MAX_REPLY)

    @staticmethod
    def _parse(body: bytes) -> tuple[str, dict[str, Any]]:
        try:
            return protocol.parse_request(protocol.decode(body))
        except protocol.ProtocolError as exc:
            log.warning("bad_request", error=exc.message)
            raise

    def _reply_for(self, conn: Connection, body: bytes) -> dict[str, Any]:
        try:
            op, args = self._parse(body)
        except protocol.ProtocolError as exc:
            return protocol.error(exc.kind, exc.message)
        return self._handled(conn, op, args)

    def _handled(self, conn: Connection, op: str, args: dict[str, Any]) -> dict[str, Any]:
        def handled() -> Any:
            with handoff.on_behalf_of(lambda: _still_connected(conn.sock)):
                return self.handle(op, args)

        return self._outcome(op, handled)

    @staticmethod
    def _outcome(op: str, handled: Callable[[], Any]) -> Any:
        """The reply for what `handled()` returns or raises (any thread); a streamed one as it is."""
        try:
            data = handled()
            return data if isinstance(data, protocol.Pages) else protocol.ok(data)
        except FredicaError as exc:
            return protocol.error(exc.kind, exc.message)
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("request_failed", op=op)
            return protocol.error(errors.InternalError.kind, f"{op} failed: {type(exc).__name__}: {exc}")
