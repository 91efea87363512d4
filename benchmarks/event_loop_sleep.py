#!/usr/bin/env python3
"""10,000 event-loop tasks that each `await asyncio.sleep(1)`, submitted as one batch (issue 13,
SPEC §15): how long until all have completed, and the memory of the daemon and its executor
processes meanwhile. Run by hand:

    python3 benchmarks/event_loop_sleep.py                  # 10,000 tasks, 2 event-loop processes
    python3 benchmarks/event_loop_sleep.py --tasks 2000 --processes 1

Starts the real daemon (`python3 -m daemon daemon --config FILE`, as `fredica daemon` runs) on a
fresh temp directory, with a queue of as many workers as tasks (every one may run at once) and
`--processes` event-loop processes, for the benchmark's ASYNC_SLEEP executor (benchmarks/noop.py). Submits them with the real CLI,
`fredica submit --batch FILE`, then asks for the status every 50 ms through the public client
(one kept connection) until all have completed. The time is from just before the submit command
starts to the first status that shows them all completed. Memory: the daemon and all its descendants, sampled every 0.1 s by psutil; the peak of
the summed RSS (which counts pages shared by the fork server's children once per process: an
upper bound), of the summed PSS (each shared page split between the processes sharing it: what
they take together) and of the summed USS (pages each process alone holds: a lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from daemon.client import Client  # noqa: E402


def fredica(config: Path, *args: str) -> str:
    command = [sys.executable, "-m", "daemon", *args, "--config", str(config)]
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout


def sample_memory(root: psutil.Process, stop: threading.Event, peaks: dict[str, float]) -> None:
    while not stop.is_set():
        rss = uss = pss = 0
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return  # the daemon has gone
        for proc in procs:
            try:
                info, name = proc.memory_full_info(), proc.name()
            except psutil.Error:
                continue
            rss += info.rss
            uss += info.uss
            pss += info.pss
            role = "daemon" if proc.pid == root.pid else f"child {proc.pid} ({name})"
            peaks[role] = max(peaks.get(role, 0), info.rss / 2**20)
        peaks["rss"] = max(peaks.get("rss", 0), rss / 2**20)
        peaks["uss"] = max(peaks.get("uss", 0), uss / 2**20)
        peaks["pss"] = max(peaks.get("pss", 0), pss / 2**20)
        stop.wait(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each task sleeps")
    parser.add_argument("--processes", type=int, default=2, help="event-loop processes of the queue")
    parser.add_argument("--profile", metavar="FILE", help="record the daemon with py-spy into FILE (an SVG)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fredica-bench-loop-"))
    config = tmp / "fredica.toml"
    config.write_text(
        f'[daemon]\ndatabase = "{tmp}/fredica.db"\nsocket = "{tmp}/control.sock"\nlog_dir = "{tmp}/logs"\n'
        f'\n[executors]\nASYNC_SLEEP = "benchmarks.noop:AsyncSleep"\n'
        f'\n[queues.sleepy]\nworkers = {args.tasks}\nprocesses = {args.processes}\ntypes = ["ASYNC_SLEEP"]\n'
    )
    batch = tmp / "batch.jsonl"
    line = json.dumps({"type": "ASYNC_SLEEP", "payload": {"seconds": args.seconds}})
    batch.write_text("\n".join([line] * args.tasks) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    daemon = subprocess.Popen([sys.executable, "-m", "daemon", "daemon", "--config", str(config)],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.err", "w"))
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "control.sock").exists():
            assert daemon.poll() is None and time.monotonic() < deadline, (tmp / "daemon.err").read_text()
            time.sleep(0.05)
        peaks: dict[str, float] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample_memory, args=(psutil.Process(daemon.pid), stop, peaks))
        sampler.start()
        spy = None
        if args.profile:
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(daemon.pid), "--output", args.profile,
                                    "--format", "raw", "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)  # py-spy attaches
        daemon_process = psutil.Process(daemon.pid)
        cpu_before = sum(daemon_process.cpu_times()[:2])
        t0 = time.perf_counter()
        fredica(config, "submit", "--batch", str(batch))
        submitted = time.perf_counter() - t0
        # Watched through one kept connection, 20 times a second: a `fredica status` process per
        # look (120 ms of a core each) took most of a core from the 2 the daemon has.
        watcher = Client(config)
        most_running = 0  # the attempts at once: what the memory grows with
        while True:
            counts = watcher.status()["counts"]
            most_running = max(most_running, counts.get("running", 0))
            if counts.get("completed", 0) >= args.tasks:
                break
            stop.wait(0.05)
            if counts.get("failed", 0) or counts.get("cancelled", 0):
                failed = json.loads(fredica(config, "ls", "--status", "failed", "--json"))
                errors = sorted({(t["error_type"], (t["error"] or "")[:200]) for t in failed})
                raise SystemExit(f"tasks did not complete: {counts}; errors: {errors[:5]}")
        elapsed = time.perf_counter() - t0
        daemon_cpu = sum(daemon_process.cpu_times()[:2]) - cpu_before
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        stop.set()
        sampler.join()
        load = os.getloadavg()
        print(f"{args.tasks} tasks of asyncio.sleep({args.seconds:g}), {args.processes} event-loop processes; "
              f"load average {load[0]:.2f}")
        print(f"submit command: {submitted:.2f} s; all completed after {elapsed:.2f} s; "
              f"daemon CPU meanwhile {daemon_cpu:.2f} s (its threads, not its executor processes); "
              f"at most {most_running} running at once")
        print(f"peak memory, daemon + executor processes: RSS {peaks.pop('rss'):.0f} MB, "
              f"PSS {peaks.pop('pss'):.0f} MB, USS {peaks.pop('uss'):.0f} MB")
        print("peak RSS of each: " + ", ".join(f"{role} {mb:.0f} MB" for role, mb in sorted(peaks.items()) if mb >= 5))
    except BaseException:
        print(f"kept for a look: {tmp}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        daemon.terminate()
        daemon.wait(120)  # running tasks get the shutdown grace


if __name__ == "__main__":
    main()
