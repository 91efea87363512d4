"""The public Python client (SPEC §15) against the real daemon, the typed protocol it shares with
the daemon, and the fast path that answers a request before the rest of its tick."""

from __future__ import annotations

import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from daemon import client, errors, handoff, operations, protocol
from daemon.client import Client
from daemon.config import Settings
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor
from tests.conftest import wait_for
from tests.daemon_harness import Daemon

TEMPLATE = """
[templates.pair]
params = ["word"]

[templates.pair.tasks.first]
type = "ECHO"
payload = { word = "{word}" }

[templates.pair.tasks.second]
type = "ECHO"
depends_on = ["first"]
"""


@pytest.fixture
def daemon(daemons: Any) -> Daemon:
    d = daemons()
    d.config.write_text(d.config.read_text() + TEMPLATE)
    return d.start()


@pytest.fixture
def fredica(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.config) as c:
        yield c


def counting(tmp_path: Path, name: str, n: int = 10_000) -> dict[str, Any]:
    return {"n": n, "step": 0.01, "count_file": str(tmp_path / f"{name}.count"),
            "state_file": str(tmp_path / f"{name}.state")}


# --- every method -------------------------------------------------------------------------------


def test_submit_get_list_and_wait(fredica: Client) -> None:
    task_id = fredica.submit("ECHO", {"word": "hi"}, priority=3, max_retries=1, idempotency_key="k1",
                             material_id="m1", timeout=30.0)
    task = fredica.get(task_id)
    assert (task["id"], task["type"], task["priority"], task["max_retries"]) == (task_id, "ECHO", 3, 1)
    assert (task["payload"], task["idempotency_key"], task["material_id"], task["timeout"]) == (
        {"word": "hi"}, "k1", "m1", 30.0)
    [ended] = fredica.wait(task_id, timeout=20)
    assert ended["status"] == "completed" and ended["result"]["echo"] == {"word": "hi"}
    assert [t["id"] for t in fredica.list(type="ECHO", status="completed")] == [task_id]
    assert fredica.list(status="failed") == []
    # The key is free again once its task has ended; an active one resolves to its task.
    assert fredica.submit("ECHO", idempotency_key="k1") != task_id


def test_submit_depends_on_and_a_batch_as_one_run(fredica: Client) -> None:
    first = fredica.submit("ECHO")
    second = fredica.submit("ECHO", depends_on=first)
    assert fredica.get(second)["depends_on"] == [first]
    ids = fredica.submit_batch([{"type": "ECHO", "key": "a"}, '{"type": "ECHO", "depends_on": ["a"]}'])
    assert len(ids) == 2
    tasks = fredica.wait(*ids, timeout=20)
    assert [t["id"] for t in tasks] == ids and {t["workflow_run_id"] for t in tasks} == {tasks[0]["workflow_run_id"]}
    assert fredica.get(ids[1])["depends_on"] == [ids[0]]
    assert all(t["status"] == "completed" for t in fredica.wait(first, second, timeout=20))


def test_run_a_template_and_wait_for_the_run(fredica: Client) -> None:
    run_id = fredica.run("pair", word="x", material_id="film")
    run = fredica.get(run_id)
    assert run["template"] == "pair" and run["material_id"] == "film" and len(run["tasks"]) == 2
    tasks = fredica.wait(run_id, timeout=20)  # a run's id names its tasks
    assert sorted(t["status"] for t in tasks) == ["completed", "completed"]
    with pytest.raises(errors.FredicaError, match="unknown template 'nope'"):
        fredica.run("nope")


def test_pause_resume_and_cancel(fredica: Client, tmp_path: Path) -> None:
    task_id = fredica.submit("COUNT", counting(tmp_path, "c"))
    wait_for(lambda: (tmp_path / "c.count").exists(), 20)
    assert fredica.pause(task_id)["is_paused"] is True
    wait_for(lambda: (tmp_path / "c.state").exists() and (tmp_path / "c.state").read_text() == "paused")
    assert fredica.resume(task_id)["is_paused"] is False
    waiting = fredica.submit("ECHO", depends_on=[task_id])
    reports = fredica.cancel(task_id)
    assert reports == [{"id": task_id, "ok": True, "cancelled": [], "stopping": [task_id], "dependents": 1,
                        "message": f"stopping {task_id} (cancel sent to the running task); the 1 task that "
                                   "depends on it is cancelled once it stops"}]  # `waiting`, once it stops
    ended = fredica.wait(task_id, waiting, timeout=20)
    assert [t["status"] for t in ended] == ["cancelled", "cancelled"]


# --- errors: the daemon's own classes -----------------------------------------------------------


def test_refusals_are_raised_as_the_daemons_error_classes(fredica: Client, tmp_path: Path) -> None:
    missing = "0000dead-0000-4000-8000-000000000000"
    with pytest.raises(errors.UnknownTask, match=f"^no task or workflow run has id {missing}$"):
        fredica.get(missing)
    with pytest.raises(errors.UnknownTask):
        fredica.wait(missing)
    done = fredica.submit("ECHO")
    fredica.wait(done, timeout=20)
    with pytest.raises(errors.InvalidTransition, match=f"task {done} is completed"):
        fredica.cancel(done)
    with pytest.raises(errors.NotPausable):
        fredica.pause(done)
    with pytest.raises(errors.SubmissionRefused, match="priority must be between"):
        fredica.submit("ECHO", priority=10**7)
    with pytest.raises(errors.SubmissionRefused, match="batch line 2 is not valid JSON"):
        fredica.submit_batch([{"type": "ECHO"}, "{"])


def test_an_unknown_field_is_refused_before_anything_is_sent(fredica: Client) -> None:
    with pytest.raises(TypeError, match="unexpected field 'prio'"):
        fredica.submit("ECHO", prio=1)
    assert fredica.list() == []


def test_a_task_submitted_to_a_queue_is_stored_in_it_and_an_unknown_queue_is_the_daemons_refusal(
    fredica: Client,
) -> None:
    task_id = fredica.submit("ECHO", queue="default")
    assert fredica.get(task_id)["queue"] == "default"
    with pytest.raises(errors.SubmissionRefused, match="unknown queue .fast."):
        fredica.submit("ECHO", queue="fast")


@pytest.fixture(params=["UnknownTask", "InvalidTransition", "NotPausable", "DatabaseFault", "LoopBusy",
                        "PermissionDenied", "InternalError", "FrameTooLarge", "NotText"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def test_each_kind_is_raised_as_its_class_with_the_message(kind: str) -> None:
    with pytest.raises(errors.by_kind(kind)) as raised:  # type: ignore[arg-type]
        client._unwrap(protocol.error(kind, "exactly this"))
    assert type(raised.value).__name__ == kind and raised.value.message == "exactly this"
    with pytest.raises(errors.RemoteError) as unknown:
        client._unwrap(protocol.error("SomethingNew", "from a newer daemon"))
    assert (unknown.value.kind, unknown.value.message) == ("SomethingNew", "from a newer daemon")


# --- the connection -----------------------------------------------------------------------------


def control_sockets(d: Daemon) -> int:
    """The daemon's sockets on its control socket's path: the listener and each client's."""
    assert d.process is not None
    return sum(c.laddr == str(d.socket) for c in psutil.Process(d.process.pid).net_connections(kind="unix"))


def test_one_connection_carries_many_calls(daemon: Daemon, fredica: Client) -> None:
    fredica.status()
    ours = fredica._sock
    assert control_sockets(daemon) == 2  # the listener and ours
    for _ in range(50):
        fredica.submit("ECHO")
        fredica.list(limit=1)
    assert fredica._sock is ours
    assert control_sockets(daemon) == 2  # no connection opened (or left) per call


def test_a_client_reconnects_after_a_daemon_restart(daemon: Daemon, fredica: Client) -> None:
    task_id = fredica.submit("ECHO")
    daemon.stop()
    with pytest.raises(errors.DaemonUnreachable, match="not running"):
        fredica.status()
    daemon.start()
    assert fredica.get(task_id)["id"] == task_id


def test_a_connection_the_daemon_closed_when_idle_is_replaced(daemons: Any) -> None:
    d = daemons(request_timeout=0.3).start()
    with Client(d.config) as c:
        c.status()
        first = c._sock
        assert first is not None and select.select([first], [], [], 10)[0]  # the daemon closed it
        assert first.recv(1) == b""
        c.submit("ECHO")
        assert c._sock is not first


class OneShotServer:
    """Reads requests; answers `status` on its first connection, then hangs up on a `submit`
    without a reply: its reply is lost. Counts what it received."""

    def __init__(self, path: Path) -> None:
        self.received: list[str] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self.listener.settimeout(10)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.listener.accept()
                with conn:
                    frames = protocol.FrameReader(protocol.MAX_REQUEST)
                    while True:
                        try:
                            op, _ = protocol.parse_request(protocol.read_frame(conn, protocol.MAX_REQUEST, frames))
                        except protocol.ConnectionClosed:
                            break
                        self.received.append(op)
                        if op != "status":
                            break  # hang up: the reply is lost
                        conn.sendall(protocol.encode(protocol.ok({"pid": 1}), protocol.MAX_REPLY))
        except OSError:
            return


def test_a_write_whose_reply_was_lost_is_never_sent_again(tmp_path: Path) -> None:
    server = OneShotServer(tmp_path / "s.sock")
    with Client(socket_path=tmp_path / "s.sock", timeout=5) as c:
        assert c.status() == {"pid": 1}
        with pytest.raises(errors.DaemonUnreachable, match="the submit may or may not have been done"):
            c.submit("ECHO")
        assert server.received == ["status", "submit"]  # once
        assert c.status() == {"pid": 1}  # a new connection for the next call
    server.listener.close()


def test_a_request_the_protocol_refuses_is_not_sent(tmp_path: Path) -> None:
    server = OneShotServer(tmp_path / "s.sock")
    with Client(socket_path=tmp_path / "s.sock", timeout=5) as c:
        with pytest.raises(protocol.ProtocolError, match="bad arguments for ls: limit must be int | None, not \"x\""):
            c.list(limit="x")
        with pytest.raises(protocol.ProtocolError, match="ls does not take \"colour\""):
            c.list(colour="red")
        with pytest.raises(protocol.ProtocolError, match="unknown request \"frobnicate\""):
            c.call("frobnicate")
    assert server.received == []
    server.listener.close()


# --- wait ---------------------------------------------------------------------------------------


def test_wait_honours_its_timeout_and_says_where_the_tasks_are(fredica: Client, tmp_path: Path) -> None:
    task_id = fredica.submit("HANG", {"ready_file": str(tmp_path / "ready")})
    wait_for((tmp_path / "ready").exists, 20)
    started = time.monotonic()
    with pytest.raises(errors.WaitTimedOut, match="1 of 1 tasks still active after 0.4s") as raised:
        fredica.wait(task_id, timeout=0.4)
    assert 0.4 <= time.monotonic() - started < 3
    assert isinstance(raised.value, TimeoutError) and raised.value.tasks[0]["status"] == "running"
    fredica.cancel(task_id)
    assert fredica.wait(task_id, timeout=20)[0]["status"] == "cancelled"


def test_wait_is_woken_by_commits_not_by_polling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sup = Supervisor(Settings(database=tmp_path / "f.db", socket=tmp_path / "s", log_dir=tmp_path / "logs",
                              executors={"HANG": "tests.sample_executors:Hang"}, max_workers=1,
                              poll_interval=0.5, cancel_grace=0.3))
    sup.start()
    try:
        handlers = operations.Handlers(sup)
        task_ids = [sup.submit([parse_spec({"type": "HANG", "payload": {"ready_file": str(tmp_path / "r")}})]).tasks[0].id
                    for _ in range(20)]
        wait_for((tmp_path / "r").exists)
        reads: list[str] = []
        find = operations.tasks.find

        def counted(conn: Any, task_id: str) -> Any:
            if threading.current_thread().name == "waiter":
                reads.append(task_id)
            return find(conn, task_id)

        monkeypatch.setattr(operations.tasks, "find", counted)
        reply: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: reply.update(handlers.op_wait(task_ids, timeout=9)), name="waiter")
        waiter.start()
        wait_for(lambda: len(reads) >= 20)  # each task read once, at first
        commits = sup.commits()
        wait_for(lambda: sup.commits() >= commits + 3)  # the loop ticks (every poll_interval) ...
        assert waiter.is_alive()
        # ... and each commit costs the wait one read, of the first task still active, not 20.
        assert len(reads) - 20 <= sup.commits() - commits + 1
        assert set(reads[20:]) <= {task_ids[0]}
        for task_id in task_ids:
            sup.cancel(task_id)
        waiter.join(10)
        assert reply["ended"] and {t["status"] for t in reply["tasks"]} == {"cancelled"}, [t["status"] for t in reply["tasks"]]
    finally:
        sup.stop(grace=0, timeout=20)


# --- the fast path ------------------------------------------------------------------------------


def test_a_request_is_answered_while_a_process_start_of_its_tick_is_under_way(tmp_path: Path) -> None:
    sup = Supervisor(Settings(database=tmp_path / "f.db", socket=tmp_path / "s", log_dir=tmp_path / "logs",
                              executors={"ECHO": "tests.sample_executors:Echo"}, max_workers=1))
    starting, release = threading.Event(), threading.Event()
    take = sup.idle.take

    def slow_take(*args: Any, **kwargs: Any) -> Any:  # the process start of the task just submitted
        starting.set()
        release.wait(20)
        return take(*args, **kwargs)

    sup.idle.take = slow_take  # type: ignore[method-assign]
    sup.start()
    try:
        answered = threading.Event()
        thread = threading.Thread(target=lambda: (sup.submit([parse_spec({"type": "ECHO"})]), answered.set()))
        thread.start()
        assert starting.wait(20)
        # The submission's own tick is still starting a process for it; its answer came already.
        assert answered.wait(10) and not release.is_set()
    finally:
        release.set()
        sup.stop(grace=0, timeout=20)


def test_requests_that_arrive_together_share_one_commit(tmp_path: Path) -> None:
    sup = Supervisor(Settings(database=tmp_path / "f.db", socket=tmp_path / "s", log_dir=tmp_path / "logs",
                              executors={"ECHO": "tests.sample_executors:Echo"}, max_workers=1))
    sup.bind_loop_thread()  # calls now wait for ticks this test makes on this thread
    done: list[Any] = []
    callers = [threading.Thread(target=lambda: done.append(sup.submit([parse_spec({"type": "ECHO"})])))
               for _ in range(5)]
    for caller in callers:
        caller.start()
    wait_for(lambda: sup._handoff.pending() == 5)
    commits = sup.commits()
    sup.tick()
    for caller in callers:
        caller.join(10)
    assert len(done) == 5
    assert sup.commits() == commits + 2  # the requests' one, then the rest of the tick's
    sup.idle.dismiss_all()


# --- the protocol -------------------------------------------------------------------------------


def test_the_operations_table_checks_names_presence_and_types() -> None:
    wait = protocol.OPERATIONS["wait"]
    wait.check({"ids": ["a"], "timeout": 1})
    wait.check({"ids": ["a"], "timeout": 0.5})
    for args, message in [
        ({}, "bad arguments for wait: ids is required"),
        ({"ids": "a"}, 'ids must be list[str], not "a"'),
        ({"ids": ["a"], "timeout": True}, "timeout must be float | None, not true"),
        ({"ids": ["a"], "other": 1}, 'wait does not take "other"'),
    ]:
        with pytest.raises(protocol.ProtocolError, match=message.replace("[", r"\[").replace("|", r"\|")):
            wait.check(args)
    writes = {name for name, op in protocol.OPERATIONS.items() if op.writes}
    assert writes == {"submit", "run", "cancel", "pause", "resume", "hold", "release", "priority", "retry",
                      "restarts_dismiss", "restarts_recreate", "queue_pause", "queue_resume", "queue_workers"}


def test_a_frame_reader_keeps_what_came_after_a_frame() -> None:
    two = protocol.encode(protocol.request("status"), 100) + protocol.encode(protocol.request("show", id="x"), 100)
    frames = protocol.FrameReader(100)
    assert frames.feed(two[:3]) is None
    assert protocol.decode(frames.feed(two[3:]))["op"] == "status"  # type: ignore[arg-type]
    assert protocol.decode(frames.feed())["args"] == {"id": "x"}  # type: ignore[arg-type]
    assert frames.feed() is None and not frames.buffered


def test_the_daemon_answers_requests_sent_back_to_back_on_one_connection(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(daemon.socket))
        sock.sendall(protocol.encode(protocol.request("status"), protocol.MAX_REQUEST)
                     + protocol.encode(protocol.request("ls"), protocol.MAX_REQUEST))
        frames = protocol.FrameReader(protocol.MAX_REPLY)
        first = protocol.read_frame(sock, protocol.MAX_REPLY, frames)
        second = protocol.read_frame(sock, protocol.MAX_REPLY, frames)
    assert first["ok"] and "pid" in first["data"] and second == protocol.ok([])


def test_requester_waiting_without_a_requester_is_true() -> None:
    assert handoff.requester_waiting()
    with handoff.on_behalf_of(lambda: False):
        assert not handoff.requester_waiting()
