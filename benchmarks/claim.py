#!/usr/bin/env python3
"""Cost of claim + start + complete while a mass of tasks waits behind unfinished dependencies.

    python3 benchmarks/claim.py                  # 100, 10,000 and 100,000 waiting tasks
    python3 benchmarks/claim.py --cycles 500 --sizes 100,10000
    python3 benchmarks/claim.py --database 'postgresql:///postgres?host=/tmp/pg&user=postgres'

What it measures: `tasks.claim_ready` + `tasks.start` + `tasks.complete` of one ready task (each its
own transaction, exactly as the supervisor calls them), N = --cycles times in a row, at the default
durability (`db.open_database` defaults: WAL, synchronous=NORMAL) on a file in a temp directory.
With `--database URL` (a PostgreSQL server; the URL's database is only used to create and drop
the benchmark's own ones), on PostgreSQL instead, at that server's durability settings:
benchmarks/postgres/run.py runs it on its own server.

Database layout (the "blocked mass" is the size column; the ready pool is the same for every size):
- 4 gate tasks, claimed and started and never finished: the long-running tasks of a busy daemon.
- the blocked mass: pending tasks that depend, directly or through their chain, on a gate, with
  random priorities in [-5, 5] (so most outrank the ready pool: only the ready index can skip them).
- the ready pool: --cycles independent pending tasks with priority 0, each claimed once.
Shapes of the blocked mass:
- chains/few-runs: chains of 50 whose head depends on a gate; batches of 5,000 tasks per run.
- fan-in/few-runs: every task depends directly on one of the 4 gates (25,000 dependents per gate
  at 100,000); batches of 5,000 tasks per run.
- chains/many-runs: one run per chain of 10 (10,000 runs at 100,000); the ready pool is spread one
  task per run over runs of its own.
- delayed/few-runs: the mass is not blocked by a dependency but waits out a retry delay
  (`not_before` far in the future, as after a burst of failures with backoff); batches of 5,000.
- other-queue/few-runs: the mass is ready, but in another queue (`bulk`, SPEC §15), which has
  none of its workers free: the claims of `default` must not walk past it; batches of 5,000.
In the few-runs shapes the ready pool is spread over the same runs as the waiting mass, so every
completion refreshes a run that holds thousands of waiting tasks.

Also printed, on SQLite: `EXPLAIN QUERY PLAN` of every statement `claim_ready` runs (traced from
the store, so it shows whatever the store does today) and the number of SQL statements in one cycle.

The DB is built once per (shape, size) with `tasks.submit` (one transaction per batch of a few
thousand tasks), then each repetition runs on a fresh copy of that file (on PostgreSQL, a
database created from it as a template). Reported: µs per cycle
(wall clock and this process's CPU time), the median of --reps repetitions, and the ratio of the
largest size to the smallest. Target: ratio <= 2, i.e. the claim never scans waiting tasks.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemon.models import TaskStatus  # noqa: E402
from daemon.store import backend, db, tasks  # noqa: E402
from daemon.submission import TaskSpec  # noqa: E402

GATES = 4
BATCH = 5_000
CHAIN_FEW_RUNS = 50
CHAIN_MANY_RUNS = 10
NOW = 1_000_000.0


# --- building --------------------------------------------------------------------------------


def _gates(conn: sqlite3.Connection) -> list[str]:
    """GATES tasks, claimed and started: never finished, so whatever depends on them stays blocked."""
    sub = tasks.submit(conn, [TaskSpec(type="GATE", priority=1_000_000) for _ in range(GATES)], now=NOW)
    ids = [t.id for t in sub.tasks]
    for _ in ids:
        claimed = tasks.claim_ready(conn, NOW, 1)[0]
        assert claimed is not None and claimed.id in ids
        tasks.start(conn, claimed.id, now=NOW)
    return ids


def _ready(count: int) -> list[TaskSpec]:
    return [TaskSpec(type="READY", priority=0) for _ in range(count)]


def _chain(rng: random.Random, gate: str, length: int, prefix: str) -> list[TaskSpec]:
    specs = [TaskSpec(type="BLOCKED", priority=rng.randint(-5, 5), depends_on=(gate,), key=f"{prefix}0")]
    for i in range(1, length):
        specs.append(
            TaskSpec(type="BLOCKED", priority=rng.randint(-5, 5), depends_on=(f"{prefix}{i - 1}",), key=f"{prefix}{i}")
        )
    return specs


def _spread(ready: list[TaskSpec], parts: int) -> list[list[TaskSpec]]:
    return [ready[i::parts] for i in range(parts)]


def build_few_runs(conn: sqlite3.Connection, size: int, ready: int, shape: str, rng: random.Random) -> None:
    gates = _gates(conn)
    runs = max(1, -(-size // BATCH))
    pools = _spread(_ready(ready), runs)
    left = size
    for run in range(runs):
        count = min(BATCH, left)
        left -= count
        specs: list[TaskSpec] = []
        if shape == "chains":
            while len(specs) < count:
                length = min(CHAIN_FEW_RUNS, count - len(specs))
                specs += _chain(rng, gates[len(specs) % GATES], length, f"c{len(specs)}-")
        elif shape == "fan-in":
            specs = [
                TaskSpec(type="BLOCKED", priority=rng.randint(-5, 5), depends_on=(gates[i % GATES],))
                for i in range(count)
            ]
        elif shape == "other-queue":
            specs = [TaskSpec(type="BULK", priority=rng.randint(-5, 5)) for _ in range(count)]
        else:  # delayed: ready tasks waiting for a retry delay, made below
            specs = [TaskSpec(type="DELAYED", priority=rng.randint(-5, 5)) for _ in range(count)]
        # Ready tasks interleaved with the blocked ones, in the same run.
        specs = specs + pools[run]
        tasks.submit(conn, specs, now=NOW, routes={"BULK": "bulk"})
    if shape == "delayed":
        # Push them back with a retry far in the future: claim, start, retry (one transaction per batch).
        delayed = [row[0] for row in conn.execute("SELECT id FROM task WHERE type = 'DELAYED'")]
        for start in range(0, len(delayed), BATCH):
            with db.write(conn):
                for task_id in delayed[start : start + BATCH]:
                    tasks.transition(conn, task_id, TaskStatus.CLAIMED, now=NOW)
                    tasks.retry(conn, task_id, error="e", error_type="EXCEPTION", not_before=NOW * 10, now=NOW)


def build_many_runs(conn: sqlite3.Connection, size: int, ready: int, shape: str, rng: random.Random) -> None:
    gates = _gates(conn)
    assert size % CHAIN_MANY_RUNS == 0, size
    chains = size // CHAIN_MANY_RUNS
    per_transaction = BATCH // CHAIN_MANY_RUNS
    for start in range(0, chains, per_transaction):
        with db.write(conn):  # many runs, one transaction per few thousand tasks
            for c in range(start, min(chains, start + per_transaction)):
                tasks.submit(conn, _chain(rng, gates[c % GATES], CHAIN_MANY_RUNS, "c"), now=NOW)
    for start in range(0, ready, BATCH):
        with db.write(conn):
            for spec in _ready(min(BATCH, ready - start)):
                tasks.submit(conn, [spec], now=NOW)


SHAPES: dict[str, Callable[[sqlite3.Connection, int, int, random.Random], None]] = {
    "chains/few-runs": lambda c, n, r, g: build_few_runs(c, n, r, "chains", g),
    "fan-in/few-runs": lambda c, n, r, g: build_few_runs(c, n, r, "fan-in", g),
    "chains/many-runs": lambda c, n, r, g: build_many_runs(c, n, r, "chains", g),
    "delayed/few-runs": lambda c, n, r, g: build_few_runs(c, n, r, "delayed", g),
    "other-queue/few-runs": lambda c, n, r, g: build_few_runs(c, n, r, "other-queue", g),
}


def build(target: str, shape: str, size: int, ready: int) -> float:
    started = time.perf_counter()
    conn = db.open_database(target)
    SHAPES[shape](conn, size, ready, random.Random(size))
    counts = dict(conn.execute("SELECT status, count(*) FROM task GROUP BY status").fetchall())
    blocked = conn.execute("SELECT count(*) FROM task WHERE status = 'pending' AND unmet_deps > 0").fetchone()[0]
    if shape not in ("delayed/few-runs", "other-queue/few-runs"):
        assert blocked == size, (shape, size, blocked, counts)
    assert counts.get("running") == GATES and counts.get("pending") == size + ready, (shape, counts)
    if backend.of(conn) == backend.SQLITE:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


# --- measuring -------------------------------------------------------------------------------


def cycles(target: str, count: int) -> dict[str, float]:
    """Run `count` claim+start+complete cycles on the DB at `target`; µs per cycle and per phase."""
    conn = db.open_database(target)
    now = NOW + 1
    phase = {"claim": 0, "start": 0, "complete": 0}
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(count):
        t0 = time.perf_counter_ns()
        task = tasks.claim_ready(conn, now, 1)[0]
        t1 = time.perf_counter_ns()
        assert task is not None and task.type == "READY", task
        tasks.start(conn, task.id, now=now)
        t2 = time.perf_counter_ns()
        tasks.complete(conn, task.id, {"ok": True}, now=now)
        t3 = time.perf_counter_ns()
        phase["claim"] += t1 - t0
        phase["start"] += t2 - t1
        phase["complete"] += t3 - t2
    wall, cpu = time.perf_counter_ns() - wall0, time.process_time_ns() - cpu0
    conn.close()
    result = {"wall": wall / count / 1000, "cpu": cpu / count / 1000}
    result.update({k: v / count / 1000 for k, v in phase.items()})
    return result


def statements_of_one_cycle(target: str) -> tuple[list[tuple[str, list[str]]], int]:
    """EXPLAIN QUERY PLAN of every statement `claim_ready` runs (traced, so whatever the store
    does today), and how many statements one whole cycle takes; on a copy of the (SQLite) DB."""
    conn = db.open_database(target)
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    task = tasks.claim_ready(conn, NOW + 1, 1)[0]
    claim_statements = list(traced)
    assert task is not None, traced
    tasks.start(conn, task.id, now=NOW + 1)
    tasks.complete(conn, task.id, {"ok": True}, now=NOW + 1)
    conn.set_trace_callback(None)
    plans = []
    for sql in claim_statements:
        if sql.split()[0].upper() in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
            plan = [f"{row[0]}|{row[1]}|{row[3]}" for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            plans.append((" ".join(sql.split()), plan))
    conn.close()
    return plans, len(traced)


# --- where the databases live ---------------------------------------------------------------


class SqliteFiles:
    """The databases as files in a temp directory; a copy is a file copy."""

    backend = backend.SQLITE

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return f"sqlite {sqlite3.sqlite_version}, durability: db.open_database defaults (WAL, synchronous=NORMAL)"

    def new(self, label: str) -> str:
        return str(self.root / f"{label}.db")

    def copy(self, template: str, label: str) -> str:
        copy = self.new(label)
        shutil.copyfile(template, copy)
        return copy

    def remove(self, target: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(target + suffix).unlink(missing_ok=True)


class PostgresDatabases:
    """The databases on the PostgreSQL server of `url`, created and dropped through it; a copy is
    a database created from the built one as its template."""

    backend = backend.POSTGRESQL

    def __init__(self, url: str) -> None:
        self.url = url

    def _admin(self, statement: str) -> list[Any]:
        """Run `statement` outside a transaction (CREATE/DROP DATABASE refuse to run in one)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def describe(self) -> str:
        version, fsync, commit = (self._admin(f"SHOW {name}")[0][0]
                                  for name in ("server_version", "fsync", "synchronous_commit"))
        return f"PostgreSQL {version}, durability: fsync = {fsync}, synchronous_commit = {commit}"

    def _named(self, name: str) -> str:
        """The server's URL with `name` as its database (kept a URL: urlunsplit would drop the
        empty authority of `postgresql:///db?host=...`)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/{name}" + (f"?{parts.query}" if parts.query else "")

    @staticmethod
    def _name(label: str) -> str:
        return "claim_" + "".join(c if c.isalnum() else "_" for c in label.lower())[:50]

    def new(self, label: str) -> str:
        self._admin(f"CREATE DATABASE {self._name(label)} TEMPLATE template0")
        return self._named(self._name(label))

    def copy(self, template: str, label: str) -> str:
        source = urlsplit(template).path.lstrip("/")
        # FILE_COPY: copying the built database's files beats WAL-logging every page of them.
        self._admin(f"CREATE DATABASE {self._name(label)} TEMPLATE {source} STRATEGY FILE_COPY")
        return self._named(self._name(label))

    def remove(self, target: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {urlsplit(target).path.lstrip('/')} WITH (FORCE)")


# --- running and reporting -------------------------------------------------------------------

Results = dict[tuple[str, int], dict[str, float]]


def measure(
    store: SqliteFiles | PostgresDatabases, shapes: list[str], sizes: list[int], count: int, reps: int
) -> tuple[Results, list[tuple[str, list[str]]], int | None]:
    """µs per cycle (medians of `reps`) for each (shape, size); on SQLite, the claim's plans and
    the statements of one cycle as well (None on PostgreSQL)."""
    results: Results = {}
    plans: list[tuple[str, list[str]]] = []
    statements: int | None = None
    for shape in shapes:
        for size in sizes:
            template = store.new(f"template-{shape}-{size}")
            seconds = build(template, shape, size, count)
            rep_results = []
            for rep in range(reps):
                copy = store.copy(template, f"rep{rep}")
                rep_results.append(cycles(copy, count))
                store.remove(copy)
            results[shape, size] = {k: statistics.median(r[k] for r in rep_results) for k in rep_results[0]}
            print(f"  {shape:17} {size:>7}: built in {seconds:5.1f} s, "
                  f"{results[shape, size]['wall']:7.1f} µs/cycle wall "
                  f"(all reps: {', '.join('%.0f' % r['wall'] for r in rep_results)})", flush=True)
            if store.backend == backend.SQLITE and shape == shapes[0] and size == sizes[-1]:
                copy = store.copy(template, "plan")
                plans, statements = statements_of_one_cycle(copy)
                store.remove(copy)
            store.remove(template)
    return results, plans, statements


def report(
    results: Results, shapes: list[str], sizes: list[int], reps: int,
    plans: list[tuple[str, list[str]]], statements: int | None,
) -> str:
    """The tables of `measure`'s results, as markdown."""
    lines = [f"### µs per claim+start+complete cycle (median of {reps}; wall clock, CPU of this process)", ""]
    head = " | ".join(f"{s:,} waiting" for s in sizes)
    lines.append(f"| shape | {head} | ratio {sizes[-1]:,} / {sizes[0]:,} (wall) | ratio (CPU) |")
    lines.append("|---" * (len(sizes) + 3) + "|")
    for shape in shapes:
        cells = " | ".join(
            f"{results[shape, s]['wall']:.0f} (CPU {results[shape, s]['cpu']:.0f})" for s in sizes
        )
        lo, hi = results[shape, sizes[0]], results[shape, sizes[-1]]
        lines.append(f"| {shape} | {cells} | {hi['wall'] / lo['wall']:.2f} | {hi['cpu'] / lo['cpu']:.2f} |")
    lines += ["", "### µs per phase (wall, median of reps): claim / start / complete", ""]
    lines.append(f"| shape | {' | '.join(f'{s:,} waiting' for s in sizes)} |")
    lines.append("|---" * (len(sizes) + 1) + "|")
    for shape in shapes:
        cells = " | ".join(
            f"{results[shape, s]['claim']:.0f} / {results[shape, s]['start']:.0f} / {results[shape, s]['complete']:.0f}"
            for s in sizes
        )
        lines.append(f"| {shape} | {cells} |")
    if statements is not None:
        lines += ["", f"### EXPLAIN QUERY PLAN of each statement of `claim_ready` ({shapes[0]}, {sizes[-1]:,} waiting)",
                  "", "```"]
        for sql, plan in plans:
            lines.append(sql)
            lines += [f"    {line}" for line in plan]
        lines += ["```", "", f"SQL statements in one cycle: {statements} (BEGIN/COMMIT included)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--cycles", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--database", metavar="URL", help="a PostgreSQL server (postgresql://...) to measure on "
                        "instead of SQLite files; its databases claim_* are created and dropped there")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
    if args.database and not backend.is_postgres(args.database):
        parser.error(f"--database takes a postgresql:// URL, not {args.database!r}")

    with tempfile.TemporaryDirectory(prefix="fredica-claim-bench-") as tmp:
        store = PostgresDatabases(args.database) if args.database else SqliteFiles(Path(tmp))
        print(f"# claim + start + complete, {args.cycles} cycles, median of {args.reps}")
        print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
        print(f"machine: {platform.uname().system} {platform.uname().release} {platform.machine()}, "
              f"nproc {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
        print(f"python {platform.python_version()}, {store.describe()}")
        print()
        results, plans, statements = measure(store, shapes, sizes, args.cycles, args.reps)
    print()
    print(report(results, shapes, sizes, args.reps, plans, statements))


if __name__ == "__main__":
    main()
