"""fredica-worker side by side with Huey, RQ and task-spooler: the code behind benchmarks/peers/run.py.

The three workloads of benchmarks/throughput.py, each system with 2 workers and no-op tasks:

  W1  2,000 no-op tasks: tasks/s from just before the first submission until the last completion.
  W2  50 sequential tasks (submit one, wait until it has completed, then the next): submit-to-start
      latency p50 and p95 = start time recorded inside the task (`time.time()`, its first
      statement) minus the client's `time.time()` just before submitting; same machine, same clock.
  W3  a 200-task chain, each task depending on the previous one: ms per link (first submission to
      last completion, divided by 200). Every peer has native dependencies, so none is emulated:
      Huey a pipeline (`noop.s().then(noop)...`: the worker that finishes a link enqueues the next),
      RQ `enqueue(..., depends_on=previous_job)` (the worker enqueues the dependents of a finished
      job), task-spooler `tsp -D <previous id>`; fredica one submission whose tasks use `key` and
      `depends_on` (as benchmarks/throughput.py).

Systems (each measurement uses a fresh instance: new database / queue / server, new workers):

  fredica     the real daemon, `fredica daemon --config FILE` as a subprocess, driven through the
              public client `daemon.client.Client`, one call per task (benchmarks/peers/
              fredica_daemon.py says how each workload maps onto it): max_workers=2, forkserver,
              default durability (WAL, synchronous=NORMAL), real `benchmarks.noop:Noop` executor,
              one process per task; W2 with `benchmarks.peers.fredica_tasks:Stamp`, which returns
              its start time. Extra rows: W1 batch (the W1 tasks in one `submit_batch`) and S.
  fredica-reuse  the same with tasks_per_process = 1000000: each executor process runs attempt after
              attempt (one at a time) instead of one attempt and exit.
  fredica-async  the same with `async def` no-op executors (benchmarks/peers/fredica_tasks.py
              AsyncNoop, AsyncStamp): each attempt runs in an event-loop executor process that holds
              many at once; max_workers = ASYNC_WORKERS, shared by the issue's two event-loop
              processes (`[queues.default] processes = 2`).
  huey        SqliteHuey, `huey_consumer -k process -w 2 -d 0.001 -m 0.01 -b 1.15` (tuned polling:
              the defaults are -d 0.1 -m 10), database in a temp dir, synchronous=NORMAL as fredica.
  huey-full   the same with SqliteHuey's default durability (synchronous=FULL: fsync per commit).
  rq-fork     RQ's default `Worker` (forks a work horse per job), 2 `rq worker` processes, against a
              redis-server this script starts on 127.0.0.1 (free port, --save '' --appendonly no).
  rq-simple   RQ `SimpleWorker` (runs jobs in the worker process), 2 worker processes.
  tsp-true    task-spooler, `tsp -S 2`, its own TS_SOCKET and TMPDIR in a temp dir; the task is
              `true` (W1, W3: `tsp -n true`; W2: `tsp date +%s.%N`, whose output file holds the
              start time `date` read).
  tsp-python  the same with a Python task: `python3 -c pass` (W2: `python3 -c "print(time.time())"`).

  S (fredica, Huey) the latency of one submit call (Huey: one enqueue), p50 and p95 of --submits calls
      in a row from one producer, and calls/s.

How completion is seen: fredica, `Client.wait` (it blocks in the daemon until the tasks end); RQ,
its finished-job registry (W1) and result stream (`Job.latest_result(timeout=...)`: XREAD, no
polling); Huey stores nothing for tasks that return None, so its tasks append to a marker file at
their end (benchmarks/peers/peer_tasks.py) and the client watches the file's size; tsp, `tsp -w ID`.

Every number is the median of --reps repetitions. The systems are interleaved (workload by
workload, repetition by repetition, in an order rotated each repetition), so that the shared
machine's load falls on all of them alike.

`--fredica-cpu N` runs, instead of the comparison, one fredica W1 of N tasks and reports the CPU
time per task of every process and thread involved (the supervisor's loop thread, the fork server,
the executor children, the resource tracker) and the minor page faults per child: where fredica's
time goes. Profilers can wrap that run, e.g. `py-spy record --idle --threads -- python3
benchmarks/peers/run.py --fredica-cpu 2000` or `perf record -a -g -- python3 ...`.

Every process this script starts is found again by pid: the script makes itself a child
subreaper (prctl PR_SET_CHILD_SUBREAPER), so daemonizing processes (the tsp server and its waiting
clients) stay its descendants; after each measurement the new descendants are terminated and
reaped by pid, and redis-server is stopped by pid at the end, also on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from benchmarks import _throughput
from benchmarks.peers import fredica_daemon
from benchmarks._throughput import percentile, wait_until

REPO = _throughput.REPO
METHOD = "forkserver"
PYTHON = sys.executable  # not the pyenv shim `python3` on PATH (a bash script)
HUEY_POLLING = ["-d", "0.001", "-m", "0.01", "-b", "1.15"]
# The event-loop row's workers: with no per-queue `processes` setting yet, one event-loop process
# holds them all (SPEC §15 asks for 2 processes, any number of attempts each).
ASYNC_WORKERS = 64
TSP = shutil.which("tsp") or shutil.which("ts") or "tsp"

SYSTEMS = {
    "fredica": "fredica (forkserver, process per task)",
    "fredica-reuse": "fredica (tasks_per_process = 1000000)",
    "fredica-async": "fredica (async def executor, 2 event-loop processes, max_workers = 64)",
    "huey": "Huey (SqliteHuey, sync NORMAL)",
    "huey-full": "Huey (SqliteHuey, default sync FULL)",
    "rq-fork": "RQ Worker (fork per job)",
    "rq-simple": "RQ SimpleWorker",
    "tsp-true": "tsp (`true`)",
    "tsp-python": "tsp (`python3 -c pass`)",
}


def log(message: str) -> None:
    print(message, flush=True)


# --- processes ----------------------------------------------------------------------------------


def become_subreaper() -> None:
    """Orphaned descendants (daemonized tsp server and clients) are re-parented to this process."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def descendants() -> dict[int, psutil.Process]:
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def reap(pids: set[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's exited children."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def end_processes(procs: dict[int, psutil.Process], timeout: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after `timeout` s, each process by pid; reap them. Returns the pids
    that had to be killed."""
    alive = []
    for proc in procs.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                proc.send_signal(signal.SIGTERM)
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    reap(set(procs))
    _gone, still = psutil.wait_procs(alive, timeout=timeout, callback=lambda p: reap({p.pid}))
    for proc in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(still, timeout=timeout)
    reap(set(procs))
    return [p.pid for p in still]


@contextlib.contextmanager
def own_processes(label: str) -> Iterator[None]:
    """Every process that appears below this one while the block runs is ended by pid afterwards."""
    before = set(descendants())
    try:
        yield
    finally:
        # Twice: a process ended in the first pass may have left orphans (re-parented to us).
        for _ in range(2):
            new = {pid: p for pid, p in descendants().items() if pid not in before}
            if not new:
                break
            killed = end_processes(new)
            if killed:
                log(f"    ({label}: killed {len(killed)} processes that ignored SIGTERM)")


def start(cmd: list[str], *, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def peer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    parts = [REPO, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- marker files ---------------------------------------------------------------------------------


class Marker:
    """The file a peer's tasks append to at their end (peer_tasks.noop_marked, stamp_marked), for
    the peers that record nothing the client could wait on (Huey, procrastinate): the client
    watches its size."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def size(self) -> int:
        return os.stat(self.path).st_size

    def wait_size(self, size: int, worker: subprocess.Popen[bytes], *, timeout: float, interval: float) -> None:
        """Until the file holds `size` bytes; RuntimeError if the `worker` process exits first."""

        def done() -> bool:
            if worker.poll() is not None:
                raise RuntimeError(f"{worker.args[:4]} exited with {worker.returncode}")
            return self.size() >= size

        wait_until(done, timeout=timeout, interval=interval)

    def stamp_after(self, base: int) -> float:
        """The start time the first stamping task to end after the file held `base` bytes wrote."""
        wait_until(lambda: self.size() > base and self.path.read_bytes().endswith(b"\n"), 60.0, 0.001)
        return float(self.path.read_bytes()[base:])


# --- Huey -----------------------------------------------------------------------------------------


class Huey:
    def __init__(self, sync: str) -> None:
        self.sync = sync

    @contextlib.contextmanager
    def instance(self) -> Iterator[Huey]:
        from benchmarks.peers import huey_app

        with tempfile.TemporaryDirectory(prefix="peers-huey-") as tmp, own_processes("huey"):
            root = Path(tmp)
            self.marker = Marker(root / "marker")
            db = str(root / "huey.db")
            self.peer = huey_app.make_huey(db, self.sync)
            env = peer_env(PEER_HUEY_DB=db, PEER_HUEY_SYNC=self.sync, PEER_MARKER=str(self.marker.path))
            cmd = [PYTHON, "-m", "huey.bin.huey_consumer", "benchmarks.peers.huey_app.huey", "-k", "process", "-w", "2"]
            self.consumer = start([*cmd, *HUEY_POLLING, "-q"], env=env, log_path=root / "consumer.log")
            try:
                for _ in range(2):  # warm-up: the workers are up and polling
                    self.peer.noop_marked()
                self._wait_size(2, timeout=30.0, interval=0.005)
                yield self
            finally:
                self.consumer.send_signal(signal.SIGINT)  # graceful: workers finish and exit
                try:
                    self.consumer.wait(10)
                except subprocess.TimeoutExpired:
                    self.consumer.kill()
                    self.consumer.wait(10)
                self.peer.app.storage.close()

    def _size(self) -> int:
        return self.marker.size()

    def _wait_size(self, size: int, *, timeout: float, interval: float) -> None:
        self.marker.wait_size(size, self.consumer, timeout=timeout, interval=interval)

    def w1(self, n: int) -> float:
        noop = self.peer.noop_marked
        base = self._size()
        t0 = time.perf_counter()
        for _ in range(n):
            noop()  # enqueues (Huey has no batch enqueue)
        self._wait_size(base + n, timeout=max(120.0, n * 0.5), interval=0.005)
        seconds = time.perf_counter() - t0
        # Every task has run to its end (its mark is its last statement) and none is left queued.
        if self._size() != base + n or self.peer.app.pending_count() != 0:
            raise RuntimeError(f"huey W1: {self._size() - base} marks of {n}, {self.peer.app.pending_count()} queued")
        return seconds

    def w2(self, n: int) -> list[float]:
        stamp = self.peer.stamp_marked
        latencies = []
        for _ in range(n):
            base = self._size()
            submitted = time.time()
            stamp()
            latencies.append((self.marker.stamp_after(base) - submitted) * 1000)
        return latencies

    def submit_latency(self, n: int) -> tuple[list[float], float]:
        """One enqueue call's latency, n in a row (the consumer runs them meanwhile, as it would)."""
        return fredica_daemon.latency_of(self.peer.noop_marked, n)

    def w3(self, n: int) -> float:
        noop = self.peer.noop_marked
        pipeline = noop.s()
        for _ in range(n - 1):
            pipeline.then(noop)  # appended at the end of the pipeline
        base = self._size()
        t0 = time.perf_counter()
        self.peer.app.enqueue(pipeline)
        self._wait_size(base + n, timeout=max(120.0, n * 0.5), interval=0.005)
        return time.perf_counter() - t0


# --- RQ -------------------------------------------------------------------------------------------


class Redis:
    """A redis-server on 127.0.0.1 and a free port, no persistence; stopped by pid."""

    def __init__(self, root: Path) -> None:
        import redis

        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        cmd = [
            "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", str(root), "--logfile", str(root / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.conn = redis.Redis.from_url(self.url)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: see {root / 'redis.log'}")
            try:
                return bool(self.conn.ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_until(ready, timeout=10.0, interval=0.02)

    def stop(self) -> None:
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class RQ:
    _counter = 0

    def __init__(self, server: Redis, worker_class: str) -> None:
        self.server = server
        self.worker_class = worker_class

    @contextlib.contextmanager
    def instance(self) -> Iterator[RQ]:
        from rq import Queue, Worker

        RQ._counter += 1
        name = f"peers-{RQ._counter}"  # a fresh queue (and registries) per instance
        with tempfile.TemporaryDirectory(prefix="peers-rq-") as tmp, own_processes("rq"):
            self.queue = Queue(name, connection=self.server.conn)
            env = peer_env()
            workers = []
            try:
                for i in range(2):
                    cmd = [
                        PYTHON, "-m", "rq.cli", "worker", "--url", self.server.url, "--worker-class", self.worker_class,
                        "--name", f"{name}-w{i}", "--quiet", "--disable-job-desc-logging", name,
                    ]  # fmt: skip
                    workers.append(start(cmd, env=env, log_path=Path(tmp) / f"worker{i}.log"))

                def registered() -> bool:
                    for proc in workers:
                        if proc.poll() is not None:
                            raise RuntimeError(f"rq worker exited with {proc.returncode}: {(Path(tmp) / 'worker0.log').read_text()[-2000:]}")
                    return Worker.count(connection=self.server.conn, queue=self.queue) == 2

                wait_until(registered, timeout=30.0, interval=0.02)
                warm = [self.queue.enqueue(_peer_tasks().noop) for _ in range(2)]
                for job in warm:
                    if job.latest_result(timeout=30) is None:
                        raise TimeoutError("rq warm-up job not done within 30 s")
                yield self
            finally:
                for proc in workers:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)  # warm shutdown
                for proc in workers:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(10)

    def _finished(self) -> int:
        failed = self.queue.failed_job_registry.count
        if failed:
            raise RuntimeError(f"{failed} rq jobs failed")
        return self.queue.finished_job_registry.count

    def w1(self, n: int) -> float:
        from rq import Queue

        noop = _peer_tasks().noop
        data = [Queue.prepare_data(noop) for _ in range(n)]
        base = self._finished()
        t0 = time.perf_counter()
        self.queue.enqueue_many(data)
        wait_until(lambda: self._finished() >= base + n, timeout=max(120.0, n * 0.5), interval=0.005)
        return time.perf_counter() - t0

    def w2(self, n: int) -> list[float]:
        stamp = _peer_tasks().stamp
        latencies = []
        for _ in range(n):
            submitted = time.time()
            job = self.queue.enqueue(stamp)
            result = job.latest_result(timeout=60)
            if result is None or result.type != result.Type.SUCCESSFUL:
                raise RuntimeError(f"rq W2 job {job.id}: {result and result.exc_string}")
            latencies.append((result.return_value - submitted) * 1000)
        return latencies

    def w3(self, n: int) -> float:
        noop = _peer_tasks().noop
        t0 = time.perf_counter()
        job = None
        for _ in range(n):
            job = self.queue.enqueue(noop, depends_on=job)
        assert job is not None
        result = job.latest_result(timeout=int(max(120.0, n * 0.5)))
        elapsed = time.perf_counter() - t0
        if result is None or result.type != result.Type.SUCCESSFUL:
            raise RuntimeError(f"rq W3 last job {job.id}: {result and result.exc_string}")
        return elapsed


def _peer_tasks() -> Any:
    from benchmarks.peers import peer_tasks

    return peer_tasks


# --- task-spooler ---------------------------------------------------------------------------------


class TaskSpooler:
    def __init__(self, python: bool) -> None:
        self.python = python
        self.noop = [PYTHON, "-c", "pass"] if python else ["true"]
        self.stamp = [PYTHON, "-c", "import time; print(repr(time.time()))"] if python else ["date", "+%s.%N"]

    @contextlib.contextmanager
    def instance(self) -> Iterator[TaskSpooler]:
        with tempfile.TemporaryDirectory(prefix="peers-tsp-") as tmp, own_processes("tsp"):
            self.env = dict(os.environ, TS_SOCKET=str(Path(tmp) / "socket"), TMPDIR=tmp)
            self.next_id = 0
            try:
                self.tsp("-S", "2")  # starts this queue's server
                yield self
            finally:
                with contextlib.suppress(Exception):
                    self.tsp("-K")

    def tsp(self, *args: str, capture: bool = False, timeout: float = 60.0) -> str:
        out = subprocess.run(
            [TSP, *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.PIPE if capture else subprocess.DEVNULL,
            timeout=timeout,
            check=True,
        )
        return out.stdout.decode() if capture else ""

    def submit(self, *args: str) -> int:
        """`tsp -n ARGS` (job output not stored); returns the job id (ids count from 0 per server)."""
        self.tsp("-n", *args)
        job_id = self.next_id
        self.next_id += 1
        return job_id

    def wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.tsp("-w", str(self.next_id - 1), timeout=timeout)
        while True:
            unfinished = [
                line.split()[0]
                for line in self.tsp("-l", capture=True).splitlines()[1:]
                if line.split() and line.split()[1] != "finished"
            ]
            if not unfinished:
                return
            for job_id in unfinished:
                self.tsp("-w", job_id, timeout=max(1.0, deadline - time.monotonic()))

    def w1(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.submit(*self.noop)
        self.wait_all(timeout=max(120.0, n * 0.5))
        return time.perf_counter() - t0

    def w2(self, n: int) -> list[float]:
        latencies = []
        for _ in range(n):
            submitted = time.time()
            job_id = int(self.tsp(*self.stamp, capture=True).strip())  # output kept in a file
            self.next_id = job_id + 1
            self.tsp("-w", str(job_id))
            output = Path(self.tsp("-o", str(job_id), capture=True).strip())
            latencies.append((float(output.read_text()) - submitted) * 1000)
        return latencies

    def w3(self, n: int) -> float:
        t0 = time.perf_counter()
        previous = self.submit(*self.noop)
        for _ in range(n - 1):
            previous = self.submit("-D", str(previous), *self.noop)
        self.tsp("-w", str(previous), timeout=max(120.0, n * 0.5))
        elapsed = time.perf_counter() - t0
        states = [line.split()[1] for line in self.tsp("-l", capture=True).splitlines()[1:] if line.split()]
        if states.count("finished") != n:
            raise RuntimeError(f"tsp W3: {states.count('finished')} of {n} jobs finished")
        return elapsed


# --- where fredica's time goes ---------------------------------------------------------------------


def fredica_cpu(n: int) -> list[tuple[str, float]]:
    """One W1 of `n` no-op tasks (as `_throughput.w1_batch`), with the CPU time of every process
    and thread involved, per task: the supervisor's loop thread, the rest of this process (mostly
    the watcher's 5 ms polls), the fork server, the launchers (the fork server's children, alive
    throughout), the attempts' forks (reaped by the launchers, so their CPU is the launchers'
    `children_*` time), multiprocessing's resource tracker."""
    me = psutil.Process()
    specs = _throughput.noop_specs(n)
    with _throughput.supervisor(METHOD) as (sup, path):
        helpers = {}
        for proc in me.children():
            cmdline = " ".join(proc.cmdline())
            for name in ("forkserver", "resource_tracker"):
                if f"multiprocessing.{name}" in cmdline:
                    helpers[name] = proc
        if set(helpers) != {"forkserver", "resource_tracker"}:
            raise RuntimeError(f"multiprocessing helpers not found: {helpers}")
        loop_tid = sup._thread.native_id
        log(
            f"(pids: this process {me.pid}, loop thread {loop_tid}, fork server {helpers['forkserver'].pid}, "
            f"resource tracker {helpers['resource_tracker'].pid})"
        )
        watch = _throughput.reader(path)
        launchers: dict[int, psutil.Process] = {}

        def snapshot() -> dict[str, float]:
            for proc in helpers["forkserver"].children():
                launchers.setdefault(proc.pid, proc)
            threads = {t.id: t.user_time + t.system_time for t in me.threads()}
            mine, fs, rt = me.cpu_times(), helpers["forkserver"].cpu_times(), helpers["resource_tracker"].cpu_times()
            totals = {"launchers": 0.0, "attempts": 0.0, "attempt_faults": 0.0}
            for proc in launchers.values():
                with contextlib.suppress(psutil.Error, OSError):
                    times = proc.cpu_times()
                    # /proc/PID/stat field 11: cminflt (minor faults of its reaped children)
                    stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    totals["launchers"] += times.user + times.system
                    totals["attempts"] += times.children_user + times.children_system
                    totals["attempt_faults"] += float(stat[11 - 3])
            return {
                "loop": threads[loop_tid],
                "process": mine.user + mine.system,
                "forkserver": fs.user + fs.system + fs.children_user + fs.children_system,
                "tracker": rt.user + rt.system,
                **totals,
            }

        before = snapshot()
        t0 = time.perf_counter()
        sup.submit(specs)
        wait_until(lambda: _throughput.finished_count(watch) == n, timeout=max(120.0, n * 0.5), interval=0.005)
        wall = time.perf_counter() - t0
        time.sleep(0.3)  # the last attempts reaped by their launchers
        after = snapshot()
        _throughput.check_all_completed(watch, n)
        watch.close()
    # Launchers started during the run count from zero.
    d = {k: (after[k] - before[k]) / n * 1000 for k in before}
    rows = [
        ("wall clock per task (W1)", wall / n * 1000),
        ("CPU: supervisor loop thread", d["loop"]),
        ("CPU: rest of the benchmark process (watcher polls, submit)", d["process"] - d["loop"]),
        ("CPU: fork server (starting launchers)", d["forkserver"]),
        ("CPU: launchers (forking, handing over, reaping)", d["launchers"]),
        ("CPU: attempts' forks (fork to exit)", d["attempts"]),
        ("CPU: resource tracker", d["tracker"]),
    ]
    rows.append(("CPU: total", sum(v for label, v in rows[1:])))
    rows.append(("minor page faults per attempt's fork (a count, not ms)", d["attempt_faults"] / 1000))
    return rows


# --- environment ----------------------------------------------------------------------------------


def environment(packages: tuple[str, ...] = ("huey", "rq", "redis"), commands: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The run's machine, commit and load, and the versions of `packages` and of `commands`' output
    (by default the peers': Huey, RQ, redis-py, redis-server, task-spooler)."""
    import importlib.metadata

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = first_line(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    status = subprocess.run(
        ["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    changed = " ".join(line[3:] for line in status.stdout.splitlines())
    if commands is None:
        commands = {"redis-server": ["redis-server", "--version"], "tsp": [TSP, "-V"]}
    return {
        "commit": f"{commit}" + (f" (uncommitted changes in: {changed})" if changed else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": first_line(["uname", "-srm"]),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        **{package: version(package) for package in packages},
        **{name: first_line(command) for name, command in commands.items()},
    }


def first_line(cmd: list[str]) -> str:
    """The first line a command prints (stdout, else stderr), or why it could not run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except Exception as exc:  # noqa: BLE001
        return f"? ({exc})"


def end_leftovers() -> None:
    """End, by pid, every descendant still running but the multiprocessing helpers (they exit
    with this process)."""
    leftovers = {pid: p for pid, p in descendants().items() if not _multiprocessing_helper(p)}
    if leftovers:
        log(f"ending {len(leftovers)} leftover processes by pid: {sorted(leftovers)}")
        end_processes(leftovers)


# --- main -----------------------------------------------------------------------------------------

HIGHER_IS_BETTER = {"W1": True, "W1 batch": True, "W2 p50": False, "W2 p95": False, "W3": False,
                    "S p50": False, "S p95": False, "S calls/s": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description="fredica-worker side by side with Huey, RQ and task-spooler.")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per workload and system (median reported)")
    parser.add_argument("--tasks", type=int, default=2000, help="W1 batch size")
    parser.add_argument("--sequential", type=int, default=50, help="W2 task count")
    parser.add_argument("--chain", type=int, default=200, help="W3 chain length")
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated systems (default all: {','.join(SYSTEMS)})")
    parser.add_argument("--workloads", default="W1,W1b,W2,W3,S", help="comma-separated subset of W1,W1b,W2,W3,S")
    parser.add_argument("--submits", type=int, default=2000, help="S: submit calls in a row")
    parser.add_argument("--out", default=str(Path(__file__).with_name("last_run.md")), help="markdown output file")
    parser.add_argument(
        "--fredica-cpu",
        type=int,
        metavar="N",
        help="instead of the comparison: one fredica W1 of N tasks with the CPU time per task of each "
        "process and thread (loop thread, fork server, executor children, ...)",
    )
    args = parser.parse_args(argv)
    if args.fredica_cpu:
        _throughput._importable()
        _throughput.warm_up(METHOD)
        log(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        rows = fredica_cpu(args.fredica_cpu)
        log(f"| fredica W1 of {args.fredica_cpu} tasks | ms per task |")
        log("|---|---|")
        for label, value in rows:
            log(f"| {label} | {value:.2f} |")
        return 0
    names = [s for s in args.only.split(",") if s]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    workloads = [w for w in args.workloads.split(",") if w]

    _throughput._importable()  # the repo on sys.path and on PYTHONPATH, for every child
    # SIGTERM (and SIGINT, even when inherited as ignored) unwind through the finally blocks, which
    # end every process this run started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    become_subreaper()
    env_info = environment()
    for key, value in env_info.items():
        log(f"{key}: {value}")
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        server: Redis | None = None
        try:
            if any(n.startswith("rq") for n in names):
                server = Redis(Path(tmp))
            systems: dict[str, Any] = {
                "fredica": fredica_daemon.FredicaDaemon(),
                "fredica-reuse": fredica_daemon.FredicaDaemon(tasks_per_process=1_000_000),
                "fredica-async": fredica_daemon.FredicaDaemon(event_loop=True, workers=ASYNC_WORKERS),
                "huey": Huey("normal"),
                "huey-full": Huey("default"),
                "rq-fork": RQ(server, "rq.worker.Worker") if server else None,
                "rq-simple": RQ(server, "rq.worker.SimpleWorker") if server else None,
                "tsp-true": TaskSpooler(python=False),
                "tsp-python": TaskSpooler(python=True),
            }
            raw = measure(systems, names, workloads, args)
        finally:
            if server is not None:
                server.stop()
            end_leftovers()

    env_info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    env_info["duration"] = f"{time.monotonic() - started:.0f} s"
    markdown = render(raw, names, args, env_info)
    log("")
    log(markdown)
    Path(args.out).write_text(markdown, encoding="utf-8")
    log(f"(written to {args.out})")
    return 0


def measure(systems: dict[str, Any], names: list[str], workloads: list[str], args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    """Each workload, --reps times, on a fresh instance of each of `names` (in an order rotated
    each repetition): {(metric, system): the value of each repetition}. A system is anything with
    `instance()` and the workloads' methods (w1, w2, w3; w1_batch and submit_latency optional)."""
    raw: dict[tuple[str, str], list[float]] = {}  # (metric, system) -> per-rep values
    for workload in workloads:
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                needs = {"W1b": "w1_batch", "S": "submit_latency"}.get(workload)
                if needs and not hasattr(systems[name], needs):
                    continue  # fredica's batch row; the submit latency of those that have it
                with systems[name].instance() as inst:
                    if workload == "W1b":
                        seconds = inst.w1_batch(args.tasks)
                        raw.setdefault(("W1 batch", name), []).append(args.tasks / seconds)
                        log(f"  W1b rep {rep + 1} {name}: {args.tasks / seconds:.1f} tasks/s ({seconds:.2f} s)")
                    elif workload == "S":
                        lat, rate = inst.submit_latency(args.submits)
                        p50, p95 = percentile(lat, 50), percentile(lat, 95)
                        raw.setdefault(("S p50", name), []).append(p50)
                        raw.setdefault(("S p95", name), []).append(p95)
                        raw.setdefault(("S calls/s", name), []).append(rate)
                        log(f"  S rep {rep + 1} {name}: p50 {p50:.3f} ms, p95 {p95:.3f} ms, {rate:.0f} calls/s")
                    elif workload == "W1":
                        seconds = inst.w1(args.tasks)
                        raw.setdefault(("W1", name), []).append(args.tasks / seconds)
                        log(f"  W1 rep {rep + 1} {name}: {args.tasks / seconds:.1f} tasks/s ({seconds:.2f} s)")
                    elif workload == "W2":
                        lat = inst.w2(args.sequential)
                        p50, p95 = percentile(lat, 50), percentile(lat, 95)
                        raw.setdefault(("W2 p50", name), []).append(p50)
                        raw.setdefault(("W2 p95", name), []).append(p95)
                        log(f"  W2 rep {rep + 1} {name}: p50 {p50:.2f} ms, p95 {p95:.2f} ms (min {min(lat):.2f}, max {max(lat):.2f})")
                    elif workload == "W3":
                        seconds = inst.w3(args.chain)
                        raw.setdefault(("W3", name), []).append(seconds / args.chain * 1000)
                        log(f"  W3 rep {rep + 1} {name}: {seconds / args.chain * 1000:.2f} ms/link ({seconds:.2f} s)")
                    else:
                        raise ValueError(f"unknown workload {workload}")
    return raw


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _multiprocessing_helper(proc: psutil.Process) -> bool:
    """The forkserver and resource tracker: they exit on their own when this process does."""
    try:
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return "multiprocessing.forkserver" in cmdline or "multiprocessing.resource_tracker" in cmdline


def render(
    raw: dict[tuple[str, str], list[float]], names: list[str], args: argparse.Namespace, env_info: dict[str, str],
    labels: dict[str, str] = SYSTEMS,
) -> str:
    """The markdown table of the medians (each fredica column also divided by the best peer's),
    every repetition, and the environment; `labels`: each system's column title."""
    metrics = [
        ("W1", f"W1 {args.tasks:,} no-op tasks: tasks/s (higher is better)", "{:.0f}"),
        ("W1 batch", f"W1 batch: the {args.tasks:,} tasks in one submission, tasks/s", "{:.0f}"),
        ("W2 p50", f"W2 {args.sequential} sequential: submit→start p50, ms", "{:.2f}"),
        ("W2 p95", f"W2 {args.sequential} sequential: submit→start p95, ms", "{:.2f}"),
        ("W3", f"W3 chain of {args.chain}: ms per link", "{:.2f}"),
        ("S p50", f"S {args.submits:,} submit calls in a row: p50 of one, ms", "{:.3f}"),
        ("S p95", f"S {args.submits:,} submit calls in a row: p95 of one, ms", "{:.3f}"),
        ("S calls/s", "S: submit calls/s from one producer", "{:.0f}"),
    ]
    peers = [n for n in names if not n.startswith("fredica")]
    ours = [n for n in names if n.startswith("fredica")]
    lines = [
        (
            f"Median of {args.reps} repetitions. In brackets: the system's value divided by the best peer's "
            "(the fredica columns are not peers): for W1 (tasks/s) above 1 is faster than the best peer; for W2 "
            "and W3 (ms) below 1 is faster."
        ),
        "",
        "| workload | " + " | ".join(labels[n] for n in names) + " | best peer | "
        + " | ".join(f"{labels[n]} / best peer" for n in ours) + " |",
        "|---|" + "---|" * (len(names) + 1 + len(ours)),
    ]
    for key, title, fmt in metrics:
        if not any((key, n) in raw for n in names):
            continue
        med = {n: statistics.median(raw[(key, n)]) for n in names if (key, n) in raw}
        peer_values = {n: v for n, v in med.items() if n in peers}
        best_name = None
        if peer_values:
            pick = max if HIGHER_IS_BETTER[key] else min
            best_name = pick(peer_values, key=lambda n: peer_values[n])
        cells = []
        for n in names:
            if n not in med:
                cells.append("-")
                continue
            cell = fmt.format(med[n])
            if best_name:
                cell += f" ({med[n] / med[best_name]:.3g})"
            cells.append(cell)
        best = f"{labels[best_name]}" if best_name else "-"
        ratios = [f"**{med[n] / med[best_name]:.3g}**" if best_name and n in med else "-" for n in ours]
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {best} | " + " | ".join(ratios) + " |")
    lines += ["", "Every repetition (in the order run):", "", "| workload | system | values |", "|---|---|---|"]
    for key, _title, fmt in metrics:
        for n in names:
            if (key, n) in raw:
                lines.append(f"| {key} | {labels[n]} | " + ", ".join(fmt.format(v) for v in raw[(key, n)]) + " |")
    lines += ["", "Environment:", ""] + [f"- {k}: {v}" for k, v in env_info.items()]
    return "\n".join(lines) + "\n"
