"""The real daemon as a subprocess: recovery after kill -9, single owner, the socket's defences."""

from __future__ import annotations

import datetime
import inspect
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from pathlib import Path
from typing import Callable

import psutil
import pytest

from daemon import client, control, operations, processes, protocol, recovery
from daemon.engine import requests
from daemon.errors import FredicaError
from daemon.store import db, tasks
from daemon.submission import parse_spec
from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests import store_steps


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill9_then_restart_recovers_as_spec_9_says(daemons, tmp_path: Path) -> None:
    d = daemons().start()
    ready = [tmp_path / "ready1", tmp_path / "ready2"]
    pid_file = tmp_path / "grandchild.pid"
    hang = d.submit("HANG", payload={"ready_file": str(ready[0])})
    grand = d.data("submit", tasks=[
        {"type": "GRANDCHILD", "key": "g", "payload": {"pid_file": str(pid_file)}},
        {"type": "ECHO", "depends_on": ["g"]},
    ])["tasks"]
    grand_id, dependent_id = grand[0]["id"], grand[1]["id"]
    waiting = d.submit("ECHO", payload={"queued": True})  # both worker slots are busy: it waits
    wait_for(lambda: ready[0].exists() and pid_file.exists())
    executor_pids = [d.task(hang)["executor_pid"], d.task(grand_id)["executor_pid"]]
    grandchild_pid = int(pid_file.read_text())
    launchers = {psutil.Process(pid).ppid() for pid in executor_pids}  # each waits for its attempt
    assert d.process is not None
    daemon = psutil.Process(d.process.pid)
    family = {p.pid for p in daemon.children(recursive=True)}
    helpers = {p.pid for p in daemon.children()}  # the fork server and the resource tracker
    idle = family - {*executor_pids, grandchild_pid, *launchers, *helpers}
    assert len(idle) == 2  # the warm spare launcher and the fork it keeps waiting

    d.kill9()
    # Every executor process ends with the supervisor (SPEC §13): those with no task, and those
    # running one, with their trees (the tasks' own test: tests/test_daemon_death.py).
    for pid in [*idle, *executor_pids, grandchild_pid, *launchers]:
        wait_for(lambda: gone(pid), timeout=5)

    d.start()
    for task_id in (hang, grand_id):
        task = d.task(task_id)
        assert task["status"] == "failed" and task["error_type"] == "INTERRUPTED"
    dependent = d.task(dependent_id)
    assert dependent["status"] == "cancelled" and dependent["error_type"] == "DEPENDENCY_FAILED"
    # The task that was waiting is untouched by recovery and runs now.
    assert d.wait_task(waiting, "completed")["retry_count"] == 0
    entries = d.data("restarts")
    assert sorted(e["task_id"] for e in entries) == sorted([hang, grand_id])
    assert {e["status_at_restart"] for e in entries} == {"running"}
    assert len({e["session_id"] for e in entries}) == 1
    assert {e["disposition"] for e in entries} == {"pending_review"}
    run = d.data("show", id=d.task(hang)["workflow_run_id"])["object"]
    assert run["status"] == "failed" and run["completed_at"] is not None
    # New work runs.
    assert d.wait_task(d.submit("ECHO"), "completed")

    # Recreate brings back the interrupted task and the dependent its failure cancelled.
    entry = next(e for e in entries if e["task_id"] == grand_id)
    pid_file.unlink()
    [recreated] = d.data("restarts_recreate", ids=[str(entry["id"])])["results"]
    assert recreated["ok"] and recreated["id"] == str(entry["id"])
    new_run = d.data("show", id=recreated["run_id"])["object"]
    assert [t["type"] for t in new_run["tasks"]] == ["GRANDCHILD", "ECHO"]
    assert new_run["tasks"][1]["depends_on"] == [new_run["tasks"][0]["id"]]
    listed = {e["id"]: e for e in d.data("restarts", all=True)}
    assert listed[entry["id"]]["disposition"] == "recreated"
    assert listed[entry["id"]]["new_workflow_run_id"] == recreated["run_id"]
    wait_for(pid_file.exists)
    d.data("cancel", ids=[recreated["run_id"]])
    assert d.wait_task(new_run["tasks"][0]["id"], "cancelled")
    other = next(e for e in entries if e["task_id"] == hang)
    [dismissed] = d.data("restarts_dismiss", ids=[str(other["id"])])["results"]
    assert dismissed == {"id": str(other["id"]), "ok": True, "message": f"dismissed {other['id']}", "task_id": hang}
    [again] = d.data("restarts_dismiss", ids=[str(other["id"])])["results"]
    assert not again["ok"] and "already dismissed" in again["message"]  # already resolved
    assert d.data("restarts") == []

    # A second restart supersedes nothing already resolved, and logs nothing new: no task ran.
    assert d.stop() == 0
    d.start()
    assert d.data("restarts") == []


def test_a_reused_pid_is_never_touched(db_path: Path) -> None:
    conn = db.open_database(db_path)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        task_id = tasks.submit(conn, [parse_spec({"type": "X"})], now=1.0).tasks[0].id
        store_steps.claim_next(conn, 1.0)
        real_start = psutil.Process(bystander.pid).create_time()
        # Recorded as the executor's pid, but with another start time: the pid was reused.
        tasks.start(conn, task_id, now=1.0, executor_pid=bystander.pid, executor_started_at=real_start - 100)
        assert processes.find_leftover(bystander.pid, real_start - 100) is None
        report = recovery.recover(conn, now=2.0, kill_grace=0.1)
        assert report.leftover_processes == 0 and report.interrupted == 1
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        conn.close()


def test_orphans_fail_at_startup(db_path: Path) -> None:
    conn = db.open_database(db_path)
    conn.execute("PRAGMA foreign_keys = OFF")  # how an orphan comes to exist: a tool without FKs
    conn.execute(
        "INSERT INTO task (id, type, workflow_run_id, status, created_at) VALUES ('o', 'X', 'gone', 'pending', 0)"
    )
    conn.execute("PRAGMA foreign_keys = ON")
    report = recovery.recover(conn, now=5.0)
    assert report.orphaned == 1
    task = tasks.get(conn, "o")
    assert task.status.value == "failed" and task.error_type == "ORPHANED"
    conn.close()


def test_a_second_daemon_on_the_same_database_refuses(daemons) -> None:
    first = daemons().start()
    second = daemons("d")  # the same config, so the same database
    second.start(wait=False)
    assert second.process.wait(20) == 1
    out = second.output.read_text()
    assert f"pid {first.process.pid}" in out and "already owns the database" in out
    assert first.data("status")["pid"] == first.process.pid


def test_a_second_daemon_on_another_database_leaves_the_first_ones_socket(daemons) -> None:
    first = daemons("a").start()
    second = daemons("b", socket=first.socket)  # two configs naming one socket
    second.start(wait=False)
    assert second.process.wait(20) == 1
    assert "another daemon is listening on" in second.output.read_text()
    assert first.data("status")["pid"] == first.process.pid  # still reachable: its socket is intact


def test_a_socket_whose_listener_is_too_busy_to_accept_is_not_taken_for_stale(tmp_path: Path) -> None:
    # A live daemon whose listen backlog is full refuses a connect at once (EAGAIN), like a
    # stale socket does (ECONNREFUSED): only the latter may be replaced.
    path = tmp_path / "busy.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    queued = []
    try:
        while True:  # fill the backlog: nobody accepts
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            queued.append(client)
            try:
                client.connect(str(path))
            except BlockingIOError:
                break
        server = control.ControlServer(path, lambda op, args: None)
        with pytest.raises(FredicaError, match="another daemon is listening"):
            server.bind()
        assert stat.S_ISSOCK(path.lstat().st_mode)  # left in place
    finally:
        for client in queued:
            client.close()
        listener.close()
    stale = control.ControlServer(path, lambda op, args: None)  # nobody listens any more
    stale.bind()
    stale.close()


@pytest.mark.parametrize("way_in", ["console script", "python -m daemon"])
def test_executor_processes_do_not_carry_the_cli(daemons, way_in: str) -> None:
    # multiprocessing runs the parent's main script again in each child; as the `fredica` console
    # script that would import the CLI into every launcher, whose pages each fork then copies.
    command = [str(console_script())] if way_in == "console script" else None
    d = daemons(max_workers=1).start(command=command)
    modules = ["daemon.cli", "click", "daemon.render", "daemon.supervisor", "sqlite3", "structlog"]
    task = d.wait_task(d.submit("IMPORTED", payload={"modules": modules}), "completed")
    assert task["result"] == {"imported": []}


def console_script() -> Path:
    """This interpreter's `fredica` script (installed by the README's test command)."""
    for candidate in (Path(sysconfig.get_path("scripts")) / "fredica", Path(sys.executable).with_name("fredica")):
        if candidate.exists():
            return candidate
    found = shutil.which("fredica")
    assert found is not None, "the fredica console script is not installed"
    return Path(found)


def test_only_the_console_script_is_kept_from_running_again_in_children(monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon import cli, service

    template = types.ModuleType("__main__")
    template.__dict__.update(re=re, sys=sys, main=cli.main)
    monkeypatch.setitem(sys.modules, "__main__", template)
    service._children_skip_the_cli()
    assert template.__spec__ is not None and template.__spec__.name == "daemon.__main__"

    own_script = types.ModuleType("__main__")  # defines what its children may need
    own_script.__dict__.update(sys=sys, main=cli.main, MyExecutor=object)
    monkeypatch.setitem(sys.modules, "__main__", own_script)
    service._children_skip_the_cli()
    assert own_script.__spec__ is None


def test_socket_and_directory_modes(daemons) -> None:
    old_umask = os.umask(0o022)  # the usual one: what the daemon makes must not depend on it
    try:
        d = daemons().start()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(d.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.socket.parent.stat().st_mode) == 0o700
    # Payloads (credentials in a DOWNLOAD's headers), results and logs: the daemon user's alone.
    d.wait_task(d.submit("ECHO", payload={"secret": "s3cret"}), "completed")
    for directory in (d.database.parent, d.log_dir, d.log_dir / "tasks"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for file in (d.database, d.database.with_name("fredica.db-wal"), d.log_dir / "daemon.log",
                 *(d.log_dir / "tasks").iterdir()):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def status_as_nobody(path: Path) -> str:
    """Ask the daemon for its status from a forked child running as user nobody."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, report through the pipe, leave at once
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                try:
                    sock.connect(str(path))
                except PermissionError:
                    outcome = "EACCES"
                else:
                    sock.sendall(protocol.encode(protocol.request("status"), protocol.MAX_REQUEST))
                    reply = protocol.read_frame(sock, protocol.MAX_REPLY)
                    outcome = "ok" if reply["ok"] else reply["error"]["kind"]
        except BaseException as exc:
            outcome = f"error {exc!r}"
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_client_running_as_another_user_is_refused(daemons) -> None:
    # Under a world-traversable directory, so that only the daemon's own modes keep nobody out.
    public = Path(tempfile.mkdtemp(prefix="fredica-socket-", dir="/tmp"))  # nobody can reach /tmp, not every TMPDIR
    try:
        public.chmod(0o755)
        d = daemons(socket=public / "run" / "control.sock").start()
        # With the modes as the daemon made them, the file system already refuses.
        assert status_as_nobody(d.socket) == "EACCES"
        # Loosen them: the peer-credential check still refuses.
        os.chmod(d.socket.parent, 0o755)
        os.chmod(d.socket, 0o666)
        assert status_as_nobody(d.socket) == "PermissionDenied"
        assert d.process.poll() is None and d.data("status")["pid"] == d.process.pid
    finally:
        shutil.rmtree(public, ignore_errors=True)


def raw_exchange(path: Path, payload: bytes, shutdown: bool = True) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(path))
        sock.sendall(payload)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        return protocol.read_frame(sock, protocol.MAX_REPLY)


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def test_garbage_oversized_and_half_written_frames(daemons) -> None:
    d = daemons().start()
    before = d.data("status")["counts"]
    cases = {
        "not json": frame(b"{not json"),
        "not an object": frame(b"[1, 2]"),
        "bad utf-8": frame(b"\xff\xfe\xfa"),
        "oversized": (protocol.MAX_REQUEST + 1).to_bytes(4, "big") + b"{}",
        "truncated body": (100).to_bytes(4, "big") + b'{"v": 1',
        "truncated header": b"\x00\x00",
        "wrong version": frame(b'{"v": 99, "op": "status"}'),
        "unknown op": frame(b'{"v": 1, "op": "format_disk"}'),
        "args not an object": frame(b'{"v": 1, "op": "ls", "args": [1]}'),
        "unknown argument": frame(b'{"v": 1, "op": "ls", "args": {"evil": 1}}'),
        "bad argument": frame(b'{"v": 1, "op": "ls", "args": {"limit": "x"}}'),
        "missing argument": frame(b'{"v": 1, "op": "cancel", "args": {}}'),
        "bad task": frame(b'{"v": 1, "op": "submit", "args": {"tasks": [{"type": "ECHO", "payload": [1]}]}}'),
        "tasks not a list": frame(b'{"v": 1, "op": "submit", "args": {"tasks": "ECHO"}}'),
        "nested too deeply": frame(b'{"v": 1, "op": "ls", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "id not a string": frame(b'{"v": 1, "op": "show", "args": {"id": [1]}}'),
        "limit not a number": frame(b'{"v": 1, "op": "runs", "args": {"limit": "x"}}'),
        "entry ids not strings": frame(b'{"v": 1, "op": "restarts_dismiss", "args": {"ids": [99999999999999999999999]}}'),
        "ids and selectors": frame(b'{"v": 1, "op": "hold", "args": {"ids": ["abcd"], "type": "ECHO"}}'),
        "unknown status": frame(b'{"v": 1, "op": "hold", "args": {"status": "asleep"}}'),
        "template not a string": frame(
            b'{"v": 1, "op": "submit", "args": {"tasks": [{"type": "ECHO"}], "template": {"a": 1}}}'
        ),
    }
    for name, payload in cases.items():
        reply = raw_exchange(d.socket, payload)
        assert reply["ok"] is False, name
        assert reply["error"]["message"] and "\n" not in reply["error"]["message"], name
        assert reply["error"]["kind"] != "InternalError", (name, reply)  # refused, not a bug of ours
    assert d.data("status")["counts"] == before
    assert d.process.poll() is None
    assert "Traceback" not in d.output.read_text()


def test_a_client_that_closed_its_end_is_seen_gone() -> None:
    ours, theirs = socket.socketpair()
    try:
        assert control._still_connected(ours)  # waiting for its answer
        theirs.shutdown(socket.SHUT_WR)  # done sending (socat, nc -N): it still reads the answer
        assert control._still_connected(ours)
        theirs.close()
        assert not control._still_connected(ours)
    finally:
        ours.close()


def test_a_busy_daemon_answers_before_its_client_gives_up() -> None:
    # A request waits for the loop at most CALL_TIMEOUT; the client must still be listening then,
    # to hear "nothing was done" rather than time out not knowing.
    assert requests.CALL_TIMEOUT < client.Client(socket_path="unused").timeout


def test_every_operation_has_a_handler_that_takes_what_the_protocol_says() -> None:
    # The protocol's table of operations and the handlers' signatures must agree: an argument
    # the protocol lets through reaches the handler, required exactly where it has no default.
    handlers = {name[3:]: handler for name, handler in inspect.getmembers(operations.Handlers) if name.startswith("op_")}
    assert set(handlers) == set(protocol.OPERATIONS)
    for op, operation in protocol.OPERATIONS.items():
        parameters = dict(inspect.signature(handlers[op]).parameters)
        parameters.pop("self")
        assert set(parameters) == set(operation.arguments), op
        for name, argument in operation.arguments.items():
            assert argument.required == (parameters[name].default is inspect.Parameter.empty), (op, name)


def test_many_clients_at_once(daemons) -> None:
    d = daemons().start()
    results: list[str] = []
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            results.append(d.submit("ECHO", payload={"i": i}))
            d.data("status")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 30
    for task_id in results:
        d.wait_task(task_id, "completed")


def test_recovery_calls_on_task_failed_for_the_tasks_it_interrupts(daemons, tmp_path: Path) -> None:
    # Their side effects (a transcode's partial file) are the executor's to undo, as after any
    # permanent failure: a daemon that died must not leave them for good.
    d = daemons().start()
    ready, hook_file = tmp_path / "ready", tmp_path / "hooks"
    task_id = d.submit("RECORDING_HANG", payload={"ready_file": str(ready), "hook_file": str(hook_file)})
    wait_for(ready.exists)
    d.kill9()
    assert not hook_file.exists()
    d.start()
    assert [json.loads(line) for line in hook_file.read_text().splitlines()] == [
        {"task_id": task_id, "status": "failed", "error_type": "INTERRUPTED"}
    ]


def test_a_request_during_recovery_waits_and_is_applied_whole(daemons, tmp_path: Path) -> None:
    # Recovery waits this long for the leftover, twice (after SIGTERM, then for its zombie after
    # SIGKILL, which its stopped launcher does not reap): time enough to ask meanwhile, which the
    # test checks it did (recovery_finished not yet logged) rather than assume.
    d = daemons(cancel_grace=2.0)
    d.start()
    ready = tmp_path / "ready"
    hang = d.submit("HANG", payload={"ready_file": str(ready), "ignore_sigterm": True})
    wait_for(ready.exists)
    leftover = int(ready.read_text())
    # Stopped, it cannot end itself when its daemon dies, as it otherwise would: a leftover
    # for recovery to end (SIGTERM, which it cannot act on, then SIGKILL), as after a suspend.
    launcher = psutil.Process(leftover).parent()
    for process in (launcher, psutil.Process(leftover)):
        process.suspend()
    try:
        d.kill9()
        recoveries = sum(e["event"] == "recovery_finished" for e in d.log_events())  # the first start's

        d.start(wait=False)
        # Recovery is now waiting for the leftover that ignores SIGTERM (cancel_grace before SIGKILL).
        wait_for(lambda: any(e["event"] == "leftover_executor" for e in d.log_events()))
        wait_for(d.socket.exists)
        # The request comes during this recovery, which has not finished.
        assert sum(e["event"] == "recovery_finished" for e in d.log_events()) == recoveries
        reply = d.request("submit", tasks=[{"type": "ECHO", "payload": {"during": "recovery"}}])
        assert reply["ok"], reply
        new_task = d.wait_task(reply["data"]["tasks"][0]["id"], "completed")
        # It was stored only after recovery had finished: recovery could not have touched it.
        finished = [e for e in d.log_events() if e["event"] == "recovery_finished"][-1]
        finished_at = datetime.datetime.fromisoformat(finished["timestamp"]).timestamp()
        assert finished_at <= new_task["created_at"]
        assert finished["interrupted"] == 1
        assert new_task["payload"] == {"during": "recovery"}
        assert d.task(hang)["error_type"] == "INTERRUPTED"
        assert gone(leftover)
    finally:
        launcher.kill()  # never recorded, so left to us: stopped, it would wait forever


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[daemon]\nmax_wokers = 3\n", "unknown key 'max_wokers'"),
        ("[daemon]\nmax_workers = 0\n", "max_workers must be between 1 and 1024"),
        ("[daemon]\npoll_interval = 'fast'\n", "poll_interval must be a number"),
        ("[surprise]\n", "unknown section(s): surprise"),
        ("[daemon\n", "is not valid TOML"),
        ("[executors]\nX = 'no_colon'\n", "[executors] entries must look like"),
    ],
)
def test_a_broken_config_stops_the_daemon_with_one_line(tmp_path: Path, config: str, message: str) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(config)
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "daemon", "--config", str(path)],
        capture_output=True, text=True, timeout=30, env=Daemon(tmp_path / "x").env(),
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def _prepare_database_is_a_directory(d: Daemon) -> str:
    d.database.mkdir(parents=True)
    return "cannot open the database"


def _prepare_corrupt_database(d: Daemon) -> str:
    d.database.parent.mkdir(parents=True)
    d.database.write_bytes(b"this is not a SQLite database, whatever its name says" * 100)
    return "file is not a database"


def _prepare_log_dir_under_a_file(d: Daemon) -> str:
    d.log_dir.parent.mkdir(parents=True, exist_ok=True)
    d.log_dir.write_text("a file where the log directory should be")
    return "cannot write the daemon log in"


@pytest.mark.parametrize(
    "prepare", [_prepare_database_is_a_directory, _prepare_corrupt_database, _prepare_log_dir_under_a_file]
)
def test_a_path_the_daemon_cannot_use_stops_it_with_one_line(daemons, prepare: Callable[[Daemon], str]) -> None:
    d = daemons()
    message = prepare(d)
    d.start(wait=False)
    assert d.process.wait(30) == 1
    lines = d.output.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fredica: ") and message in lines[0], lines


def test_a_socket_path_too_long_stops_the_daemon_with_one_line(daemons, tmp_path: Path) -> None:
    d = daemons(socket=tmp_path / ("s" * 120) / "control.sock")
    d.start(wait=False)
    assert d.process.wait(30) == 1
    lines = d.output.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fredica: cannot listen on") and "too long" in lines[0], lines


def test_an_unloadable_executor_stops_the_daemon_with_one_line(daemons) -> None:
    d = daemons()
    d.config.write_text(d.config.read_text() + 'BROKEN = "no_such_module_here:Thing"\n')
    d.start(wait=False)
    assert d.process.wait(30) == 1
    assert "no_such_module_here" in d.output.read_text()
