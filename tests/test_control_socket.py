"""The control socket under idle, slow and many clients (SPEC §13): a request must arrive whole
within `request_timeout` of its first byte, a connection that sends nothing is closed after as
long, and with 200 such connections open `fredica status` still answers within a second. Also
the server's own limits: handler threads, the connection cap, accept failures, closing."""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from daemon import cli, control, errors, protocol
from tests.conftest import wait_for

STATUS = protocol.encode(protocol.request("status"), protocol.MAX_REQUEST)
EARLY = 0.05  # two processes read one monotonic clock; this is only rounding
SLACK = 3.0  # how late a cut-off may come on a loaded 2-core machine, and still be "after as long"


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)  # a full backlog fails the connect at once (EAGAIN) rather than waiting
    sock.connect(str(path))
    return sock


class Trickler(threading.Thread):
    """Sends each socket a frame that announces 1,000 bytes, one byte per round, until stopped:
    a client that is always just about to finish its request."""

    def __init__(self, socks: list[socket.socket], pace: float) -> None:
        super().__init__(daemon=True)
        self.socks, self.pace = socks, pace
        self.first_byte_at: dict[socket.socket, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        data = (1000).to_bytes(protocol.HEADER, "big") + b"{" * 1000
        sent = dict.fromkeys(self.socks, 0)
        while not self.stop.is_set() and sent:
            for sock in list(sent):
                try:
                    sock.send(data[sent[sock] : sent[sock] + 1])
                except OSError:  # cut off by the daemon
                    del sent[sock]
                    continue
                self.first_byte_at.setdefault(sock, time.monotonic())
                sent[sock] += 1
            self.stop.wait(self.pace)  # the pace of a slow client, not a wait for anything


def outcomes(socks: list[socket.socket], timeout: float) -> dict[socket.socket, tuple[float, bytes]]:
    """For each socket, when the daemon closed it and what it had sent before."""
    selector = selectors.DefaultSelector()
    received: dict[socket.socket, bytes] = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        received[sock] = b""
    ended: dict[socket.socket, tuple[float, bytes]] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < len(socks) and time.monotonic() < deadline:
        for key, _ in selector.select(deadline - time.monotonic()):
            sock = key.fileobj
            try:
                data = sock.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data  # type: ignore[index]
            else:
                ended[sock] = (time.monotonic(), received[sock])  # type: ignore[index]
                selector.unregister(sock)
    selector.close()
    return ended


def reply_of(data: bytes) -> dict[str, Any]:
    body = protocol.FrameReader(protocol.MAX_REPLY).feed(data)
    assert body is not None, data
    return protocol.decode(body)


def test_idle_and_trickling_connections_neither_delay_status_nor_stay_open(daemons) -> None:
    timeout = 2.0
    d = daemons(request_timeout=timeout).start()
    opened_at = time.monotonic()
    idle = [connect(d.socket) for _ in range(100)]
    connected_at = time.monotonic()
    trickling = [connect(d.socket) for _ in range(100)]
    trickler = Trickler(trickling, pace=0.1)
    trickler.start()
    try:
        wait_for(lambda: len(trickler.first_byte_at) == len(trickling))
        runner = CliRunner()
        for _ in range(3):
            started = time.monotonic()
            result = runner.invoke(cli.main, ["--config", str(d.config), "status", "--json"])
            assert result.exit_code == 0, result.output
            assert time.monotonic() - started < 1.0
        # All 200 were open while status was asked: none had been there for request_timeout yet.
        assert time.monotonic() - opened_at < timeout, "too slow a machine to measure with 200 open"

        ended = outcomes(idle + trickling, timeout=timeout + 20)
        assert len(ended) == len(idle) + len(trickling), "some connections were never closed"
        for sock in idle:
            closed_at, sent = ended[sock]
            assert sent == b""  # nothing to answer: closed without a word
            assert timeout - EARLY <= closed_at - connected_at <= timeout + SLACK
        for sock in trickling:
            closed_at, sent = ended[sock]
            reply = reply_of(sent)
            assert reply["ok"] is False and reply["error"]["kind"] == "ProtocolError", reply
            assert "incomplete request" in reply["error"]["message"], reply
            # Measured from the first byte: a byte now and then does not buy more time.
            assert timeout - EARLY <= closed_at - trickler.first_byte_at[sock] <= timeout + SLACK
    finally:
        trickler.stop.set()
        for sock in idle + trickling:
            sock.close()
    assert d.data("status")["pid"] == d.process.pid


@pytest.fixture
def serve(tmp_path: Path) -> Any:
    """Starts ControlServers on tmp_path with a given handler; closes them at the end."""
    servers: list[control.ControlServer] = []

    def start(handle: Callable[[str, dict[str, Any]], Any], **options: Any) -> control.ControlServer:
        server = control.ControlServer(tmp_path / f"c{len(servers)}.sock", handle, **options)
        server.bind()
        server.serve()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def exchange(path: Path, data: bytes = STATUS, pieces: int = 1) -> dict[str, Any]:
    with connect(path) as sock:
        sock.settimeout(20)
        step = -(-len(data) // pieces)
        for start in range(0, len(data), step):
            sock.sendall(data[start : start + step])
        return protocol.read_frame(sock, protocol.MAX_REPLY)


def test_a_request_that_arrives_in_pieces_is_handled_once_whole(serve) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    server = serve(lambda op, args: seen.append((op, args)) or {"n": len(seen)})
    data = protocol.encode(protocol.request("show", id="x" * 3000), protocol.MAX_REQUEST)
    assert exchange(server.path, data, pieces=len(data)) == protocol.ok({"n": 1})  # a byte at a time
    assert seen == [("show", {"id": "x" * 3000})]


def test_at_most_handler_threads_run_at_once_and_the_rest_wait_read_whole() -> None:
    threads = control.HandlerThreads(2)
    entered: list[int] = []
    release = threading.Event()
    finished = threading.Semaphore(0)

    def job(number: int) -> Callable[[], None]:
        def run() -> None:
            entered.append(number)
            release.wait(30)
            finished.release()
        return run

    try:
        for number in range(3):
            assert threads.submit(job(number))
        wait_for(lambda: len(entered) == 2)
        assert threads.started == 2 and len(entered) == 2  # the third waits for a thread
        release.set()
        for _ in range(3):
            assert finished.acquire(timeout=30)
        assert sorted(entered) == [0, 1, 2] and threads.started == 2
    finally:
        release.set()
        threads.stop()


def test_no_thread_to_be_had_gets_a_reply_and_the_socket_goes_on(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve(lambda op, args: {"op": op})
    real_thread = threading.Thread
    refuse = threading.Event()

    class Thread(real_thread):  # type: ignore[misc, valid-type]
        def start(self) -> None:
            if refuse.is_set():
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(control.threading, "Thread", Thread)
    refuse.set()
    reply = exchange(server.path)
    assert reply["ok"] is False and reply["error"]["kind"] == "Busy", reply
    refuse.clear()
    assert exchange(server.path) == protocol.ok({"op": "status"})
    refuse.set()  # a thread there is serves the next request, though no new one can start
    assert exchange(server.path) == protocol.ok({"op": "status"})
    assert server.request_threads.started == 1


def test_past_the_connection_cap_clients_wait_in_the_backlog_until_one_is_closed(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "MAX_CONNECTIONS", 3)
    timeout = 0.5
    server = serve(lambda op, args: {}, request_timeout=timeout)
    assert server.max_connections == 3
    idle = [connect(server.path) for _ in range(3)]
    connected_at = time.monotonic()
    try:
        assert exchange(server.path) == protocol.ok({})  # accepted once an idle one was closed
        assert time.monotonic() - connected_at >= timeout - EARLY
    finally:
        for sock in idle:
            sock.close()


def test_a_failed_accept_stops_accepting_for_a_while_rather_than_spin(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Out of file descriptors, accept() fails at once, again and again: a loop that retried at
    # once would burn a CPU until a descriptor came free.
    failures_at: list[float] = []
    real_accept = socket.socket.accept

    def accept(self: socket.socket) -> Any:
        if len(failures_at) < 3:
            failures_at.append(time.monotonic())
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(self)

    monkeypatch.setattr(socket.socket, "accept", accept)
    server = serve(lambda op, args: {})
    assert exchange(server.path) == protocol.ok({})  # served after three failures
    gaps = [later - earlier for earlier, later in zip(failures_at, failures_at[1:])]
    assert len(failures_at) == 3 and all(gap >= control.ACCEPT_BACKOFF - 0.01 for gap in gaps), gaps


def test_closing_lets_the_replies_being_prepared_go_out(serve) -> None:
    entered, release = threading.Event(), threading.Event()

    def handle(op: str, args: dict[str, Any]) -> Any:
        entered.set()
        release.wait(30)
        return {"done": True}

    server = serve(handle)
    replies: list[dict[str, Any]] = []
    client = threading.Thread(target=lambda: replies.append(exchange(server.path)))
    client.start()
    assert entered.wait(30)
    closing = threading.Thread(target=server.close)
    closing.start()
    wait_for(lambda: not server.path.exists() or server._closing.is_set())
    release.set()
    client.join(30)
    closing.join(30)
    assert replies == [protocol.ok({"done": True})]
    with pytest.raises(OSError):
        connect(server.path)  # and nothing is accepted any more


def test_a_request_still_arriving_while_the_server_closes_is_refused_not_cut_off(serve) -> None:
    seen: list[str] = []
    server = serve(lambda op, args: seen.append(op) or {})
    half = len(STATUS) // 2
    with connect(server.path) as sock:
        sock.settimeout(20)
        sock.sendall(STATUS[:half])
        wait_for(lambda: any(c.frame.buffered for c in list(server.connections)))
        closing = threading.Thread(target=server.close, args=(errors.ShuttingDown("going down: nothing was done"),))
        closing.start()
        wait_for(server._closing.is_set)
        sock.sendall(STATUS[half:])
        reply = protocol.read_frame(sock, protocol.MAX_REPLY)
        closing.join(10)
    assert reply["ok"] is False and reply["error"] == {"kind": "ShuttingDown", "message": "going down: nothing was done"}
    assert seen == []  # never handled
