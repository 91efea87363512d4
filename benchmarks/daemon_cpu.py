"""CPU time per task of the real daemon, its executor processes and the client, for one workload.

Wall-clock numbers on this shared 2-core machine swing with whatever else runs; CPU time does not
count the time a process waits for the CPU, so it shows what a change to the daemon's own work
saves even under load. The workloads are those of benchmarks/peers (`fredica_daemon.py`), through
the real daemon (`fredica daemon --config`) and its public client:

  S     n submit calls in a row, each task held back by a dependency on a running gate task;
  W1    n submit calls, one per no-op task, then one wait for all of them;
  W1b   one batch of n no-op tasks, then wait;
  W2    n tasks one at a time, each submitted once the one before has ended (submit to start);
  W3    a chain of n tasks, each depending on the one before (per link).

    python3 benchmarks/daemon_cpu.py W1 2000 --kind async    # async-def executor, 2 event-loop processes
    python3 benchmarks/daemon_cpu.py S 3000 --kind reused     # tasks_per_process = 1,000,000

Prints wall time, and CPU ms per task of the daemon (by thread), of its executor processes, and
of this process (the client).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peers.fredica_daemon import FredicaDaemon  # noqa: E402


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _tree_cpu(daemon: psutil.Process) -> dict[str, float]:
    """The daemon's threads by name, and its descendants' CPU (executor processes, fork server)."""
    by_thread: dict[str, float] = {}
    names = {}
    for thread in daemon.threads():
        try:
            names[thread.id] = Path(f"/proc/{daemon.pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            names[thread.id] = str(thread.id)
        by_thread[names[thread.id]] = by_thread.get(names[thread.id], 0.0) + thread.user_time + thread.system_time
    children = 0.0
    for child in daemon.children(recursive=True):
        try:
            children += _cpu(child)
        except psutil.Error:
            pass
    return {**{f"daemon:{name}": cpu for name, cpu in by_thread.items()}, "executors": children}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["S", "W1", "W1b", "W2", "W3"])
    parser.add_argument("n", type=int)
    parser.add_argument("--kind", choices=["async", "reused"], default="async")
    args = parser.parse_args()
    system = FredicaDaemon(1_000_000, event_loop=args.kind == "async", workers=64 if args.kind == "async" else 2)
    me = psutil.Process()
    with system.instance() as instance:
        daemon = psutil.Process(instance.processes[0].pid)
        client = instance.client
        before, mine_before, t0 = _tree_cpu(daemon), _cpu(me), time.perf_counter()
        if args.workload == "S":
            instance.submit_latency(args.n)
        elif args.workload == "W1":
            instance.w1(args.n)
        elif args.workload == "W2":
            latencies = sorted(instance.w2(args.n))
            print(f"W2 submit to start: p50 {latencies[len(latencies) // 2]:.2f} ms")
        elif args.workload == "W3":
            instance.w3(args.n)
        else:
            instance.w1_batch(args.n)
        wall = time.perf_counter() - t0
        after, mine_after = _tree_cpu(daemon), _cpu(me)
        del client
    print(f"{args.workload} n={args.n} kind={args.kind}: {wall:.2f} s wall, {args.n / wall:.0f} tasks/s, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| where | CPU ms per task |")
    print("|---|---|")
    for name in sorted(after):
        spent = after[name] - before.get(name, 0.0)
        if spent > 0.0005:
            print(f"| {name} | {spent / args.n * 1000:.3f} |")
    print(f"| client (this process) | {(mine_after - mine_before) / args.n * 1000:.3f} |")


if __name__ == "__main__":
    main()
