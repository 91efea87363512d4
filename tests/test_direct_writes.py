"""Write requests handed straight from the control socket's I/O thread to the loop (`writes_to_loop`):
answered only once the loop's commit lands, several in one commit, withdrawn when the loop does not
take them in time; reads still run on the handler threads. The test thread plays the loop
(`bind_loop_thread`, then `tick`), so that what happens before and after the commit can be seen."""

from __future__ import annotations

import select
import socket
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon import control, operations, protocol
from daemon.config import Settings
from daemon.store import db
from daemon.supervisor import Supervisor
from tests.conftest import wait_for


class Setup:
    def __init__(self, tmp_path: Path, call_timeout: float) -> None:
        self.sup = Supervisor(Settings(database=tmp_path / "fredica.db", socket=tmp_path / "control.sock",
                                       log_dir=tmp_path / "logs", executors={"ECHO": "tests.sample_executors:Echo"}))
        self.sup.bind_loop_thread()  # this test's thread is the loop: nothing runs until it ticks
        handlers = operations.Handlers(self.sup)
        self.server = control.ControlServer(tmp_path / "control.sock", handlers.handle)
        self.server.writes_to_loop(self.sup.hand_over, call_timeout)
        self.server.bind()
        self.server.serve()
        self.reader = db.connect(tmp_path / "fredica.db")

    def send(self, op: str, **args: Any) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(20)
        sock.connect(str(self.server.path))
        sock.sendall(protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST))
        return sock

    def stored_tasks(self) -> int:
        return self.reader.execute("SELECT count(*) FROM task").fetchone()[0]

    def close(self) -> None:
        self.server.close()
        self.sup.request_stop(grace=0)
        self.sup.run()
        self.reader.close()


@pytest.fixture
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Setup]:
    s = Setup(tmp_path, getattr(request, "param", 20.0))
    yield s
    s.close()


def answered(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def record_commits(conn: sqlite3.Connection, socks: list[socket.socket]) -> list[tuple[str, list[bool]]]:
    """Every statement of the loop's connection, with, at each COMMIT, which clients had a reply."""
    seen: list[tuple[str, list[bool]]] = []

    def trace(statement: str) -> None:
        seen.append((statement, [answered(s) for s in socks] if statement == "COMMIT" else []))

    conn.set_trace_callback(trace)
    return seen


def test_a_write_is_answered_from_the_io_thread_once_its_commit_lands(setup: Setup) -> None:
    sock = setup.send("submit", tasks=[{"type": "ECHO"}])
    wait_for(lambda: setup.sup._handoff.pending() == 1)  # handed to the loop, not yet run
    assert not answered(sock) and setup.stored_tasks() == 0
    seen = record_commits(setup.sup.conn, [sock])

    setup.sup.tick()

    commits = [flags for statement, flags in seen if statement == "COMMIT"]
    assert commits and commits[0] == [False]  # not answered before its transaction was committed
    reply = protocol.read_frame(sock, protocol.MAX_REPLY)
    assert reply["ok"] is True and reply["data"]["tasks"][0]["created"] is True, reply
    assert setup.stored_tasks() == 1
    assert setup.server.request_threads.started == 0  # no handler thread was involved
    sock.close()


def test_several_writes_handed_over_together_share_one_commit(setup: Setup) -> None:
    socks = [setup.send("submit", tasks=[{"type": "ECHO"}]) for _ in range(3)]
    wait_for(lambda: setup.sup._handoff.pending() == 3)
    seen = record_commits(setup.sup.conn, socks)

    setup.sup.tick()

    statements = [statement for statement, _ in seen]
    first_commit = statements.index("COMMIT")
    assert sum(s.lstrip().startswith("INSERT INTO task ") for s in statements[:first_commit]) == 3
    assert seen[first_commit][1] == [False, False, False]
    ids = set()
    for sock in socks:
        reply = protocol.read_frame(sock, protocol.MAX_REPLY)
        assert reply["ok"] is True, reply
        ids.add(reply["data"]["tasks"][0]["id"])
        sock.close()
    assert len(ids) == 3 and setup.stored_tasks() == 3


@pytest.mark.parametrize("setup", [0.2], indirect=True)
def test_a_write_the_loop_does_not_take_in_time_is_withdrawn_and_refused(setup: Setup) -> None:
    sock = setup.send("submit", tasks=[{"type": "ECHO"}])
    reply = protocol.read_frame(sock, protocol.MAX_REPLY)  # the loop never ticked
    assert reply["ok"] is False and reply["error"]["kind"] == "LoopBusy", reply
    assert "nothing was done" in reply["error"]["message"]

    setup.sup.tick()  # the loop comes at last, and finds the request withdrawn

    assert setup.stored_tasks() == 0
    sock.close()


def test_a_bad_write_is_refused_by_the_io_thread_without_the_loop(setup: Setup) -> None:
    sock = setup.send("submit", tasks=[{"type": "ECHO"}], bogus=1)
    reply = protocol.read_frame(sock, protocol.MAX_REPLY)
    assert reply["ok"] is False and reply["error"]["kind"] == "ProtocolError", reply
    assert setup.sup._handoff.pending() == 0 and setup.server.request_threads.started == 0
    sock.close()


def test_reads_still_run_on_handler_threads_while_the_loop_is_busy(setup: Setup) -> None:
    sock = setup.send("ls")
    reply = protocol.read_frame(sock, protocol.MAX_REPLY)  # the loop never ticks
    assert reply == protocol.ok([])
    assert setup.server.request_threads.started == 1
    sock.close()
