"""Throughput and latency of the in-process Supervisor: the code behind benchmarks/throughput.py.

It lives outside the script because multiprocessing re-runs the script in every executor child
(see benchmarks/throughput.py); run it through the script:

    python3 benchmarks/throughput.py                       # forkserver (the default start method)
    python3 benchmarks/throughput.py --start-method spawn  # for comparison

Every repetition uses a fresh SQLite file in a temporary directory, a fresh `Supervisor` with
`max_workers=2` and otherwise default settings (synchronous=NORMAL, poll intervals, ...), and the
real no-op executor `benchmarks.noop:Noop`, each task in its own executor subprocess. The daemon's
own log set-up (`daemon.logs.configure`) writes the supervisor's events to the temp log dir, as the
daemon would, so logging costs what it costs in production.

Completion is watched through a second, read-only connection to the database file (WAL lets it
read while the supervisor writes), so the watcher never wakes or slows the supervisor's loop.
Latencies come from the stored rows (`created_at`, `started_at`, `completed_at`: the supervisor's
clock), not from the watcher. `started_at` is the time the dispatching tick began, which precedes
`created_at` when the task was submitted in that same tick, so W2 also reports when the executor
really ran: the first line of the task's log, written by the child just before `execute()`.

Workloads (median of --reps repetitions each):
  W1  2,000 no-op tasks in one submission: tasks/s from just before `submit` until all completed.
  W2  50 sequential tasks (submit one, wait for it to complete, then the next):
      started_at - created_at (p50, p95), executor running - created_at, completed_at - created_at.
  W3  a 200-task chain (each depends on the previous, one submission using `key`s): ms per link.
  spawn  a fresh executor process given one attempt of a Noop task and waiting for its result and exit, without the
      supervisor (median of 50): the floor of the per-task cost.
  profile  one W1 run of 500 tasks with cProfile on the supervisor's loop thread: ms per task
      spent in spawning, the store, logging, ... (not counted in the tables above).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_IMPORTS_ENV = "FREDICA_BENCH_MAIN_IMPORTS"
NOOP_REF = "benchmarks.noop:Noop"


def _importable() -> None:
    """Make `benchmarks` (and the repo's packages) importable here and in every executor child."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    parts = [REPO, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))


# --- helpers ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in 0..100."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def wait_until(condition: Callable[[], Any], timeout: float, interval: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout} s")
        time.sleep(interval)


def reader(path: Path) -> sqlite3.Connection:
    """A read-only connection to the supervisor's database (WAL: reads never block its writes)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


def finished_count(conn: sqlite3.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM task WHERE status IN ('completed', 'failed', 'cancelled')"
    ).fetchone()[0]


def check_all_completed(conn: sqlite3.Connection, expected: int) -> None:
    rows = conn.execute("SELECT status, count(*) AS n FROM task GROUP BY status").fetchall()
    counts = {row["status"]: row["n"] for row in rows}
    if counts != {"completed": expected}:
        bad = conn.execute("SELECT id, status, error FROM task WHERE status != 'completed' LIMIT 3").fetchall()
        raise RuntimeError(f"expected {expected} completed tasks, got {counts}: {[dict(r) for r in bad]}")


# Settings every benchmark supervisor gets (e.g. tasks_per_process from --tasks-per-process).
SETTINGS: dict[str, Any] = {}


@contextlib.contextmanager
def supervisor(start_method: str, **overrides: Any) -> Iterator[tuple[Any, Path]]:
    """A started Supervisor on a fresh database in a temp dir; stopped and removed afterwards."""
    from daemon.config import Settings
    from daemon.supervisor import Supervisor

    overrides = {**SETTINGS, **overrides}
    with tempfile.TemporaryDirectory(prefix="fredica-bench-") as tmp:
        root = Path(tmp)
        settings = Settings(
            database=root / "fredica.db",
            socket=root / "control.sock",
            log_dir=root / "logs",
            executors={"NOOP": NOOP_REF},
            max_workers=2,
            start_method=start_method,
            **overrides,
        )
        _configure_logs(settings.daemon_log)
        sup = Supervisor(settings)
        sup.start()
        try:
            yield sup, settings.database
        finally:
            sup.stop(grace=0, timeout=60)


def _configure_logs(log_file: Path) -> None:
    try:
        from daemon import logs
    except ImportError:  # before daemon/logs.py existed: keep structlog off the terminal
        import logging

        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        return
    logs.configure(log_file, stream=None)


def noop_specs(n: int, *, chain: bool = False) -> list[Any]:
    from daemon.submission import parse_spec

    specs = []
    for i in range(n):
        data: dict[str, Any] = {"type": "NOOP"}
        if chain:
            data["key"] = f"link-{i}"
            if i:
                data["depends_on"] = [f"link-{i - 1}"]
        specs.append(parse_spec(data))
    return specs


# --- workloads ----------------------------------------------------------------------------------


def w1_batch(start_method: str, n: int = 2000, *, chain: bool = False) -> float:
    """Seconds from just before one `submit` of `n` no-op tasks until all are completed."""
    specs = noop_specs(n, chain=chain)
    with supervisor(start_method) as (sup, path):
        watch = reader(path)
        t0 = time.perf_counter()
        sup.submit(specs)
        wait_until(lambda: finished_count(watch) == n, timeout=max(120.0, n * 0.5), interval=0.005)
        elapsed = time.perf_counter() - t0
        check_all_completed(watch, n)
        watch.close()
    return elapsed


def w2_sequential(start_method: str, n: int = 50) -> dict[str, list[float]]:
    """Per-task latencies (ms) from the stored timestamps of `n` tasks run one after the other."""
    specs = noop_specs(1)
    with supervisor(start_method) as (sup, path):
        watch = reader(path)
        client_ms = []
        for _ in range(n):
            t0 = time.perf_counter()
            task_id = sup.submit(specs).tasks[0].id
            wait_until(
                lambda: watch.execute(
                    "SELECT 1 FROM task WHERE id = ? AND status IN ('completed', 'failed', 'cancelled')", (task_id,)
                ).fetchone(),
                timeout=60.0,
                interval=0.001,
            )
            client_ms.append((time.perf_counter() - t0) * 1000)
        check_all_completed(watch, n)
        rows = watch.execute(
            "SELECT id, created_at, started_at, completed_at FROM task ORDER BY seq"
        ).fetchall()
        watch.close()
        log_dir = path.parent / "logs" / "tasks"
        running = [log_started_at(log_dir / f"{r['id']}.log") for r in rows]
    return {
        "start": [(r["started_at"] - r["created_at"]) * 1000 for r in rows],
        "running": [(t - r["created_at"]) * 1000 for r, t in zip(rows, running)],
        "complete": [(r["completed_at"] - r["created_at"]) * 1000 for r in rows],
        "client": client_ms,
    }


def log_started_at(log_path: Path) -> float:
    """When the executor child was ready to call execute(): the first line of the task's log,
    "YYYY-MM-DD HH:MM:SS,mmm INFO task ... started in pid ..." (local time, ms resolution)."""
    with open(log_path, encoding="utf-8") as handle:
        first = handle.readline()
    stamp = datetime.datetime.strptime(first[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def spawn_floor(start_method: str, n: int = 50) -> dict[str, list[float]]:
    """a fresh executor process given one attempt of a Noop task and waiting for its exit, without the supervisor (ms)."""
    from multiprocessing import connection as mp_connection

    from daemon.engine import executor_processes
    from daemon.store import db, tasks

    context = executor_processes.make_context(start_method)
    out: dict[str, list[float]] = {"spawn_call": [], "result": [], "exit": [], "close": []}
    with tempfile.TemporaryDirectory(prefix="fredica-bench-") as tmp:
        conn = db.open_database(Path(tmp) / "fredica.db")
        tasks.submit(conn, noop_specs(n), now=time.time())
        claimed = [tasks.claim_ready(conn, time.time(), 1)[0] for _ in range(n)]
        conn.close()
        for task in claimed:
            assert task is not None
            log_path = Path(tmp) / "logs" / f"{task.id}.log"
            t0 = time.perf_counter()
            child = executor_processes.start_process(context, "reused")
            child.assign(task, NOOP_REF, {}, log_path, last=True)
            t1 = time.perf_counter()
            messages: list[dict[str, Any]] = []
            while not any(m.get("type") == "result" for m in messages):
                mp_connection.wait([child.status], 30)
                drained = child.drain()
                messages += drained.messages
                if not drained.open:
                    break
            t2 = time.perf_counter()
            mp_connection.wait([child.sentinel], 30)
            t3 = time.perf_counter()
            while child.drain().open:
                mp_connection.wait([child.status], 1)
            child.close()
            t4 = time.perf_counter()
            result = next(m for m in messages if m.get("type") == "result")
            if result["error"] is not None:
                raise RuntimeError(result)
            out["spawn_call"].append((t1 - t0) * 1000)
            out["result"].append((t2 - t0) * 1000)
            out["exit"].append((t3 - t0) * 1000)
            out["close"].append((t4 - t3) * 1000)
    return out


# (label, file suffix, function name, "ct" cumulative or "tt" own time), in the loop thread.
PROFILE_ROWS = [
    ("loop busy: `Supervisor.tick`", "daemon/supervisor.py", "tick", "ct"),
    ("· `tasks.claim_ready` (pending → claimed)", "daemon/store/tasks.py", "claim_ready", "ct"),
    ("· `_dispatch` (claimed → running)", "daemon/engine/dispatching.py", "_dispatch", "ct"),
    ("· · ExecutorProcess.assign", "daemon/engine/executor_processes/base.py", "assign", "ct"),
    ("· · · `Process.start` (forkserver/spawn round trip)", "multiprocessing/process.py", "start", "ct"),
    ("· · · 2 × `context.Event()` (5 semaphores each)", "multiprocessing/context.py", "Event", "ct"),
    ("· · · `psutil.Process(pid).create_time()`", "psutil/__init__.py", "create_time", "ct"),
    ("· · `tasks.start`", "daemon/store/tasks.py", "start", "ct"),
    ("· `_finish` (child exited → completed)", "daemon/engine/recording.py", "_finish", "ct"),
    ("· · `tasks.complete`", "daemon/store/tasks.py", "complete", "ct"),
    ("· `tasks.next_ready_at`", "daemon/store/tasks.py", "next_ready_at", "ct"),
    ("all SQLite `execute`/`executemany` (own time)", "~", "<method 'execute' of 'sqlite3.Connection' objects>", "tt"),
    ("all structlog events (2 per task)", "structlog/_base.py", "_proxy_to_logger", "ct"),
    ("all semaphore (un)registration with the resource tracker", "multiprocessing/resource_tracker.py", "_send", "ct"),
    ("loop idle: `Supervisor._wait`", "daemon/supervisor.py", "_wait", "ct"),
]


def profile_loop(start_method: str, n: int) -> tuple[float, list[tuple[str, float]], float]:
    """W1 with cProfile on the supervisor's loop thread: ms per task of each PROFILE_ROWS entry."""
    import cProfile
    import pstats

    specs = noop_specs(n)
    with supervisor(start_method) as (sup, path):
        watch = reader(path)
        profiler = cProfile.Profile()
        sup.call(profiler.enable)  # runs on the loop thread: cProfile profiles the calling thread
        t0 = time.perf_counter()
        sup.submit(specs)
        wait_until(lambda: finished_count(watch) == n, timeout=max(120.0, n * 0.5), interval=0.005)
        elapsed = time.perf_counter() - t0
        sup.call(profiler.disable)
        check_all_completed(watch, n)
        watch.close()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    out = []
    ticks = 0.0
    for label, suffix, func, column in PROFILE_ROWS:
        total = 0.0
        for (filename, _line, name), (_cc, nc, tt, ct, _callers) in stats.items():
            if name == func and (filename == suffix or filename.endswith(suffix)):
                total += ct if column == "ct" else tt
                if func == "tick":
                    ticks += nc
        if func.startswith("<method 'execute' of 'sqlite3.Connection"):
            for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.items():
                if filename == "~" and "executemany' of 'sqlite3.Connection" in name:
                    total += tt
        out.append((label, total / n * 1000))
    return n / elapsed, out, ticks / n


def backlog_cost(start_method: str, backlog: int, measured: int = 1000) -> dict[str, float]:
    """Submit `backlog` ready tasks, then profile the loop over completions 100..100+`measured`:
    what a large ready backlog costs each tick (see `tasks.next_ready_at`)."""
    import cProfile
    import pstats

    if backlog < 200:
        raise SystemExit("--backlog sizes must be at least 200")
    measured = min(measured, backlog - 100)
    specs = noop_specs(backlog)
    with supervisor(start_method) as (sup, path):
        watch = reader(path)
        sup.submit(specs)
        wait_until(lambda: finished_count(watch) >= 100, timeout=600.0, interval=0.005)
        profiler = cProfile.Profile()
        sup.call(profiler.enable)
        t0 = time.perf_counter()
        wait_until(lambda: finished_count(watch) >= 100 + measured, timeout=600.0, interval=0.005)
        elapsed = time.perf_counter() - t0
        sup.call(profiler.disable)
        watch.close()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def total(suffix: str, func: str, index: int) -> float:
        return sum(v[index] for k, v in stats.items() if k[2] == func and k[0].endswith(suffix))

    return {
        "rate": measured / elapsed,
        "tick": total("daemon/supervisor.py", "tick", 3) / measured * 1000,
        "next_ready_at": total("daemon/store/tasks.py", "next_ready_at", 3) / measured * 1000,
        "calls": total("daemon/store/tasks.py", "next_ready_at", 1) / measured,
        "claim_next": total("daemon/store/tasks.py", "claim_ready", 3) / measured * 1000,
    }


def warm_up(start_method: str) -> None:
    """Start the forkserver (once per process) and warm the page cache; not measured."""
    w1_batch(start_method, 4)


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="throughput.py", description="Throughput and latency of the in-process Supervisor."
    )
    parser.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per workload (median reported)")
    parser.add_argument("--tasks", type=int, default=2000, help="W1 batch size")
    parser.add_argument("--sequential", type=int, default=50, help="W2 task count")
    parser.add_argument("--chain", type=int, default=200, help="W3 chain length")
    parser.add_argument("--spawn-samples", type=int, default=50)
    parser.add_argument("--profile-tasks", type=int, default=500, help="batch size of the profiled W1 run")
    parser.add_argument(
        "--backlog",
        default="1200,50000",
        help='ready-backlog sizes (>= 200) for "--only backlog" (not run by default; completions 100 to 1,100 '
        "of each, profiled)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=("w1", "w2", "w3", "spawn", "profile", "backlog"),
        help="run only these (repeatable); default: all but backlog",
    )
    parser.add_argument(
        "--main-imports",
        metavar="MODULES",
        help="comma-separated modules the main script imports, re-imported by every child "
        '(e.g. "daemon.cli" to behave like the `fredica` console script)',
    )
    parser.add_argument(
        "--preload-extra",
        metavar="MODULES",
        help="comma-separated modules to add to daemon.engine.executor_processes.base.FORKSERVER_PRELOAD (an experiment)",
    )
    parser.add_argument(
        "--tasks-per-process", type=int, default=1,
        help="the daemon's tasks_per_process (1: a fresh process per task, the default)",
    )
    args = parser.parse_args(argv)
    SETTINGS["tasks_per_process"] = args.tasks_per_process
    only = set(args.only or ("w1", "w2", "w3", "spawn", "profile"))
    _importable()
    method = args.start_method
    if args.main_imports:
        # Set before the forkserver (or any spawn child) starts, so all of them inherit it; then
        # import here too, as the real entry point would have.
        os.environ[MAIN_IMPORTS_ENV] = args.main_imports
        import importlib

        for name in args.main_imports.split(","):
            importlib.import_module(name)
    if args.preload_extra:
        from daemon.engine.executor_processes import base as executor_processes

        executor_processes.FORKSERVER_PRELOAD = [*executor_processes.FORKSERVER_PRELOAD, *args.preload_extra.split(",")]

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(
        f"start method: {method}; max_workers=2; reps={args.reps}; main imports: {args.main_imports or '-'}; "
        f"extra forkserver preload: {args.preload_extra or '-'}; tasks_per_process={args.tasks_per_process}",
        flush=True,
    )
    warm_up(method)
    rows: list[tuple[str, str, str]] = []  # (workload, metric, value)

    if "w1" in only:
        times = []
        for rep in range(args.reps):
            times.append(w1_batch(method, args.tasks))
            print(f"  W1 rep {rep + 1}: {args.tasks / times[-1]:.1f} tasks/s ({times[-1]:.2f} s)", flush=True)
        med = statistics.median(times)
        rows.append((f"W1 batch of {args.tasks}", "tasks/s (median)", f"{args.tasks / med:.1f}"))
        rows.append(("", "ms per task (median)", f"{med / args.tasks * 1000:.2f}"))
        rows.append(("", "tasks/s per rep", ", ".join(f"{args.tasks / t:.1f}" for t in times)))

    if "w2" in only:
        stats: dict[str, list[float]] = {}

        def keep(name: str, value: float) -> float:
            stats.setdefault(name, []).append(value)
            return value

        for rep in range(args.reps):
            lat = w2_sequential(method, args.sequential)
            print(
                f"  W2 rep {rep + 1}: started_at-created_at p50 {keep('s50', percentile(lat['start'], 50)):.2f} "
                f"p95 {keep('s95', percentile(lat['start'], 95)):.2f} ms; "
                f"executor running p50 {keep('r50', percentile(lat['running'], 50)):.1f} "
                f"p95 {keep('r95', percentile(lat['running'], 95)):.1f} ms; "
                f"completed p50 {keep('c50', percentile(lat['complete'], 50)):.2f} "
                f"p95 {keep('c95', percentile(lat['complete'], 95)):.2f} ms; "
                f"client round trip p50 {keep('k50', percentile(lat['client'], 50)):.2f} ms; "
                f"{keep('neg', sum(x < 0 for x in lat['start']))}/{len(lat['start'])} rows with started_at < created_at",
                flush=True,
            )
        med = {name: statistics.median(values) for name, values in stats.items()}
        name = f"W2 {args.sequential} sequential"
        rows.append((name, "submit→start p50 (ms), `started_at - created_at`", f"{med['s50']:.2f}"))
        rows.append(("", "submit→start p95 (ms), `started_at - created_at`", f"{med['s95']:.2f}"))
        rows.append(("", "rows with `started_at < created_at` (median count)", f"{med['neg']:.0f} of {args.sequential}"))
        rows.append(("", "submit→executor running p50 (ms), task log's first line", f"{med['r50']:.1f}"))
        rows.append(("", "submit→executor running p95 (ms), task log's first line", f"{med['r95']:.1f}"))
        rows.append(("", "submit→completed p50 (ms), `completed_at - created_at`", f"{med['c50']:.2f}"))
        rows.append(("", "submit→completed p95 (ms), `completed_at - created_at`", f"{med['c95']:.2f}"))
        rows.append(("", "client submit()→seen completed p50 (ms)", f"{med['k50']:.2f}"))

    if "w3" in only:
        times = []
        for rep in range(args.reps):
            times.append(w1_batch(method, args.chain, chain=True))
            print(f"  W3 rep {rep + 1}: {times[-1] / args.chain * 1000:.2f} ms/link ({times[-1]:.2f} s)", flush=True)
        med = statistics.median(times)
        rows.append((f"W3 chain of {args.chain}", "ms per link (median)", f"{med / args.chain * 1000:.2f}"))
        rows.append(("", "total s (median)", f"{med:.2f}"))

    if "spawn" in only:
        floor = spawn_floor(method, args.spawn_samples)
        name = f"spawn floor ({args.spawn_samples})"
        rows.append((name, "start_process()+assign() returns (ms, median)", f"{statistics.median(floor['spawn_call']):.2f}"))
        rows.append(("", "spawn → result message (ms, median)", f"{statistics.median(floor['result']):.2f}"))
        rows.append(("", "spawn → process exit (ms, median)", f"{statistics.median(floor['exit']):.2f}"))
        rows.append(("", "drain + close after exit (ms, median)", f"{statistics.median(floor['close']):.2f}"))

    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if rows:
        print()
        print(f"| workload ({method}) | metric | value |")
        print("|---|---|---|")
        for workload, metric, value in rows:
            print(f"| {workload} | {metric} | {value} |")

    if "profile" in only:
        rate, breakdown, ticks = profile_loop(method, args.profile_tasks)
        print()
        print(
            f"Profile hint ({method}): cProfile on the loop thread during one W1 run of {args.profile_tasks} tasks "
            f"({rate:.1f} tasks/s under the profiler, {ticks:.2f} ticks per task). Indented rows are part of "
            "the row above; the three before the last are totals across the tick."
        )
        print()
        print(f"| loop thread, per task ({method}) | ms |")
        print("|---|---|")
        for label, ms in breakdown:
            print(f"| {label} | {ms:.2f} |")

    if "backlog" in only:
        print()
        print(
            f"| ready backlog ({method}) | tasks/s (profiled) | tick ms/task "
            "| next_ready_at ms/task (calls/task) | claim_ready ms/task |"
        )
        print("|---|---|---|---|---|")
        for size in (int(x) for x in args.backlog.split(",")):
            r = backlog_cost(method, size)
            print(
                f"| {size:,} | {r['rate']:.1f} | {r['tick']:.2f} | {r['next_ready_at']:.2f} ({r['calls']:.2f}) "
                f"| {r['claim_next']:.2f} |",
                flush=True,
            )
    return 0
