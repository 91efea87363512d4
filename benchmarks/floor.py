"""The floor under one submit call: what any daemon that commits before it answers must pay here.

Issue 13 asks for W1 (one submit call per task, from one producer) at >= 1.0x Huey with
`synchronous=NORMAL`, and a submit call p50 <= 0.25 ms. A producer that waits for each answer
can submit no faster than one call per round trip, so W1 per call can never beat 1 / (submit
p50). Huey's producer writes its own SQLite file, with no round trip at all. This measures, in
one run and in alternation (the machine is shared and noisy: compare the rows, not the runs):

  echo         a Python Unix-socket server on one thread (selectors, as the daemon's loop):
               read a JSON line, parse it, answer a JSON line. The round trip alone.
  echo+commit  the same server, and before answering, one task-shaped INSERT into a database
               built by fredica's own migrations (WAL, synchronous=NORMAL, the same indexes),
               in its own BEGIN IMMEDIATE ... COMMIT: the smallest durable submit.
  fredica      `Client.submit` against the real daemon (`fredica daemon --config`), each task
               held back by a dependency, as benchmarks/peers' S row.
  huey         Huey's enqueue at synchronous=NORMAL (benchmarks/peers/huey_app.py), from the
               producer's own process.

    python3 benchmarks/floor.py --calls 3000 --reps 3

Prints p50 and p95 per call in ms, and calls/s, per row (medians over the repetitions).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peers.fredica_daemon import latency_of  # noqa: E402

INSERT_RUN = ("INSERT INTO workflow_run (id, template, status, created_at, total_tasks, pending_tasks)"
              " VALUES (?, 'adhoc', 'pending', ?, 1, 1)")
INSERT_TASK = ("INSERT INTO task (id, type, workflow_run_id, status, payload, depends_on, created_at)"
               " VALUES (?, ?, ?, 'pending', ?, '[]', ?) RETURNING seq")


def serve(socket_path: str, database: str | None) -> None:
    """The floor server: answer each JSON line, after one committed insert if `database`."""
    conn = None
    if database is not None:
        from daemon.store import db

        conn = db.open_database(database)  # fredica's migrations and pragmas: the same schema
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(8)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                client, _ = listener.accept()
                client.setblocking(False)
                selector.register(client, selectors.EVENT_READ)
                buffers[client] = b""
                continue
            client = key.fileobj  # type: ignore[assignment]
            data = client.recv(65536)
            if not data:
                selector.unregister(client)
                client.close()
                return  # one client per benchmark row
            buffers[client] += data
            while b"\n" in buffers[client]:
                line, buffers[client] = buffers[client].split(b"\n", 1)
                request = json.loads(line)
                task_id = str(uuid.uuid4())
                if conn is not None:
                    now = time.time()
                    run_id = str(uuid.uuid4())
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(INSERT_RUN, (run_id, now))
                    conn.execute(INSERT_TASK, (task_id, request["type"], run_id, json.dumps(request["payload"]), now)).fetchone()
                    conn.execute("COMMIT")
                client.sendall(json.dumps({"ok": True, "id": task_id}).encode() + b"\n")


class FloorClient:
    """One connection to a floor server, one blocking round trip per call."""

    def __init__(self, socket_path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock.connect(socket_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.buffer = b""

    def submit(self) -> str:
        self.sock.sendall(json.dumps({"op": "submit", "type": "NOOP", "payload": {}}).encode() + b"\n")
        while b"\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)["id"]

    def close(self) -> None:
        self.sock.close()


def floor_row(n: int, with_commit: bool) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        path = os.path.join(tmp, "s.sock")
        args = [sys.executable, __file__, "--serve", path] + (["--database", os.path.join(tmp, "f.db")] if with_commit else [])
        server = subprocess.Popen(args, cwd=Path(__file__).resolve().parent.parent)
        try:
            client = FloorClient(path)
            latency_of(client.submit, 200)  # warm
            result = latency_of(client.submit, n)
            client.close()
            return result
        finally:
            server.wait(30)


def fredica_row(n: int) -> tuple[list[float], float]:
    from benchmarks.peers.fredica_daemon import FredicaDaemon

    with FredicaDaemon(1).instance() as daemon:
        return daemon.submit_latency(n)


def huey_row(n: int) -> tuple[list[float], float]:
    from benchmarks.peers import huey_app

    with tempfile.TemporaryDirectory(prefix="floor-huey-") as tmp:
        peer = huey_app.make_huey(os.path.join(tmp, "huey.db"), "normal")
        latency_of(peer.noop_marked, 200)
        result = latency_of(peer.noop_marked, n)
        peer.app.storage.close()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.database)
        return
    rows: dict[str, Callable[[], tuple[list[float], float]]] = {
        "echo": lambda: floor_row(args.calls, False),
        "echo+commit": lambda: floor_row(args.calls, True),
        "fredica": lambda: fredica_row(args.calls),
        "huey NORMAL": lambda: huey_row(args.calls),
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in rows}
    for rep in range(args.reps):
        names = list(rows)[rep % len(rows):] + list(rows)[:rep % len(rows)]  # rotated per repetition
        for name in names:
            latencies, rate = rows[name]()
            q = statistics.quantiles(latencies, n=20)
            results[name].append((statistics.median(latencies), q[18], rate))
    print(f"calls {args.calls}, reps {args.reps}, load average {os.getloadavg()[0]:.2f}")
    print("| row | p50 ms | p95 ms | calls/s |")
    print("|---|---|---|---|")
    for name, values in results.items():
        p50 = statistics.median(v[0] for v in values)
        p95 = statistics.median(v[1] for v in values)
        rate = statistics.median(v[2] for v in values)
        print(f"| {name} | {p50:.3f} | {p95:.3f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
