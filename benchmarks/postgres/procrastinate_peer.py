"""procrastinate as its users run it, for benchmarks/postgres: its own worker as a subprocess
(`procrastinate --app benchmarks.postgres.procrastinate_app.app worker --concurrency 2`) and its
own `defer`, one call per job, against a fresh database on the benchmark's server.

  W1  n `noop.defer()` calls, then until n marks are in the marker file.
  W2  `stamp.defer()`, until its start time is in the file, next; latency = that time - the
      client's `time.time()` just before deferring.
  W3  one `link.defer(remaining=n)`: each link defers the next before it ends; until n marks.

The worker keeps procrastinate's defaults (LISTEN/NOTIFY on, 5 s fallback polling, jobs kept
after they end); the client defers with the sync connector (a psycopg pool) the App opens.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import procrastinate

from benchmarks.peers._run import PYTHON, Marker, own_processes, peer_env, start
from benchmarks.postgres import procrastinate_app


class Procrastinate:
    """One benchmark system: a procrastinate worker with 2 concurrent jobs on its own database."""

    def __init__(self, database: Callable[[], contextlib.AbstractContextManager[str]]) -> None:
        self.database = database

    @contextlib.contextmanager
    def instance(self) -> Iterator[Procrastinate]:
        with contextlib.ExitStack() as stack:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pgbench-procrastinate-")))
            url = stack.enter_context(self.database())
            stack.enter_context(own_processes("procrastinate"))
            self.marker = Marker(root / "marker")
            app = stack.enter_context(procrastinate_app.app.replace_connector(procrastinate.PsycopgConnector(conninfo=url)))
            app.open()
            stack.callback(app.close)
            app.schema_manager.apply_schema()
            env = peer_env(**{procrastinate_app.URL_ENV: url, "PEER_MARKER": str(self.marker.path)})
            cmd = [PYTHON, "-m", "procrastinate", "--app", "benchmarks.postgres.procrastinate_app.app",
                   "worker", "--concurrency", "2"]
            self.worker = start(cmd, env=env, log_path=root / "worker.log")
            stack.callback(self._stop_worker)
            for _ in range(2):  # warm-up: the worker is up and listening
                procrastinate_app.noop.defer()
            self.marker.wait_size(2, self.worker, timeout=30.0, interval=0.005)
            yield self

    def _stop_worker(self) -> None:
        self.worker.send_signal(signal.SIGTERM)  # graceful: running jobs end, then it exits
        try:
            self.worker.wait(10)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait(10)

    def _until_marks(self, size: int) -> None:
        self.marker.wait_size(size, self.worker, timeout=max(120.0, size * 0.5), interval=0.005)

    def w1(self, n: int) -> float:
        defer = procrastinate_app.noop.defer
        base = self.marker.size()
        t0 = time.perf_counter()
        for _ in range(n):
            defer()
        self._until_marks(base + n)
        return time.perf_counter() - t0

    def w2(self, n: int) -> list[float]:
        defer = procrastinate_app.stamp.defer
        latencies = []
        for _ in range(n):
            base = self.marker.size()
            submitted = time.time()
            defer()
            latencies.append((self.marker.stamp_after(base) - submitted) * 1000)
        return latencies

    def w3(self, n: int) -> float:
        base = self.marker.size()
        t0 = time.perf_counter()
        procrastinate_app.link.defer(remaining=n)
        self._until_marks(base + n)
        return time.perf_counter() - t0
