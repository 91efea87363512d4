"""fredica-worker on PostgreSQL beside procrastinate, on one throwaway server: the code behind
benchmarks/postgres/run.py (issue 15's targets).

Parts (`--parts`, default all three), each on fresh databases of one server this script starts
(benchmarks/postgres/server.py: initdb + pg_ctl in a temp dir, a Unix socket only; fsync = on and
synchronous_commit = on unless --fsync-off), stated in the output:

  peers   benchmarks/peers' workloads W1, W2, W3 (their definitions and code: benchmarks/peers/
          _run.py `measure`, `render`), 2 workers per supervisor, no-op tasks:
            W1  --tasks no-op tasks, one submit call each, until all have ended: tasks/s;
            W2  --sequential tasks one at a time: submit-to-start p50/p95 (start time recorded by
                the task itself, minus the client's time just before submitting);
            W3  a chain of --chain tasks, each depending on the previous: ms per link.
          Systems, each instance on a database of its own, alternated and rotated per repetition:
            fredica (×1)     the real daemon (`python3 -m daemon daemon`, `database =
                             "postgresql://..."`, max_workers = 2, process per task) through
                             `daemon.client.Client` (benchmarks/peers/fredica_daemon.py);
            fredica-2 (×2)   two such daemons of different names on one database (2 workers
                             each: 4), the submit calls alternating between their clients;
            fredica-reuse    fredica with tasks_per_process = 1000000 (no process per task);
            fredica-async(-2) fredica (×1, ×2) with `async def` executors in 2 event-loop processes;
            procrastinate    its own worker (`procrastinate worker --concurrency 2`, `async def`
                             tasks) and its own `defer` (benchmarks/postgres/procrastinate_peer.py;
                             W3: each job defers the next, procrastinate having no dependencies).
  rescue  benchmarks/postgres/rescue.py: the rescue transaction of a dead supervisor's
          --rescue-tasks running tasks (store functions), and end to end with real daemons
          (kill -9 of one running them all): seconds after its lease expired.
  claim   benchmarks/claim.py's claim + start + complete cycles on PostgreSQL, --claim-sizes
          waiting tasks (its shapes), ratio of the largest size to the smallest.

Every number is the median of --reps repetitions. The table, every repetition and the
environment (load average before and after) are printed and written to --out.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _throughput, claim
from benchmarks.peers import _run as peers
from benchmarks.peers.fredica_daemon import FredicaDaemon
from benchmarks.postgres import procrastinate_peer, rescue, server

SYSTEMS = {  # column titles: the systems are described in the docstring above
    "fredica": "fredica ×1",
    "fredica-2": "fredica ×2",
    "fredica-reuse": "fredica reuse ×1",
    "fredica-async": "fredica async ×1",
    "fredica-async-2": "fredica async ×2",
    "procrastinate": "procrastinate",
}
DEFAULT_SYSTEMS = ",".join(SYSTEMS)
PARTS = ("peers", "rescue", "claim")
log = peers.log


def systems(pg: server.Server) -> dict[str, Any]:
    def database(label: str) -> Any:
        return lambda: pg.database(label)

    return {
        "fredica": FredicaDaemon(database=database("fredica")),
        "fredica-2": FredicaDaemon(database=database("fredica2"), supervisors=2),
        "fredica-reuse": FredicaDaemon(1_000_000, database=database("fredica_reuse")),
        "fredica-async": FredicaDaemon(event_loop=True, database=database("fredica_async")),
        "fredica-async-2": FredicaDaemon(event_loop=True, database=database("fredica_async2"), supervisors=2),
        "procrastinate": procrastinate_peer.Procrastinate(database("procrastinate")),
    }


def run_rescue(pg: server.Server, args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float], str]:
    """Medians of the rescue transaction and of the end-to-end rescue, and one profile."""
    transactions, ends = [], []
    for rep in range(args.reps):
        with pg.database("rescue") as url:
            result = rescue.rescue_transaction(url, args.rescue_tasks)
            transactions.append(result)
            log(f"  rescue transaction rep {rep + 1}: {result['wall'] * 1000:.0f} ms wall, "
                f"{result['cpu'] * 1000:.0f} ms CPU of this process")
        with pg.database("rescue_daemon") as url, tempfile.TemporaryDirectory(prefix="pgbench-rescue-") as tmp:
            result = rescue.rescue_by_daemon(url, Path(tmp), args.rescue_tasks, lease_timeout=args.lease_timeout,
                                             heartbeat=args.heartbeat)
            ends.append(result)
            log(f"  rescue by a daemon rep {rep + 1}: {result['after_expiry'] * 1000:.0f} ms after the lease "
                f"expired ({result['after_kill']:.2f} s after the kill)")
    with pg.database("rescue_profile") as url:
        profile = rescue.rescue_transaction(url, args.rescue_tasks, profile=True)["profile"]
    return rescue.medians(transactions), rescue.medians(ends), profile


def targets(raw: dict[tuple[str, str], list[float]], rescued: dict[str, float] | None,
            claims: claim.Results | None, args: argparse.Namespace) -> list[str]:
    """Issue 15's targets, each with its number and whether it is met."""
    med = {key: statistics.median(values) for key, values in raw.items()}
    lines = []

    def target(text: str, value: float | None, met: bool | None) -> None:
        if value is not None:
            lines.append(f"- {text}: **{'met' if met else 'not met'}**")

    w1 = {name: med.get(("W1", name)) for name in SYSTEMS}
    for one in ("fredica", "fredica-reuse", "fredica-async"):
        if w1[one] and w1["procrastinate"]:
            ratio = w1[one] / w1["procrastinate"]
            target(f"W1, one supervisor >= 1.0x procrastinate ({one}): {ratio:.2f}x ({w1[one]:.0f} vs "
                   f"{w1['procrastinate']:.0f} tasks/s)", ratio, ratio >= 1.0)
    for one, two in (("fredica", "fredica-2"), ("fredica-async", "fredica-async-2")):
        if w1[one] and w1[two]:
            ratio = w1[two] / w1[one]
            target(f"W1, 2 supervisors >= 1.6x one ({one}): {ratio:.2f}x ({w1[two]:.0f} vs {w1[one]:.0f} tasks/s)",
                   ratio, ratio >= 1.6)
    for name in (n for n in SYSTEMS if n.startswith("fredica")):
        p50, link = med.get(("W2 p50", name)), med.get(("W3", name))
        if p50 is not None:
            target(f"W2 p50 <= 2 ms ({name}): {p50:.2f} ms", p50, p50 <= 2.0)
        if link is not None:
            target(f"W3 <= 2 ms per link ({name}): {link:.2f} ms", link, link <= 2.0)
    if rescued:
        after = rescued["after_expiry"]
        target(f"rescue of {args.rescue_tasks:,} running tasks <= 1 s after the lease expired: {after * 1000:.0f} ms "
               f"(heartbeat_interval {args.heartbeat:g} s, lease_timeout {args.lease_timeout:g} s)", after, after <= 1.0)
    if claims:
        sizes = [int(s) for s in args.claim_sizes.split(",")]
        for shape in args.claim_shapes.split(","):
            ratio = claims[shape, sizes[-1]]["wall"] / claims[shape, sizes[0]]["wall"]
            target(f"claim cost at {sizes[-1]:,} waiting within 2x of {sizes[0]:,} ({shape}): {ratio:.2f}x wall, "
                   f"{claims[shape, sizes[-1]]['cpu'] / claims[shape, sizes[0]]['cpu']:.2f}x CPU", ratio, ratio <= 2.0)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description="fredica on PostgreSQL beside procrastinate (issue 15).")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of everything (median reported)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--fsync-off", action="store_true",
                        help="run the server with fsync, synchronous_commit and full_page_writes off (as the tests)")
    parser.add_argument("--tasks", type=int, default=2000, help="W1 task count")
    parser.add_argument("--sequential", type=int, default=50, help="W2 task count")
    parser.add_argument("--chain", type=int, default=200, help="W3 chain length")
    parser.add_argument("--submits", type=int, default=2000, help="S (only with --workloads S): submit calls in a row")
    parser.add_argument("--only", default=DEFAULT_SYSTEMS, help=f"comma-separated systems, of {','.join(SYSTEMS)}")
    parser.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W1b,W2,W3,S")
    parser.add_argument("--rescue-tasks", type=int, default=1000, help="running tasks of the dead supervisor")
    parser.add_argument("--lease-timeout", type=float, default=3.0, help="rescue by a daemon: lease_timeout, s")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="rescue by a daemon: heartbeat_interval, s")
    parser.add_argument("--claim-sizes", default="100,100000", help="claim: waiting tasks, comma-separated")
    parser.add_argument("--claim-cycles", type=int, default=1000, help="claim: cycles per repetition")
    parser.add_argument("--claim-shapes", default=",".join(claim.SHAPES), help="claim: comma-separated shapes")
    parser.add_argument("--out", default=str(Path(__file__).with_name("last_run.md")), help="markdown output file")
    args = parser.parse_args(argv)
    names = [s for s in args.only.split(",") if s]
    parts = [p for p in args.parts.split(",") if p]
    workloads = [w for w in args.workloads.split(",") if w]
    for what, chosen, known in (("systems", names, SYSTEMS), ("parts", parts, PARTS),
                                ("workloads", workloads, ("W1", "W1b", "W2", "W3", "S")),
                                ("claim shapes", args.claim_shapes.split(","), claim.SHAPES)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            parser.error(f"unknown {what} {unknown}; choose from {list(known)}")

    _throughput._importable()  # the repo on sys.path and on PYTHONPATH, for every child
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, peers._interrupted)
    peers.become_subreaper()
    started = time.monotonic()
    raw: dict[tuple[str, str], list[float]] = {}
    rescued: tuple[dict[str, float], dict[str, float], str] | None = None
    claims: tuple[claim.Results, Any, Any] | None = None
    try:
        with server.running(fsync=not args.fsync_off) as pg:
            env_info = peers.environment(("procrastinate", "psycopg", "psycopg-pool"),
                                         {"postgresql": [str(pg.cluster.bin_dir / "postgres"), "--version"]})
            del env_info["sqlite"]
            env_info["server"] = f"{pg.describe()}, a Unix socket, max_connections {server.CONNECTIONS}"
            for key, value in env_info.items():
                log(f"{key}: {value}")
            if "peers" in parts:
                raw = peers.measure(systems(pg), names, workloads, args)
            if "rescue" in parts:
                rescued = run_rescue(pg, args)
            if "claim" in parts:
                sizes = [int(s) for s in args.claim_sizes.split(",")]
                shapes = args.claim_shapes.split(",")
                claims = claim.measure(claim.PostgresDatabases(pg.url()), shapes, sizes, args.claim_cycles, args.reps)
    finally:
        peers.end_leftovers()
    env_info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    env_info["duration"] = f"{time.monotonic() - started:.0f} s"

    sections = []
    if raw:
        sections.append(peers.render(raw, names, args, {}, labels=SYSTEMS).split("\nEnvironment:")[0].rstrip())
    if rescued:
        transaction, ends, profile = rescued
        sections.append("\n".join([
            f"Rescue of a dead supervisor's {args.rescue_tasks:,} running tasks (median of {args.reps}):",
            "",
            (f"- the rescue transaction (`supervisors.rescue`, store functions): {transaction['wall'] * 1000:.0f} ms "
             f"wall, {transaction['cpu'] * 1000:.0f} ms CPU of the rescuing process"),
            (f"- by a live daemon after a kill -9 (heartbeat_interval {args.heartbeat:g} s, lease_timeout "
             f"{args.lease_timeout:g} s): all handled {ends['after_expiry'] * 1000:.0f} ms after the lease expired "
             f"({ends['after_kill']:.2f} s after the kill)"),
            "",
            "cProfile (time.thread_time) of one more rescue transaction, by own time:",
            "",
            "```",
            profile.strip(),
            "```",
        ]))
    if claims:
        results, plans, statements = claims
        sizes = [int(s) for s in args.claim_sizes.split(",")]
        sections.append(f"Claim on PostgreSQL ({args.claim_cycles} cycles per repetition):\n\n"
                        + claim.report(results, args.claim_shapes.split(","), sizes, args.reps, plans, statements))
    sections.append("Targets (issue 15):\n\n" + "\n".join(targets(raw, rescued[1] if rescued else None,
                                                                   claims[0] if claims else None, args)))
    sections.append("Environment:\n\n" + "\n".join(f"- {k}: {v}" for k, v in env_info.items()))
    markdown = "\n\n".join(sections) + "\n"
    log("")
    log(markdown)
    Path(args.out).write_text(markdown, encoding="utf-8")
    log(f"(written to {args.out})")
    return 0
