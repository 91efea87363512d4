#!/usr/bin/env python3
"""`fredica status` latency with many idle or trickling control-socket connections (issue 12, SPEC
§13: within 1 s with 200 such connections open), run by hand.

    python3 benchmarks/idle_connections.py                       # 200 idle connections, 60 runs (~6 s)
    python3 benchmarks/idle_connections.py --mode trickle        # each sends a byte every second
    python3 benchmarks/idle_connections.py --connections 0       # the baseline: none open

Starts the real daemon (`python3 -m daemon daemon --config FILE`, as `fredica daemon` runs) on a
fresh temp directory with the default `request_timeout` (5 s) and no tasks, opens the
connections, then times `fredica status` run as a process by the installed console script (the
whole round trip a user waits for: interpreter start, import, connect, reply), --reps times, one
after another. The daemon closes each connection `request_timeout` after it opened (idle) or after
its first byte (trickle), as it must; a keeper thread opens a new one for each it closes, so
--connections stay open throughout. Prints every time, the median and the max, and how many
connections were open at the slowest moment.
"""

from __future__ import annotations

import argparse
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Keeper(threading.Thread):
    """Keeps `count` connections open to `path`: a new one for each the daemon closes; in trickle
    mode each sends the start of a request that never ends, a byte every `pace` seconds."""

    def __init__(self, path: Path, count: int, trickle: bool, pace: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.path, self.count, self.trickle, self.pace = path, count, trickle, pace
        self.selector = selectors.DefaultSelector()
        self.open: dict[socket.socket, int] = {}  # socket -> bytes sent
        self.replaced = 0
        self.refused = 0  # connects that failed (a daemon that does not accept: the old one)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def fill(self) -> None:
        while len(self.open) < self.count and not self.stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(1.0)
            try:
                sock.connect(str(self.path))
            except OSError:  # the backlog is full: try again next round
                sock.close()
                self.refused += 1
                return
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            with self.lock:
                self.open[sock] = 0

    def run(self) -> None:
        data = (1000).to_bytes(4, "big") + b"{" * 1000
        next_byte = time.monotonic()
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.05):
                sock = key.fileobj
                try:
                    gone = not sock.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    gone = True
                if gone:
                    self.selector.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
                    with self.lock:
                        del self.open[sock]  # type: ignore[arg-type]
                    self.replaced += 1
            if self.trickle and time.monotonic() >= next_byte:
                next_byte += self.pace
                for sock, sent in list(self.open.items()):
                    try:
                        sock.send(data[sent : sent + 1])
                        self.open[sock] = sent + 1
                    except OSError:
                        pass  # closed by the daemon: the selector sees it next
            self.fill()

    def close(self) -> None:
        self.stop.set()
        self.join()
        for sock in list(self.open):
            sock.close()


def console_script() -> str:
    for candidate in (Path(sys.executable).with_name("fredica"), shutil.which("fredica")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("the fredica console script is not installed (python3 -m pip install -e .)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--mode", choices=["idle", "trickle"], default="idle")
    parser.add_argument("--reps", type=int, default=60)
    args = parser.parse_args()
    fredica = console_script()
    work = Path(tempfile.mkdtemp(prefix="fredica-idle-"))
    config = work / "config.toml"
    config.write_text(f'[daemon]\ndatabase = "{work}/fredica.db"\nsocket = "{work}/run/control.sock"\n'
                      f'log_dir = "{work}/logs"\nmax_workers = 2\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("FREDICA_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        env.pop(name, None)
    daemon = subprocess.Popen([sys.executable, "-m", "daemon", "daemon", "--config", str(config)], env=env,
                              stdout=open(work / "daemon.out", "w"), stderr=subprocess.STDOUT)
    keeper = None
    try:
        status = [fredica, "status", "--config", str(config)]
        deadline = time.monotonic() + 30
        while subprocess.run(status, env=env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"the daemon did not start: {(work / 'daemon.out').read_text()}")
            time.sleep(0.1)
        keeper = Keeper(work / "run" / "control.sock", args.connections, trickle=args.mode == "trickle")
        keeper.fill()
        keeper.start()
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"{args.connections} {args.mode} connections open", flush=True)
        times, open_at_slowest, failures, first_failure = [], 0, 0, ""
        for _ in range(args.reps):
            with keeper.lock:
                open_now = len(keeper.open)
            started = time.perf_counter()
            done = subprocess.run(status, env=env, capture_output=True, timeout=60)
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                failures += 1
                first_failure = first_failure or f"exit {done.returncode}: {done.stderr.decode().strip()}"
            if not times or elapsed > max(times):
                open_at_slowest = open_now
            times.append(elapsed)
        print(f"`fredica status` (process), ms: {', '.join(f'{t * 1000:.1f}' for t in times)}")
        print(f"median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms, "
              f"{failures} failed; {open_at_slowest} connections open at the slowest; "
              f"{keeper.replaced} closed by the daemon (request_timeout) and reopened meanwhile, "
              f"{keeper.refused} connects refused")
        if first_failure:
            print(f"first failure: {first_failure}")
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if keeper is not None:
            keeper.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
