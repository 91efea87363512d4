"""The HTTP API and the page against the real daemon (issue 16's targets).

1. `GET /api/v1/status` from a keep-alive client: p50 and p99 of `--requests` calls (target p50 <= 2 ms).
2. The page's first load with 10,000 waiting tasks in the database (target <= 200 ms): the requests
   the page makes, one after another on a fresh connection, and (with Chromium) the time from
   navigation to the task table drawn in headless Chromium.
3. Daemon CPU (its own process) with `--running` event-loop tasks reporting progress every 0.25 s,
   without and then with 5 open event streams (target: <= 10% of one core more), and how far the
   streams' progress lags behind the database (target <= 0.5 s).

Run by hand: `python3 benchmarks/http_api.py` (options: --requests, --tasks, --running, --window).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages
from executors.base import ExecuteResult, TaskExecutor  # noqa: E402

if TYPE_CHECKING:
    from daemon.models import Task
    from tests.web_harness import HttpDaemon

PAGE_REQUESTS = ["/", "/page.js", "/page.css", "/api/v1/page/operations", "/api/v1/types", "/api/v1/status",
                 "/api/v1/queues", "/api/v1/restarts", "/api/v1/runs?limit=20", "/api/v1/page/tasks?limit=50"]


class AsyncProgress(TaskExecutor):
    """An event-loop executor that reports progress every `step` seconds for `steps` steps."""

    task_type = "ASYNC_PROGRESS"

    async def execute(self, task: Task, ctx: Any) -> ExecuteResult:  # type: ignore[override]
        steps = int(task.payload.get("steps", 1000))
        for i in range(steps):
            if ctx.cancelled:
                return ExecuteResult(error="cancelled", error_type="CANCELLED")
            ctx.progress(100 * i / steps, f"step {i}")
            await asyncio.sleep(float(task.payload.get("step", 0.25)))
        return ExecuteResult(result={})


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def status_latency(d: HttpDaemon, requests: int) -> tuple[float, float]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port)
    headers = {"Authorization": f"Bearer {d.token}"}
    times = []
    for _ in range(requests):
        t0 = time.perf_counter()
        conn.request("GET", "/api/v1/status", headers=headers)
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - t0)
        assert response.status == 200
    conn.close()
    times = times[len(times) // 10:]  # the first tenth warms up
    return statistics.median(times) * 1000, percentile(times, 0.99) * 1000


def page_requests(d: HttpDaemon) -> float:
    """ms for the page's requests in order, on a fresh connection (what a first load asks)."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port)
    headers = {"Authorization": f"Bearer {d.token}"}
    t0 = time.perf_counter()
    for path in PAGE_REQUESTS:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, path
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed * 1000


def page_in_chromium(d: HttpDaemon, repeats: int) -> list[tuple[float, float]] | None:
    """ms from navigation to the task table drawn, in headless Chromium, as the page's own mark
    says and as Playwright sees it (None without Chromium)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS

    if not os.path.exists(CHROMIUM):
        return None
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(repeats):
            context = browser.new_context()
            context.add_init_script(f"sessionStorage.setItem('fredica-token', {json.dumps(d.token)})")
            page = context.new_page()
            t0 = time.perf_counter()
            page.goto(d.base_url + "/")
            page.wait_for_selector("#tasks tr[data-id]:nth-child(50)")
            outside = (time.perf_counter() - t0) * 1000
            inside = page.evaluate("performance.getEntriesByName('tasks-drawn')[0].startTime")
            times.append((inside, outside))
            context.close()
        browser.close()
    return times


class Stream(threading.Thread):
    """One open event stream, noting when each progress value of `watched` arrives."""

    def __init__(self, d: HttpDaemon, watched: str) -> None:
        super().__init__(daemon=True)
        self.d, self.watched = d, watched
        self.arrivals: dict[int, float] = {}
        self.events = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.d.port)
        conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {self.d.token}"})
        response = conn.getresponse()
        while True:
            line = response.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                self.events += 1
                for task in json.loads(line[6:]).get("tasks", []):
                    if task["id"] == self.watched:
                        self.arrivals.setdefault(task["progress"], time.monotonic())


def database_progress(database: Path, task_id: str, stop: threading.Event, seen: dict[int, float]) -> None:
    """When each progress value of `task_id` was first in the database (read every 5 ms)."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    while not stop.is_set():
        row = conn.execute("SELECT progress FROM task WHERE id = ?", (task_id,)).fetchone()
        if row is not None:
            seen.setdefault(row[0], time.monotonic())
        stop.wait(0.005)
    conn.close()


def daemon_cpu(pid: int, window: float) -> float:
    """Percent of one core the daemon's own process used over `window` seconds."""
    import psutil

    process = psutil.Process(pid)
    before = process.cpu_times()
    time.sleep(window)
    after = process.cpu_times()
    return 100 * ((after.user - before.user) + (after.system - before.system)) / window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=10_000, help="waiting tasks for the page's first load")
    parser.add_argument("--running", type=int, default=200, help="running tasks for the CPU measurement")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of each CPU measurement")
    args = parser.parse_args()
    from tests.web_harness import HttpDaemon

    root = Path(tempfile.mkdtemp(prefix="fredica-bench-http-"))
    queue = (f'[queues.live]\nworkers = {args.running}\nprocesses = 1\ntypes = ["ASYNC_PROGRESS"]\n')
    d = HttpDaemon(root / "d", executors={"ASYNC_PROGRESS": "benchmarks.http_api:AsyncProgress"}, extra_toml=queue)
    d.start()
    try:
        p50, p99 = status_latency(d, args.requests)
        print(f"GET /api/v1/status, keep-alive, {args.requests} requests: p50 {p50:.2f} ms, p99 {p99:.2f} ms")

        d.api("queue_pause", name="default")  # the mass waits: the page shows what is stored
        for start in range(0, args.tasks, 5000):
            d.api("submit", tasks=[{"type": "ECHO", "payload": {"i": i}} for i in range(start, min(args.tasks, start + 5000))])
        loads = [page_requests(d) for _ in range(10)]
        print(f"page's {len(PAGE_REQUESTS)} requests with {args.tasks} waiting tasks: median {statistics.median(loads):.1f} ms, "
              f"max {max(loads):.1f} ms")
        chromium = page_in_chromium(d, 5)
        if chromium is not None:
            inside, outside = [t[0] for t in chromium], [t[1] for t in chromium]
            print(f"page in headless Chromium, navigation start to 50 rows drawn (the page's performance mark): "
                  f"median {statistics.median(inside):.0f} ms, max {max(inside):.0f} ms; as Playwright sees it "
                  f"(goto to selector): median {statistics.median(outside):.0f} ms (5 loads)")

        ids = [t["id"] for t in d.api("submit", tasks=[{"type": "ASYNC_PROGRESS", "payload": {"steps": 240}}
                                                        for _ in range(args.running)])["tasks"]]
        deadline = time.monotonic() + 120
        while d.api("status")["queues"]["live"]["busy"] < args.running:
            assert time.monotonic() < deadline, "the tasks did not all start"
            time.sleep(0.2)
        time.sleep(2)
        without = daemon_cpu(d.process.pid, args.window)
        streams = [Stream(d, ids[0]) for _ in range(5)]
        for stream in streams:
            stream.start()
        stop, in_database = threading.Event(), {}
        watcher = threading.Thread(target=database_progress, args=(d.database, ids[0], stop, in_database), daemon=True)
        watcher.start()
        time.sleep(2)
        with_streams = daemon_cpu(d.process.pid, args.window)
        stop.set()
        watcher.join()
        lags = [arrived - in_database[value] for stream in streams for value, arrived in stream.arrivals.items()
                if value in in_database]
        print(f"daemon CPU with {args.running} running tasks: {without:.1f}% of a core without streams, "
              f"{with_streams:.1f}% with 5 open event streams (+{with_streams - without:.1f})")
        print(f"events per stream in {args.window + 2:.0f} s: {[s.events for s in streams]}; progress lag behind the "
              f"database: median {statistics.median(lags) * 1000:.0f} ms, p95 {percentile(lags, 0.95) * 1000:.0f} ms, "
              f"max {max(lags) * 1000:.0f} ms ({len(lags)} values)")
        print(f"load average {os.getloadavg()[0]:.2f}; nproc {os.cpu_count()}")
    finally:
        d.kill_if_running()


if __name__ == "__main__":
    main()
