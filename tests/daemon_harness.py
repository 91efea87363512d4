"""Run the real daemon as a subprocess for end-to-end tests, and talk to it over its socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemon import protocol
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
SAMPLE_EXECUTORS = {
    "ECHO": "tests.sample_executors:Echo",
    "COUNT": "tests.sample_executors:Counter",
    "HANG": "tests.sample_executors:Hang",
    "GRANDCHILD": "tests.sample_executors:Grandparent",
    "RAISE": "tests.sample_executors:Raising",
    "PRINT": "tests.sample_executors:Printer",
    "SELF_PAUSE": "tests.sample_executors:SelfPause",
    "IMPORTED": "tests.sample_executors:Imported",
    "RECORDING_HANG": "tests.hook_executors:RecordingHang",
    "FAMILY": "tests.sample_executors:Family",
}


def toml_value(value: Any) -> str:
    return json.dumps(str(value)) if isinstance(value, Path) else json.dumps(value)


class Daemon:
    """One daemon process on a config of its own under `root`."""

    def __init__(
        self, root: Path, *, executors: dict[str, str] | None = None, extra_toml: str = "", **daemon_options: Any
    ) -> None:
        """`executors`: more `[executors]` entries; `extra_toml`: more tables, after those."""
        self.root = root
        self.database = root / "state" / "fredica.db"
        self.socket = Path(daemon_options.pop("socket", root / "run" / "control.sock"))
        self.log_dir = root / "logs"
        self.config = root / "config.toml"
        options = {
            "database": self.database,
            "socket": self.socket,
            "log_dir": self.log_dir,
            "max_workers": 2,
            "cancel_grace": 0.5,
            "shutdown_grace": 5.0,
            "idle_poll_interval": 0.5,
            **daemon_options,
        }
        lines = ["[daemon]"] + [f"{key} = {toml_value(value)}" for key, value in options.items()]
        lines += ["", "[retry]", "backoff_base = 0.05", "", "[executors]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in {**SAMPLE_EXECUTORS, **(executors or {})}.items()]
        lines += ["", extra_toml]
        root.mkdir(parents=True, exist_ok=True)
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[str] | None = None
        self.output = root / "daemon.out"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        # Nothing of the machine's may reach a test daemon: no config, and no service manager
        # (a CI job run under systemd would otherwise get its READY and watchdog pings).
        for name in ("FREDICA_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY",
                     "RUNTIME_DIRECTORY"):
            env.pop(name, None)
        return env

    def start(self, wait: bool = True, command: list[str] | None = None) -> "Daemon":
        """Start `fredica daemon` (by default as `python -m daemon`; `command`: another way in)."""
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "daemon"]), "daemon", "--config", str(self.config)],
            cwd=self.root,
            env=self.env(),
            stdout=open(self.output, "a"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20) -> None:
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited with {self.process.returncode}: {self.output.read_text()}")
            try:
                return self.request("status")["ok"]
            except OSError:
                return False

        wait_for(ready, timeout)

    def request(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket))
            sock.sendall(protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST))
            return protocol.read_frame(sock, protocol.MAX_REPLY)

    def data(self, op: str, **args: Any) -> Any:
        reply = self.request(op, **args)
        assert reply["ok"], reply
        return reply["data"]

    def task(self, task_id: str) -> dict[str, Any]:
        return self.data("show", id=task_id)["object"]

    def wait_task(self, task_id: str, *statuses: str, timeout: float = 20) -> dict[str, Any]:
        return wait_for(lambda: (t := self.task(task_id))["status"] in statuses and t, timeout)

    def submit(self, task_type: str, **fields: Any) -> str:
        return self.data("submit", tasks=[{"type": task_type, **fields}])["tasks"][0]["id"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def kill_if_running(self) -> None:
        """Test clean-up: no daemon may outlive its test, whatever the test did."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def log_events(self) -> list[dict[str, Any]]:
        path = self.log_dir / "daemon.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
