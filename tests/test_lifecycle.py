"""Daemon lifecycle under a service manager: graceful SIGTERM, sd_notify, the systemd units."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from daemon.notify import Notifier
from tests.conftest import wait_for
from tests.daemon_harness import REPO


def test_sigterm_lets_short_tasks_finish_and_requeues_the_rest(tmp_path: Path, daemons) -> None:
    # The grace's timing (the deadline, then cancel and SIGTERM) is stepped in
    # tests/test_supervisor_stepped.py; here the real daemon's SIGTERM, its requeue, and the rerun
    # after a restart. The short task is let finish only once the shutdown has begun (its gate),
    # the long one never within it: no race with the grace, however loaded the machine.
    d = daemons(executors={"GATED": "tests.fault_executors:Gated"}, max_workers=3, shutdown_grace=1.0,
                cancel_grace=0.3).start()
    short, long = (d.submit("GATED", max_retries=0, payload=gated(tmp_path, name)) for name in ("short", "long"))
    stubborn = d.submit("HANG", payload={"ready_file": str(tmp_path / "ready"), "ignore_sigterm": True})
    wait_for(lambda: all((tmp_path / name).exists() for name in ("short.ready", "long.ready", "ready")))

    assert d.process is not None
    d.process.send_signal(signal.SIGTERM)
    wait_for(lambda: any(e["event"] == "shutdown_started" for e in d.log_events()))
    (tmp_path / "short.gate").touch()
    assert d.stop(signal.SIGTERM) == 0
    # Finished within the grace period: completed. The others: back to pending, retries untouched.
    d.start()  # recovery must not find anything running
    assert d.task(short)["status"] == "completed"
    assert d.data("restarts") == []
    for task_id in (long, stubborn):
        task = d.task(task_id)
        assert task["retry_count"] == 0 and task["error_type"] is None
    # After the restart they run again.
    (tmp_path / "long.gate").touch()
    assert "finished_at" in d.wait_task(long, "completed", timeout=60)["result"]
    assert d.wait_task(stubborn, "running")["status"] == "running"
    d.data("cancel", ids=[stubborn])
    d.wait_task(stubborn, "cancelled")
    events = [e for e in d.log_events() if e.get("task_id") == long]
    assert any(e["event"] == "task_interrupted" and e.get("by") == "shutdown" for e in events)


def gated(tmp_path: Path, name: str) -> dict:
    return {"ready_file": str(tmp_path / f"{name}.ready"), "gate_file": str(tmp_path / f"{name}.gate")}


@pytest.fixture
def notify_socket(tmp_path: Path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    yield path, sock
    sock.close()


SO_TIMESTAMP = 29  # <asm-generic/socket.h>; the socket module does not name it


def receive_until(sock: socket.socket, predicate) -> list[str]:
    seen: list[str] = []
    while True:
        message = sock.recv(4096).decode()
        seen.append(message)
        if predicate(message):
            return seen


def test_sd_notify_ready_watchdog_status_stopping(daemons, notify_socket) -> None:
    path, sock = notify_socket
    d = daemons()
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)  # each datagram carries when it arrived
    env = d.env() | {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}
    d.env = lambda: env  # type: ignore[method-assign]
    d.start(wait=False)
    ready = receive_until(sock, lambda m: "READY=1" in m)[-1]
    assert "STATUS=ready" in ready and f"MAINPID={d.process.pid}" in ready
    # The socket answers by the time READY is sent: recovery is done and requests are served.
    assert d.data("status")["pid"] == d.process.pid
    # The watchdog is pinged at half its interval, from the loop, with a one-line STATUS. Spacing
    # by the time each ping reached the socket (the kernel's stamp), not when this test got to
    # read it: pings queued while the test was descheduled would read back to back.
    pings = []
    while len(pings) < 3:
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(16))
        if "WATCHDOG=1" in data.decode():
            arrived = next(struct.unpack("qq", raw) for level, kind, raw in ancillary
                           if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP)
            pings.append(arrived[0] + arrived[1] / 1e6)
            assert "STATUS=running: 0/2 workers busy" in data.decode()
    assert min(b - a for a, b in zip(pings, pings[1:])) > 0.1
    d.stop(signal.SIGTERM)
    assert any("STOPPING=1" in m for m in receive_until(sock, lambda m: "STOPPING=1" in m))


def test_no_watchdog_ping_without_a_tick(tmp_path: Path, notify_socket) -> None:
    path, sock = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"})
    notifier.tick(100.0, "fine")
    assert sock.recv(4096).decode() == "WATCHDOG=1\nSTATUS=fine"
    notifier.tick(100.2, "fine")  # before half the interval: nothing
    notifier.tick(100.5, "busy")
    assert sock.recv(4096).decode() == "WATCHDOG=1\nSTATUS=busy"
    assert notifier.next_update() == pytest.approx(101.0)
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # nothing else was sent: no side thread pings on its own
    assert not Notifier({}).enabled


def test_abstract_notify_socket_address() -> None:
    assert Notifier({"NOTIFY_SOCKET": "@/org/systemd/notify"}).address == "\0/org/systemd/notify"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None and os.environ.get("CI") != "true",
    reason="systemd-analyze is not installed (apt-get install systemd); with CI=true it runs regardless",
)
@pytest.mark.parametrize("unit", ["fredica.service", "fredica-user.service"])
def test_units_verify(unit: str, tmp_path: Path) -> None:
    source = REPO / "systemd" / unit
    text = source.read_text()
    # Point ExecStart at an executable that exists here, as an installed unit's would.
    fake_bin = tmp_path / "fredica"
    fake_bin.write_text("#!/bin/sh\n")
    fake_bin.chmod(0o755)
    lines = [
        f"ExecStart={fake_bin} daemon" if line.startswith("ExecStart=") else line
        for line in text.splitlines()
    ]
    copy = tmp_path / unit
    copy.write_text("\n".join(lines) + "\n")
    args = ["systemd-analyze", "verify", *(["--user"] if "user" in unit else []), str(copy)]
    runtime = tmp_path / "xdg-runtime"  # a user manager needs one, even only to verify
    runtime.mkdir(mode=0o700)
    env = os.environ | {"XDG_RUNTIME_DIR": str(runtime)}
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    problems = [
        line for line in (result.stdout + result.stderr).splitlines()
        if str(copy) in line or unit in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_unit_timeouts_cover_the_graceful_shutdown() -> None:
    text = (REPO / "systemd" / "fredica.service").read_text()
    settings = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Type"] == "notify" and settings["KillSignal"] == "SIGTERM"
    # shutdown_grace, then cancel_grace before SIGTERM and again before SIGKILL of executors.
    assert int(settings["TimeoutStopSec"]) > 30 + 2 * 10
    assert int(settings["WatchdogSec"]) > 0 and settings["Restart"] == "on-failure"
