"""fredica-worker as users run it, for benchmarks/peers: `fredica daemon --config FILE` as a
subprocess, driven through the public client (`daemon.client.Client`), one call per task.

Each instance is a fresh daemon on a fresh config, database and log directory in a temp dir
(max_workers = 2, forkserver, default durability: WAL with synchronous = NORMAL), stopped with
SIGTERM afterwards. Completion is observed with `Client.wait`, which blocks in the daemon until
the tasks have ended (woken by the loop's commits), so no client-side polling is measured.

  W1        n `Client.submit` calls, one per no-op task, then one `wait` for all of them.
  W1 batch  one `Client.submit_batch` of the n tasks, then `wait`.
  W2        submit one `Stamp` task, `wait` for it, next; latency = its recorded start - the
            client's `time.time()` just before submitting.
  W3        a chain of n tasks, each submitted by its own call with `depends_on` = the previous.
  S         the latency of one `Client.submit` call (p50, p95) and calls/s, n calls in a row
            from one producer; the tasks depend on a `Gate` task that runs until the end, so
            each call is the submission alone (its commit included), not the runs it causes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent


class FredicaDaemon:
    """One benchmark system: the daemon with `tasks_per_process`, behind `Client`."""

    def __init__(
        self, tasks_per_process: int = 1, *, event_loop: bool = False, workers: int = 2,
        database: Callable[[], contextlib.AbstractContextManager[str]] | None = None, supervisors: int = 1,
    ) -> None:
        """`database`: makes a fresh database URL (postgresql://) per instance, instead of a SQLite
        file in the instance's temp dir; `supervisors`: that many daemons of their own names on it
        (PostgreSQL only), each with `workers` workers, the calls spread over them in turn."""
        if supervisors > 1 and database is None:
            raise ValueError("several supervisors share one queue on PostgreSQL only: give `database`")
        self.tasks_per_process = tasks_per_process
        self.database = database
        self.supervisors = supervisors
        # The event-loop row: NOOP and STAMP as `async def` executors (fredica_tasks.AsyncNoop,
        # AsyncStamp), which run in event-loop processes holding `workers` attempts at once.
        self.event_loop = event_loop
        self.workers = workers

    @contextlib.contextmanager
    def instance(self) -> Iterator[FredicaDaemon]:
        from daemon.client import Client

        with tempfile.TemporaryDirectory(prefix="peers-fredica-") as tmp, contextlib.ExitStack() as stack:
            root = Path(tmp)
            database = stack.enter_context(self.database()) if self.database else str(root / "fredica.db")
            self.open_file = root / "gate-open"
            self.processes: list[subprocess.Popen[bytes]] = []
            self.clients: list[Any] = []
            try:
                for index in range(self.supervisors):
                    home = root / f"supervisor-{index}"
                    home.mkdir()
                    config = self._config(home, database, name=f"bench-{index}")
                    self.processes.append(self._start(home, config))
                    self.clients.append(Client(config))
                    self._wait_ready(home, self.processes[-1], self.clients[-1])
                self.client = self.clients[0]
                # Warm: a process of each has run a task (on a shared queue, whoever claims them).
                self._all_completed([c.submit("NOOP") for c in self.clients for _ in range(2)])
                yield self
            finally:
                for client in self.clients:
                    client.close()
                for process in self.processes:
                    if process.poll() is None:
                        process.send_signal(signal.SIGTERM)
                for process in self.processes:
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(10)

    def _config(self, home: Path, database: str, *, name: str) -> Path:
        config = home / "config.toml"
        settings = {
            "database": database, "socket": str(home / "control.sock"), "log_dir": str(home / "logs"),
            "max_workers": self.workers, "tasks_per_process": self.tasks_per_process,
        }
        if self.database:
            settings["name"] = name  # on a shared queue each supervisor has a name of its own
        config.write_text(
            "[daemon]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
            + "\n[executors]\n" + "".join(f"{key} = {json.dumps(path)}\n" for key, path in self._executors().items())
            # The event-loop row: 2 event-loop processes, any number of attempts each.
            + ("\n[queues.default]\nprocesses = 2\n" if self.event_loop else "")
        )
        return config

    def _start(self, home: Path, config: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        env.pop("FREDICA_CONFIG", None)
        with open(home / "daemon.out", "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "daemon", "daemon", "--config", str(config)],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            )

    def _executors(self) -> dict[str, str]:
        tasks = "benchmarks.peers.fredica_tasks"
        if self.event_loop:
            return {"NOOP": f"{tasks}:AsyncNoop", "STAMP": f"{tasks}:AsyncStamp", "GATE": f"{tasks}:Gate"}
        return {"NOOP": "benchmarks.noop:Noop", "STAMP": f"{tasks}:Stamp", "GATE": f"{tasks}:Gate"}

    @staticmethod
    def _wait_ready(home: Path, process: subprocess.Popen[bytes], client: Any) -> None:
        from daemon.errors import DaemonUnreachable

        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"fredica daemon exited: {(home / 'daemon.out').read_text()[-2000:]}")
            try:
                client.status()
                return
            except DaemonUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _all_completed(self, ids: list[str]) -> None:
        tasks = self.client.wait(*ids, timeout=max(120.0, len(ids) * 0.5))
        bad = [t for t in tasks if t["status"] != "completed"]
        if bad:
            raise RuntimeError(f"{len(bad)} fredica tasks ended otherwise, e.g. {bad[0]['status']}")

    def w1(self, n: int) -> float:
        submits = [c.submit for c in self.clients]
        t0 = time.perf_counter()
        ids = [submits[i % len(submits)]("NOOP") for i in range(n)]
        self._all_completed(ids)
        return time.perf_counter() - t0

    def w1_batch(self, n: int) -> float:
        t0 = time.perf_counter()
        ids = self.client.submit_batch([{"type": "NOOP"}] * n)
        self._all_completed(ids)
        return time.perf_counter() - t0

    def w2(self, n: int) -> list[float]:
        latencies = []
        for _ in range(n):
            submitted = time.time()
            task_id = self.client.submit("STAMP")
            [task] = self.client.wait(task_id, timeout=60)
            if task["status"] != "completed":
                raise RuntimeError(f"fredica W2 task {task_id} ended {task['status']}")
            latencies.append((task["result"]["started"] - submitted) * 1000)
        return latencies

    def w3(self, n: int) -> float:
        t0 = time.perf_counter()
        previous = self.client.submit("NOOP")
        ids = [previous]
        for _ in range(n - 1):
            previous = self.client.submit("NOOP", depends_on=[previous])
            ids.append(previous)
        self._all_completed(ids)
        return time.perf_counter() - t0

    def submit_latency(self, n: int) -> tuple[list[float], float]:
        """Per-call latencies (ms) of `n` submit calls in a row, and calls/s over all of them."""
        gate = self.client.submit("GATE", {"open_file": str(self.open_file)})
        submit = self.client.submit
        latencies = []
        t0 = time.perf_counter()
        for _ in range(n):
            started = time.perf_counter()
            submit("NOOP", depends_on=[gate])
            latencies.append((time.perf_counter() - started) * 1000)
        rate = n / (time.perf_counter() - t0)
        self.open_file.touch()  # the waiting tasks run now; the instance is dropped anyway
        return latencies, rate


def latency_of(calls: Any, n: int) -> tuple[list[float], float]:
    """Per-call latencies (ms) of `n` calls of `calls()` in a row, and calls/s: for the peers."""
    latencies = []
    t0 = time.perf_counter()
    for _ in range(n):
        started = time.perf_counter()
        calls()
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies, n / (time.perf_counter() - t0)
