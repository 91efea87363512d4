"""The control socket driven by the supervisor's loop thread (`serve(driven=True)`, as the daemon
runs it): what only that wiring can get wrong, found in review. Real supervisor, real socket."""

from __future__ import annotations

import socket
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon import control, faults, operations, protocol
from daemon.config import Settings
from daemon.engine.requests import CALL_TIMEOUT
from daemon.supervisor import Supervisor
from tests.conftest import wait_for


@pytest.fixture
def driven(tmp_path: Path) -> Iterator[Callable[..., tuple[Supervisor, Path]]]:
    """A supervisor whose loop thread drives its control server, wired as `service._serve` does."""
    threads: list[tuple[Supervisor, threading.Thread]] = []

    def start(wrap_hand_over: Callable[[Supervisor, Any], Any] | None = None, **options: Any) -> tuple[Supervisor, Path]:
        settings = Settings(database=tmp_path / "f.db", socket=tmp_path / "run" / "control.sock",
                            log_dir=tmp_path / "logs", executors={"ECHO": "tests.sample_executors:Echo"}, **options)
        sup = Supervisor(settings)
        handlers = operations.Handlers(sup)
        server = control.ControlServer(settings.socket, handlers.handle)
        server.bind()
        hand_over = sup.hand_over if wrap_hand_over is None else wrap_hand_over(sup, sup.hand_over)

        def loop() -> None:
            sup.bind_loop_thread()
            server.writes_to_loop(hand_over, CALL_TIMEOUT)
            server.serve(driven=True)
            sup.attach_io(server)
            try:
                sup.run()
            finally:
                server.close(faults.refusal(faults.Kind.CORRUPT) if sup.exit_status else None)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        wait_for(lambda: sup._handoff.loop_ident is not None)
        threads.append((sup, thread))
        return sup, settings.socket

    yield start
    for sup, thread in threads:
        sup.request_stop(0)
        thread.join(20)


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)  # below CALL_TIMEOUT: a request left waiting would be refused LoopBusy after it
    sock.connect(str(path))
    return sock


def test_pipelined_requests_on_one_connection_are_answered_without_waiting_for_the_next_poll(driven) -> None:
    # The second request is handed over while the loop writes the first reply (its flush), from
    # the loop's own thread: no wake-up. It must not wait for the idle poll (60 s here).
    _, path = driven(idle_poll_interval=60.0)
    first = protocol.encode(protocol.request("queue_pause", name="default"), protocol.MAX_REQUEST)
    second = protocol.encode(protocol.request("queue_resume", name="default"), protocol.MAX_REQUEST)
    with connect(path) as sock:
        sock.sendall(first + second)
        frames = protocol.FrameReader(protocol.MAX_REPLY)
        replies = [protocol.read_frame(sock, protocol.MAX_REPLY, frames) for _ in range(2)]
    assert [r["ok"] for r in replies] == [True, True], replies


def test_a_write_refused_as_corruption_ends_the_loop_is_answered_not_cut_off(driven) -> None:
    def corrupt_on_arrival(sup: Supervisor, hand_over: Any) -> Any:
        def wrapped(fn: Any, still_waiting: Any) -> Any:
            future = hand_over(fn, still_waiting)
            sup.report_corruption(sqlite3.DatabaseError("database disk image is malformed"))  # as a reader does
            return future
        return wrapped

    sup, path = driven(wrap_hand_over=corrupt_on_arrival)
    with connect(path) as sock:
        sock.sendall(protocol.encode(protocol.request("queue_pause", name="default"), protocol.MAX_REQUEST))
        reply = protocol.read_frame(sock, protocol.MAX_REPLY)
    assert reply["ok"] is False and "corrupt" in reply["error"]["message"], reply


def _count_ticks(sup: Supervisor) -> list[None]:
    """One entry per tick of the loop from now on (`run` looks `tick` up on each pass)."""
    ticks: list[None] = []
    tick = sup.tick

    def counted(now: float | None = None) -> float:
        ticks.append(None)
        return tick(now)

    sup.tick = counted  # type: ignore[method-assign]
    return ticks


def _ask(sock: socket.socket, op: str, **args: Any) -> dict[str, Any]:
    sock.sendall(protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST))
    return protocol.read_frame(sock, protocol.MAX_REPLY, protocol.FrameReader(protocol.MAX_REPLY))


def test_reads_answered_by_handler_threads_make_the_loop_tick_no_more(driven) -> None:
    # Each reply a handler thread makes wakes the loop to write it. The tick that used to follow
    # changed nothing and cost a transaction and a claim look, in front of the next request.
    sup, path = driven(idle_poll_interval=60.0, warm_spare=False)
    with connect(path) as sock:
        assert _ask(sock, "ls")["ok"]  # connected, and the start-up ticks are behind
        ticks = _count_ticks(sup)
        for _ in range(20):
            assert _ask(sock, "ls")["ok"]
            assert _ask(sock, "status")["ok"]
        assert len(ticks) <= 2, ticks  # 40 before: one per reply
        before = len(ticks)
        # A write is the loop's: it still ticks at once, its reply sent once that tick committed.
        reply = _ask(sock, "submit", tasks=[{"type": "ECHO", "payload": {"x": 1}}])
        assert reply["ok"], reply
        assert len(ticks) > before


def test_a_busy_socket_does_not_put_off_the_tick_that_is_due(driven) -> None:
    # Waited out again after a socket-only wake-up, the wait still ends when the tick is due.
    sup, path = driven(idle_poll_interval=0.2, warm_spare=False)
    with connect(path) as sock:
        ticks = _count_ticks(sup)

        def ticked_twice() -> bool:
            assert _ask(sock, "ls")["ok"]  # the socket never idle meanwhile
            return len(ticks) >= 2

        wait_for(ticked_twice, timeout=15)


def _count_whole_ticks(sup: Supervisor) -> list[None]:
    """One entry per tick that ran its own transaction (claims, attempts, deadlines) from now on."""
    ticks: list[None] = []
    whole = sup._tick

    def counted(now: float) -> float:
        ticks.append(None)
        return whole(now)

    sup._tick = counted  # type: ignore[method-assign]
    return ticks


def _status(path: Path, task_id: str) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT status FROM task WHERE id = ?", (task_id,)).fetchone()[0]


def test_submissions_that_leave_nothing_to_claim_are_not_followed_by_a_tick(driven, tmp_path: Path) -> None:
    # A producer submitting a pipeline: each task waits for one before it. The tick that followed
    # each such request looked for claims that could not be there, in front of the next request.
    sup, path = driven(idle_poll_interval=60.0, warm_spare=False)
    with connect(path) as sock:
        gate = _ask(sock, "submit", tasks=[{"type": "ECHO", "hold": True}])["data"]["tasks"][0]["id"]
        ticks = _count_whole_ticks(sup)
        waiting = []
        for n in range(20):
            reply = _ask(sock, "submit", tasks=[{"type": "ECHO", "payload": {"n": n}, "depends_on": [gate]}])
            assert reply["ok"], reply
            waiting.append(reply["data"]["tasks"][0]["id"])
        assert _ask(sock, "submit", tasks=[{"type": "ECHO", "hold": True}])["ok"]  # held: nothing to claim either
        assert len(ticks) <= 2, ticks  # 21 before: one per request
        # A task that can start at once is claimed by the tick after its request, as ever (the
        # idle poll is a minute: only that tick can start it).
        ready = _ask(sock, "submit", tasks=[{"type": "ECHO", "payload": {"now": True}}])["data"]["tasks"][0]["id"]
        wait_for(lambda: _status(tmp_path / "f.db", ready) == "completed", timeout=15)
        # Any other request ticks too: a release makes the gate claimable, and its dependents follow.
        assert _ask(sock, "release", ids=[gate])["ok"]
        wait_for(lambda: all(_status(tmp_path / "f.db", t) == "completed" for t in waiting), timeout=15)
