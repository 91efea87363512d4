#!/usr/bin/env python3
"""The floor under a process per task: what one fork + exit of a Python process costs here.

For each heap (what the process has imported), a fresh interpreter imports the modules, then forks
N children that exit at once (`os._exit(0)`, and the same through libc's fork/_exit, which skips
CPython's after-fork work), reaping each before the next. Reported per fork: wall time, the
parent's CPU (the fork system call: copying page tables) and the children's CPU and minor page
faults (copy-on-write of what they touch, CPython's after-fork hooks, the exit), with the heap's
module count, mappings and RSS.

    python3 benchmarks/fork_floor.py              # 1,000 forks per heap
    python3 benchmarks/fork_floor.py --forks 300

Heaps:
  bare      the interpreter and its site imports only
  executor  what an executor process needs: executors.endpoint and the no-op executor
  launcher  what fredica's launchers hold: the fork server's preload (daemon.children.FORKSERVER_PRELOAD)
            and the no-op executor
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAPS = {
    "bare": [],
    "executor": ["executors.endpoint", "benchmarks.noop"],
    "launcher": ["@preload", "benchmarks.noop"],
}

CHILD = r"""
import ctypes, importlib, json, os, resource, sys, time
sys.path.insert(0, __REPO__)
modules = __MODULES__
if "@preload" in modules:
    from daemon.children import FORKSERVER_PRELOAD
    modules = [m for m in modules if m != "@preload"] + FORKSERVER_PRELOAD
for name in modules:
    importlib.import_module(name)
libc = ctypes.CDLL(None)

def measure(fork, exit_at_once):
    s0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for _ in range(__FORKS__):
        pid = fork()
        if pid == 0:
            exit_at_once(0)
        os.waitpid(pid, 0)
    wall = time.perf_counter() - t0
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / __FORKS__ * 1000
    return {"wall_ms": wall / __FORKS__ * 1000, "parent_cpu_ms": cpu(s0, s1), "child_cpu_ms": cpu(c0, c1),
            "child_faults": (c1.ru_minflt - c0.ru_minflt) / __FORKS__}

result = {
    "modules": len(sys.modules),
    "mappings": len(open("/proc/self/maps").readlines()),
    "rss_mb": int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6,
    "os.fork": measure(os.fork, os._exit),
    "libc fork": measure(libc.fork, libc._exit),
}
print(json.dumps(result))
"""


def run(heap: str, forks: int) -> dict:
    code = (
        CHILD.replace("__REPO__", repr(REPO)).replace("__MODULES__", repr(HEAPS[heap])).replace("__FORKS__", str(forks))
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forks", type=int, default=1000, help="forks per heap and way of forking")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print("| heap | modules | mappings | RSS MB | fork | wall ms | parent CPU ms | child CPU ms | child faults |")
    print("|---|---|---|---|---|---|---|---|---|")
    for heap in HEAPS:
        r = run(heap, args.forks)
        for way in ("os.fork", "libc fork"):
            m = r[way]
            print(f"| {heap} | {r['modules']} | {r['mappings']} | {r['rss_mb']:.1f} | {way} | {m['wall_ms']:.3f} | "
                  f"{m['parent_cpu_ms']:.3f} | {m['child_cpu_ms']:.3f} | {m['child_faults']:.0f} |")
    print(f"load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
