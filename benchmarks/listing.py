#!/usr/bin/env python3
"""`ls`, `ls --json`, `watch` and `status` with many tasks (issue 14 points 6 and 7), run by hand.

    python3 benchmarks/listing.py                        # this tree's daemon and CLI
    git archive main | tar -x -C /tmp/before             # the code before, to compare
    python3 benchmarks/listing.py --code /tmp/before

Builds a database of --tasks waiting tasks (through the store, in runs of 1,000, with the default
queue paused so that none runs) and starts the real daemon of --code on it; then, each in a fresh
process with its output to a pipe that is read and thrown away:
- `fredica ls` and `fredica ls --json`: wall time, the client's peak RSS (`wait4`), the daemon's
  peak RSS during the command (its VmHWM, reset first through /proc/PID/clear_refs), median of --reps;
- `fredica status`: a loop of 20, mean and median, with the load average;
- `watch`: another daemon with --running tasks running (GATE, from tests/listing_executors.py,
  copied into --code when it lacks it) and --waiting waiting, `fredica watch` in a pseudo-terminal
  of 24x80 for --seconds: the CPU time of the client, and of the daemon less its CPU over as long
  without the watch.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from daemon import protocol  # noqa: E402
from daemon.store import db, queues, tasks  # noqa: E402
from daemon.submission import parse_spec  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def build(path: Path, count: int) -> None:
    conn = db.open_database(path)
    queues.set_paused(conn, "default", True, now=time.time())
    now = time.time() - count
    for start in range(0, count, 1000):
        specs = [parse_spec({"type": "ECHO", "priority": n % 5,
                             "payload": {"url": f"https://media.example/{start + n}.mkv", "n": start + n}})
                 for n in range(min(1000, count - start))]
        tasks.submit(conn, specs, now=now + start)
    conn.close()


class Daemon:
    """The daemon of `code` on `root`/db.sqlite."""

    def __init__(self, code: Path, root: Path, max_workers: int = 2) -> None:
        self.code, self.root = code, root
        self.config = root / "config.toml"
        self.socket = root / "run" / "control.sock"
        self.config.write_text(
            f'[daemon]\ndatabase = "{root / "db.sqlite"}"\nsocket = "{self.socket}"\nlog_dir = "{root / "logs"}"\n'
            f'max_workers = {max_workers}\n[executors]\nECHO = "tests.sample_executors:Echo"\n'
            'GATE = "tests.listing_executors:Gate"\n')
        self.env = {**os.environ, "PYTHONPATH": str(code)}
        self.env.pop("FREDICA_CONFIG", None)
        self.process = subprocess.Popen([sys.executable, "-m", "daemon", "daemon", "--config", str(self.config)],
                                        env=self.env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.call("status")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def call(self, op: str, **args: object) -> object:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(120)
            sock.connect(str(self.socket))
            sock.sendall(protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST))
            reply = protocol.read_frame(sock, protocol.MAX_REPLY)
        assert reply["ok"], reply
        return reply["data"]

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)

    def fredica(self, *args: str) -> tuple[float, float, float, int]:
        """(wall seconds, client peak RSS MB, daemon peak RSS MB, bytes printed) of one command."""
        self.reset_peak()
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "daemon", *args, "--config", str(self.config)],
                                 env=self.env, cwd=self.code, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert child.stdout is not None
        printed = 0
        while chunk := child.stdout.read(1 << 16):
            printed += len(chunk)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        assert child.returncode == 0, (args, child.returncode)
        return wall, usage.ru_maxrss / 1024, self.peak_mb(), printed


def measure_listing(code: Path, work: Path, count: int, reps: int) -> None:
    root = work / "listing"
    root.mkdir()
    started = time.perf_counter()
    build(root / "db.sqlite", count)
    print(f"built {count} waiting tasks in {time.perf_counter() - started:.1f} s", flush=True)
    daemon = Daemon(code, root)
    try:
        for args in (["ls"], ["ls", "--json"]):
            runs = [daemon.fredica(*args) for _ in range(reps)]
            wall, client, peak, printed = (statistics.median(r[i] for r in runs) for i in range(4))
            print(f"fredica {' '.join(args)}: {wall:.2f} s, client peak RSS {client:.0f} MB, "
                  f"daemon peak RSS {peak:.0f} MB, {printed / 1e3:.0f} kB printed (median of {reps})", flush=True)
        times = [daemon.fredica("status")[0] for _ in range(20)]
        print(f"fredica status x20: mean {statistics.mean(times) * 1000:.0f} ms, median "
              f"{statistics.median(times) * 1000:.0f} ms; load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        daemon.stop()


def measure_watch(code: Path, work: Path, running: int, waiting: int, seconds: float) -> None:
    root = work / "watch"
    root.mkdir()
    daemon = Daemon(code, root, max_workers=running)
    go = root / "go"
    try:
        daemon.call("submit", tasks=[{"type": "GATE", "priority": 9, "payload": {"go_file": str(go), "text": "x" * 60}}
                                     for _ in range(running)])
        while daemon.call("status")["counts"]["running"] < running:
            time.sleep(0.2)
        for start in range(0, waiting, 1000):
            daemon.call("submit", tasks=[{"type": "ECHO", "payload": {"n": n}} for n in range(start, start + 1000)])
        time.sleep(2)  # let the submissions' work settle before the idle baseline
        before = daemon.cpu()
        time.sleep(seconds)
        idle = daemon.cpu() - before
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {k: v for k, v in daemon.env.items() if k not in ("COLUMNS", "LINES")}
        child = subprocess.Popen([sys.executable, "-m", "daemon", "watch", "--config", str(daemon.config)],
                                 stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm"},
                                 cwd=code, start_new_session=True)
        os.close(slave)
        printed = [0]

        def drain() -> None:
            while True:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                printed[0] += len(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        before = daemon.cpu()
        time.sleep(seconds)
        during = daemon.cpu() - before
        child.send_signal(signal.SIGINT)
        _, _, usage = os.wait4(child.pid, 0)
        reader.join(5)
        os.close(master)
        client = usage.ru_utime + usage.ru_stime
        print(f"watch ({running} running, {waiting} waiting, 24x80 pty, {seconds:g} s): client CPU "
              f"{client:.2f} s ({100 * client / seconds:.0f}%), daemon CPU {during:.2f} s "
              f"({100 * during / seconds:.0f}%) against {idle:.2f} s ({100 * idle / seconds:.0f}%) without it, "
              f"{printed[0] / 1e6:.2f} MB drawn; load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        go.touch()
        daemon.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, default=REPO, help="the tree whose daemon and CLI run")
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--running", type=int, default=50)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--skip-watch", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fredica-listing-"))
    if not (args.code / "tests" / "listing_executors.py").exists():  # the config names it: the daemon checks
        shutil.copy(REPO / "tests" / "listing_executors.py", args.code / "tests" / "listing_executors.py")
    try:
        measure_listing(args.code.resolve(), work, args.tasks, args.reps)
        if not args.skip_watch:
            measure_watch(args.code.resolve(), work, args.running, args.waiting, args.seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
