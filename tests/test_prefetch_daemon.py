"""A queue's prefetch (SPEC §15) with real executor processes and the real daemon: tasks sent
ahead to a reused process run there, each exactly once, without a round trip to the daemon; one
waiting behind a busy worker is handed to a worker that frees; after a kill -9 of the daemon the
tasks it had sent ahead are INTERRUPTED, in the restart log, and none runs twice.

The supervisor's side of each rule, stepped with fake processes: tests/test_prefetch_stepped.py.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable

import psutil

from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.prefetch_executors import tally

EXECUTORS = {"TALLY": "tests.prefetch_executors:Tally", "ATALLY": "tests.prefetch_executors:AsyncTally"}


def prefetching(daemons: Callable[..., Daemon], *, workers: int, prefetch: int, name: str = "d") -> Daemon:
    return daemons(name, executors=EXECUTORS, max_workers=workers, tasks_per_process=50, warm_spare=False,
                   extra_toml=f"[queues.default]\nprefetch = {prefetch}\n")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def rows(d: Daemon, ids: list[str]) -> list[dict[str, Any]]:
    return [d.task(task_id) for task_id in ids]


def test_tasks_sent_ahead_run_each_once_in_the_process_they_were_sent_to(daemons: Any, tmp_path: Path) -> None:
    d = prefetching(daemons, workers=1, prefetch=3).start()
    ledger, go = tmp_path / "tally", tmp_path / "go"
    first = d.submit("TALLY", payload={"tally": str(ledger), "go_file": str(go)})
    rest = [d.submit("TALLY", payload={"tally": str(ledger)}) for _ in range(7)]
    pid = d.wait_task(first, "running")["executor_pid"]
    # While the first one runs, three wait behind it, claimed, sent to its process (recorded).
    behind = wait_for(lambda: len(claimed := [t for t in rows(d, rest) if t["status"] == "claimed"]) == 3 and claimed)
    assert all(t["executor_pid"] == pid and t["started_at"] is None for t in behind)
    assert [t["status"] for t in rows(d, rest)].count("pending") == 4
    # `running` is recorded before the task is sent: its line is written a moment later.
    assert wait_for(lambda: tally(ledger)) == [(first, pid)]
    go.touch()
    for task_id in [first, *rest]:
        assert d.wait_task(task_id, "completed", "failed")["status"] == "completed", d.task(task_id)
    runs = tally(ledger)
    assert sorted(task_id for task_id, _ in runs) == sorted([first, *rest])  # each exactly once
    assert {p for _, p in runs} == {pid}  # one process ran them all
    assert all(d.task(t["id"])["result"] == {"pid": pid} for t in behind)


def test_a_task_waiting_behind_a_busy_worker_is_handed_to_the_worker_that_frees(daemons: Any, tmp_path: Path) -> None:
    d = prefetching(daemons, workers=2, prefetch=1).start()
    ledger = tmp_path / "tally"
    gates = [tmp_path / "go-a", tmp_path / "go-b"]
    busy = [d.submit("TALLY", payload={"tally": str(ledger), "go_file": str(gate)}) for gate in gates]
    pids = [d.wait_task(task_id, "running")["executor_pid"] for task_id in busy]
    waiting = d.submit("TALLY", payload={"tally": str(ledger)})
    behind_pid = wait_for(lambda: (t := d.task(waiting))["status"] == "claimed" and t["executor_pid"])
    held, freed = (0, 1) if behind_pid == pids[0] else (1, 0)
    gates[freed].touch()  # the other worker frees first: the task is taken back and runs there
    row = d.wait_task(waiting, "completed")
    assert row["executor_pid"] == pids[freed] and row["result"] == {"pid": pids[freed]}
    assert d.task(busy[held])["status"] == "running"
    gates[held].touch()
    d.wait_task(busy[held], "completed")
    counts = collections.Counter(task_id for task_id, _ in tally(ledger))
    assert counts == {busy[0]: 1, busy[1]: 1, waiting: 1}
    events = [e["event"] for e in d.log_events() if e.get("task_id") == waiting]
    assert "task_sent_ahead" in events and "task_handed_over" in events


def test_after_kill9_the_tasks_sent_ahead_are_interrupted_and_none_runs_twice(daemons: Any, tmp_path: Path) -> None:
    d = prefetching(daemons, workers=1, prefetch=2).start()
    ledger, go = tmp_path / "tally", tmp_path / "go"
    first = d.submit("TALLY", payload={"tally": str(ledger), "go_file": str(go)})
    rest = [d.submit("TALLY", payload={"tally": str(ledger)}) for _ in range(3)]
    pid = d.wait_task(first, "running")["executor_pid"]
    wait_for(lambda: [t["status"] for t in rows(d, rest)] == ["claimed", "claimed", "pending"])
    assert [t["executor_pid"] for t in rows(d, rest[:2])] == [pid, pid]
    wait_for(lambda: tally(ledger))  # the first has begun
    d.kill9()
    wait_for(lambda: gone(pid))  # the executor ends with its daemon (SPEC §13)
    go.touch()  # were anything of the old session still there, it could now run on
    d.start()
    after = rows(d, [first, *rest])
    assert [t["status"] for t in after[:3]] == ["failed"] * 3
    assert all(t["error_type"] == "INTERRUPTED" for t in after[:3])
    d.wait_task(rest[2], "completed")  # never sent: it simply runs
    logged = {entry["task_id"]: entry["status_at_restart"] for entry in d.data("restarts")}
    assert logged == {first: "running", rest[0]: "claimed", rest[1]: "claimed"}
    counts = collections.Counter(task_id for task_id, _ in tally(ledger))
    assert counts[first] == 1 and counts[rest[2]] == 1 and max(counts.values()) == 1
    assert counts[rest[0]] == counts[rest[1]] == 0  # the executor was ended with its daemon, running the first


def test_an_event_loop_queue_sends_tasks_ahead_and_runs_each_once(daemons: Any, tmp_path: Path) -> None:
    d = daemons(executors=EXECUTORS, warm_spare=False,
                extra_toml="[queues.web]\nworkers = 2\nprefetch = 2\ntypes = ['ATALLY']\n").start()
    ledger, gates = tmp_path / "tally", [tmp_path / "go-a", tmp_path / "go-b"]
    busy = [d.submit("ATALLY", payload={"tally": str(ledger), "go_file": str(gate)}) for gate in gates]
    pid = d.wait_task(busy[0], "running")["executor_pid"]
    d.wait_task(busy[1], "running")
    rest = [d.submit("ATALLY", payload={"tally": str(ledger)}) for _ in range(6)]
    # Two attempts run; each of their workers holds two more, sent to the event-loop process.
    wait_for(lambda: [t["status"] for t in rows(d, rest)].count("claimed") == 4)
    claimed = [t for t in rows(d, rest) if t["status"] == "claimed"]
    assert all(t["executor_pid"] == pid for t in claimed)
    # `running` is recorded before a task is sent: its line is written a moment later.
    assert sorted(task_id for task_id, _ in wait_for(lambda: len(tally(ledger)) >= 2 and tally(ledger))) == sorted(busy)
    for gate in gates:
        gate.touch()
    for task_id in [*busy, *rest]:
        assert d.wait_task(task_id, "completed", "failed")["status"] == "completed", d.task(task_id)
    counts = collections.Counter(task_id for task_id, _ in tally(ledger))
    assert counts == {task_id: 1 for task_id in [*busy, *rest]}
    assert {p for _, p in tally(ledger)} == {pid}
