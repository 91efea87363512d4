#!/usr/bin/env python3
"""The floor under a process per task: what one fork + exit of a Python process costs here.

For each heap (what the process has imported), a process forks N children that exit at once
(`os._exit(0)`, and the same through libc's fork/_exit, which skips CPython's after-fork work),
reaping each before the next. Reported per fork: wall time, the parent's CPU (the fork system
call: copying page tables) and the children's CPU and minor page faults (copy-on-write of what
they touch, CPython's after-fork hooks, the exit), with the heap's module count, mappings and RSS.

    python3 benchmarks/fork_floor.py              # 1,000 forks per heap
    python3 benchmarks/fork_floor.py --forks 300

Heaps:
  bare      a fresh interpreter with its site imports only
  executor  a fresh interpreter that imported what an attempt needs: executors.endpoint and the
            no-op executor
  launcher  a real launcher: a child of fredica's fork server (daemon.executor_processes.make_context, the
            no-op executor preloaded), as the supervisor starts them
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(forks: int) -> dict[str, Any]:
    """Fork `forks` times each way in this process; the costs per fork, and this heap's size."""
    libc = ctypes.CDLL(None)

    def one_way(fork: Callable[[], int], exit_at_once: Callable[[int], Any]) -> dict[str, float]:
        s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        for _ in range(forks):
            pid = fork()
            if pid == 0:
                exit_at_once(0)
            os.waitpid(pid, 0)
        wall = time.perf_counter() - t0
        s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)

        def cpu(a: Any, b: Any) -> float:
            return (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / forks * 1000

        return {"wall_ms": wall / forks * 1000, "parent_cpu_ms": cpu(s0, s1), "child_cpu_ms": cpu(c0, c1),
                "child_faults": (c1.ru_minflt - c0.ru_minflt) / forks}

    with open("/proc/self/maps") as maps, open("/proc/self/statm") as statm:
        mappings, rss = len(maps.readlines()), int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    return {"modules": len(sys.modules), "mappings": mappings, "rss_mb": rss,
            "os.fork": one_way(os.fork, os._exit), "libc fork": one_way(libc.fork, libc._exit)}


def in_fresh_interpreter(modules: list[str], forks: int) -> dict[str, Any]:
    code = (
        f"import importlib, json, sys; sys.path.insert(0, {REPO!r}); "
        f"[importlib.import_module(m) for m in {modules!r}]; "
        f"from benchmarks.fork_floor import measure; print(json.dumps(measure({forks})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _report(connection: Any, forks: int) -> None:
    connection.send(measure(forks))


def in_a_launcher(forks: int) -> dict[str, Any]:
    from daemon.engine.executor_processes import base as executor_processes

    context = executor_processes.make_context("forkserver", preload=["benchmarks.noop"])
    ours, theirs = context.Pipe()
    process = context.Process(target=_report, args=(theirs, forks))
    process.start()
    try:
        return ours.recv()
    finally:
        process.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forks", type=int, default=1000, help="forks per heap and way of forking")
    args = parser.parse_args()
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    print(f"load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print("| heap | modules | mappings | RSS MB | fork | wall ms | parent CPU ms | child CPU ms | child faults |")
    print("|---|---|---|---|---|---|---|---|---|")
    heaps = {
        "bare": lambda: in_fresh_interpreter([], args.forks),
        "executor": lambda: in_fresh_interpreter(["executors.endpoint", "benchmarks.noop"], args.forks),
        "launcher": lambda: in_a_launcher(args.forks),
    }
    for heap, run in heaps.items():
        r = run()
        for way in ("os.fork", "libc fork"):
            m = r[way]
            print(f"| {heap} | {r['modules']} | {r['mappings']} | {r['rss_mb']:.1f} | {way} | {m['wall_ms']:.3f} | "
                  f"{m['parent_cpu_ms']:.3f} | {m['child_cpu_ms']:.3f} | {m['child_faults']:.0f} |")
    print(f"load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
