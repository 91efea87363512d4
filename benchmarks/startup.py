#!/usr/bin/env python3
"""Startup recovery and supervisor memory with a large queue (issue 6), run by hand.

    python3 benchmarks/startup.py                 # 100,000 non-terminal tasks
    python3 benchmarks/startup.py --tasks 20000 --runs-of 1

Builds a database with N non-terminal tasks (a few running and claimed, as a crash leaves them,
the rest pending, in runs of --runs-of tasks), then in a fresh subprocess each time:
- times `PRAGMA quick_check` alone, `db.open_database` (which runs it, issue 12) and then
  `recovery.recover` on it (median of 3, on fresh copies of the database);
- starts a `Supervisor` on it, recovers and ticks once, and reports its resident set size. The
  pending tasks depend on a task that was running (recovery fails it as INTERRUPTED, which
  cancels them all in the same transaction: the heaviest recovery there is), so nothing runs.
  With --independent they do not: recovery then mostly reconciles the runs, and the supervisor
  would start claiming (it is measured before any executor starts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from daemon.store import db, tasks  # noqa: E402
from daemon.submission import parse_spec  # noqa: E402


def build(path: Path, count: int, runs_of: int, independent: bool) -> None:
    conn = db.open_database(path)
    gate = tasks.submit(conn, [parse_spec({"type": "GATE"})], now=1.0).tasks[0].id
    tasks.claim_ready(conn, 1.0, 1)
    tasks.start(conn, gate, now=1.0, executor_pid=1, executor_started_at=1.0)  # pid 1: never ours
    made = 1
    while made < count:
        size = min(runs_of, count - made)
        deps = [] if independent else [gate]
        specs = [parse_spec({"type": "WORK", "depends_on": deps, "payload": {"i": made + i}}) for i in range(size)]
        tasks.submit(conn, specs, now=2.0)
        made += size
    # A few in flight, as a crash leaves them.
    for _ in range(4):
        extra = tasks.submit(conn, [parse_spec({"type": "WORK", "priority": 10})], now=3.0).tasks[0].id
        tasks.claim_ready(conn, 3.0, 1)
        tasks.start(conn, extra, now=3.0)
    conn.close()


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import psutil
mode, database = sys.argv[2], Path(sys.argv[3])
if mode == "recover":
    import sqlite3
    from daemon import recovery
    from daemon.store import db
    check = sqlite3.connect(database)
    started = time.perf_counter()
    check.execute("PRAGMA quick_check(3)").fetchall()
    quick_check = time.perf_counter() - started
    check.close()
    started = time.perf_counter()
    conn = db.open_database(database)  # its checks (quick_check, a write probe) and migrations
    opened = time.perf_counter() - started
    started = time.perf_counter()
    report = recovery.recover(conn, now=time.time(), kill_grace=0.1)
    print(json.dumps({"seconds": time.perf_counter() - started, "open": opened, "quick_check": quick_check,
                      "interrupted": report.interrupted, "runs": report.runs_reconciled}))
else:
    from daemon import recovery
    from daemon.config import Settings
    from daemon.supervisor import Supervisor
    settings = Settings(database=database, socket=database.with_suffix(".sock"),
                        log_dir=database.parent / "logs", max_workers=2)
    sup = Supervisor(settings)
    recovery.recover(sup.conn, now=time.time(), kill_grace=0.1)
    sup.tick(time.time())
    print(json.dumps({"rss_mb": psutil.Process().memory_info().rss / 2**20,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    sup.idle.dismiss_all()  # the warm spare: it would keep this script from exiting
"""


def child(mode: str, database: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), mode, str(database)],
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--runs-of", type=int, default=1_000, help="tasks per workflow run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--independent", action="store_true",
                        help="pending tasks do not depend on the interrupted task (no cascade)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fredica-startup-"))
    try:
        source = work / "source.db"
        started = time.perf_counter()
        build(source, args.tasks, args.runs_of, args.independent)
        print(f"built {args.tasks} non-terminal tasks in runs of {args.runs_of} "
              f"in {time.perf_counter() - started:.1f} s")
        results, rss = [], []
        for rep in range(args.reps):
            copy = work / f"rep{rep}.db"
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{source}{suffix}").exists():
                    shutil.copy(f"{source}{suffix}", f"{copy}{suffix}")
            results.append(child("recover", copy))
            copy2 = work / f"mem{rep}.db"
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{source}{suffix}").exists():
                    shutil.copy(f"{source}{suffix}", f"{copy2}{suffix}")
            rss.append(child("memory", copy2))
        seconds = statistics.median(r["seconds"] for r in results)
        each = ", ".join(f"{r['seconds']:.3f}" for r in results)
        print(f"recovery: median {seconds:.3f} s (each: {each}); "
              f"interrupted {results[0]['interrupted']}, runs reconciled {results[0]['runs']}")
        print(f"quick_check alone (a cold process): median {statistics.median(r['quick_check'] for r in results):.3f} s; "
              f"open_database with its checks after it: median {statistics.median(r['open'] for r in results):.3f} s; "
              f"open + recovery: median {statistics.median(r['open'] + r['seconds'] for r in results):.3f} s")
        print(f"supervisor RSS after recovery and one tick: median {statistics.median(r['rss_mb'] for r in rss):.1f} MB "
              f"(peak {max(r['maxrss_mb'] for r in rss):.1f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
