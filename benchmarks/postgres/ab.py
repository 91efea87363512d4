#!/usr/bin/env python3
"""Two checkouts of fredica side by side on one PostgreSQL server, their tasks alternated one by
one: what a change saves, on a machine too noisy for runs one after the other to show it.

    git worktree add /tmp/base <commit>
    python3 benchmarks/postgres/ab.py /tmp/base . --workload W2 --rounds 300
    python3 benchmarks/postgres/ab.py /tmp/base . --workload W1 --rounds 6
    python3 benchmarks/postgres/ab.py /tmp/base . --workload W3 --rounds 15

Each checkout runs its own daemon (`python3 -m daemon daemon --config FILE` with that checkout
on PYTHONPATH) on a database of its own on one durable server (fsync on, as `server.py`), with
reused executor processes (`tasks_per_process`), driven through the public client by
`benchmarks/peers/fredica_daemon.py`. A round gives each daemon the same work in turn: W2 one
sequential task (its submit-to-start latency), W1 200 tasks one submit call each (tasks/s), W3 a
chain of 20 (ms per link). Both daemons are up all the time, so each runs beside the other's idle
loop; the ratio between them is the result, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.peers.fredica_daemon import FredicaDaemon  # noqa: E402
from benchmarks.postgres import server  # noqa: E402
from tests.postgres_cluster import SETTINGS, Cluster, binaries  # noqa: E402

W1_TASKS, W3_CHAIN = 200, 20


class CheckoutDaemon(FredicaDaemon):
    """The benchmark's daemon, run from another checkout's code."""

    def __init__(self, checkout: Path, **options: Any) -> None:
        super().__init__(**options)
        self.checkout = checkout

    def _start(self, home: Path, config: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(self.checkout))
        env.pop("FREDICA_CONFIG", None)
        with open(home / "daemon.out", "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "daemon", "daemon", "--config", str(config)],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.checkout,
            )


def one_round(instance: Any, workload: str) -> float:
    if workload == "W2":
        [latency] = instance.w2(1)
        return latency
    if workload == "W1":
        return W1_TASKS / instance.w1(W1_TASKS)
    return instance.w3(W3_CHAIN) / W3_CHAIN * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs=2, type=Path, help="two checkouts of fredica (the first is the base)")
    parser.add_argument("--workload", choices=("W1", "W2", "W3"), default="W2")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    unit = {"W1": "tasks/s", "W2": "ms submit to start", "W3": "ms a link"}[args.workload]
    checkouts = [path.resolve() for path in args.checkouts]

    bin_dir = binaries()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl): install PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="fredica-pgab-"))
    root.chmod(0o777)  # the server runs as another user when we are root
    cluster = Cluster(bin_dir, root, settings={**SETTINGS, **server.DURABLE, "max_connections": server.CONNECTIONS})
    cluster.start()
    try:
        pg = server.Server(cluster, server.DURABLE)
        with contextlib.ExitStack() as stack:
            instances = [
                stack.enter_context(CheckoutDaemon(
                    checkout, tasks_per_process=100_000, database=lambda: pg.database("ab"),
                ).instance())
                for checkout in checkouts
            ]
            values: list[list[float]] = [[] for _ in checkouts]
            for _ in range(args.rounds):
                for index, instance in enumerate(instances):
                    values[index].append(one_round(instance, args.workload))
    finally:
        cluster.stop()
    print(f"{args.workload}, {args.rounds} rounds alternated, {unit}; load average {os.getloadavg()[0]:.2f} at the end")
    medians = []
    for checkout, measured in zip(checkouts, values):
        ordered = sorted(measured)
        medians.append(statistics.median(ordered))
        print(f"  {checkout}: median {medians[-1]:.2f}  p25 {ordered[len(ordered) // 4]:.2f}  "
              f"p75 {ordered[3 * len(ordered) // 4]:.2f}")
    print(f"  second / first: {medians[1] / medians[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
