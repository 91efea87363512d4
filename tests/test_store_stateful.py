"""Stateful property test of the task store (SPEC §2-§5, §10) on a real SQLite file and on a real
PostgreSQL database (one machine, run once per backend).

A hypothesis `RuleBasedStateMachine` submits batches (with random priorities, dependencies on
stored tasks of every status and on earlier lines of the batch, idempotency keys from a small pool),
claims, starts, completes, fails, retries (with a simulated clock), requeues and cancels tasks and
runs, runs the store side of startup recovery, updates progress and pause flags, and tries requests
the store must refuse (which must change nothing). Beside the store it keeps its own model of every
task. After every step the invariants compare the database with that model and with
recomputations from the raw rows, never trusting the store's own bookkeeping:

- every task's status and times are what the model predicts (cascades included);
- a claim returns the first ready task (dependencies completed, not_before passed, highest
  priority, then lowest seq), never one that is claimed or running, and None only if none is ready;
- no pending task has a failed or cancelled ancestor;
- each run's status (SPEC §4, recomputed independently), counters and completed_at match its tasks;
- unmet_deps of every pending task is the number of its dependencies not completed;
- at most one active task per idempotency key;
- terminal task rows never change.

`CI=true` makes the run derandomized (the same examples every time);
`FREDICA_STATEFUL_EXAMPLES=N` runs N examples instead of 60.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sqlite3
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from daemon.errors import InvalidTransition, SubmissionRefused, UnknownRun, UnknownTask
from daemon.models import DEPENDENCY_FAILED, TaskStatus
from daemon.store import attempts, cancels, db, runs, tasks
from daemon.store import recovery as recovery_store
from daemon.submission import parse_spec
from tests import postgres_cluster, store_steps
from tests.conformance import conn  # noqa: F401 (every test on every backend)
from tests.conftest import BACKENDS

PENDING, CLAIMED, RUNNING = "pending", "claimed", "running"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
ACTIVE = frozenset({PENDING, CLAIMED, RUNNING})
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})
IDEMPOTENCY_KEYS = ("k1", "k2", "k3")
START_TIME = 1_000.0
CLAIM_TICK = 0.125
RETRY_DELAYS = st.sampled_from([0.0, 0.25, 0.5, 3.0])


@dataclass
class ModelTask:
    id: str
    seq: int
    run_id: str
    priority: int
    deps: tuple[str, ...]  # distinct dependency ids, in the order given
    idempotency_key: str | None
    status: str = PENDING
    not_before: float = 0.0
    retry_count: int = 0
    claimed_at: float | None = None
    started_at: float | None = None
    completed_at: float | None = None
    error_type: str | None = None


def expected_run_status(statuses: list[str]) -> str:
    """SPEC §4's five rules, written independently of `scheduler.run_status`."""
    count = collections.Counter(statuses)
    if count[FAILED]:
        return "failed"
    if statuses and count[COMPLETED] == len(statuses):
        return "completed"
    if count[CLAIMED] or count[RUNNING] or (count[PENDING] and (count[COMPLETED] or count[CANCELLED])):
        return "running"
    if statuses and count[PENDING] == len(statuses):
        return "pending"
    return "cancelled"


def dump(conn: sqlite3.Connection) -> tuple[list[tuple], ...]:
    """Everything the store keeps, to check that a refused request changed nothing."""
    return tuple(
        [tuple(row) for row in conn.execute(sql)]
        for sql in (
            "SELECT * FROM task ORDER BY seq",
            "SELECT * FROM workflow_run ORDER BY id",
            "SELECT * FROM task_dependency ORDER BY depends_on_seq, task_seq",
        )
    )


# An empty, migrated store for one example, and the directory to remove after it (if any).
Opener = Callable[[], tuple[sqlite3.Connection, str | None]]


def _fresh_sqlite() -> tuple[sqlite3.Connection, str | None]:
    tmpdir = tempfile.mkdtemp(prefix="fredica-stateful-")
    return db.open_database(os.path.join(tmpdir, "fredica.db")), tmpdir


class StoreMachine(RuleBasedStateMachine):
    open_store: Opener = staticmethod(_fresh_sqlite)  # per backend: `test_store_state_machine`

    def __init__(self) -> None:
        super().__init__()
        self.conn, self.tmpdir = self.open_store()
        self.now = START_TIME
        self.model: dict[str, ModelTask] = {}
        self.children: dict[str, list[str]] = collections.defaultdict(list)
        self.run_tasks: dict[str, list[str]] = {}
        self.run_completed_at: dict[str, float] = {}
        # Tasks handed out by claim_next and not yet back to pending or terminal.
        self.holding: set[str] = set()
        self.terminal_rows: dict[str, dict[str, Any]] = {}

    def teardown(self) -> None:
        statuses = collections.Counter(t.status for t in self.model.values())
        event(f"tasks at the end: {min(len(self.model) // 10 * 10, 50)}+")
        for status in (COMPLETED, FAILED, CANCELLED):
            event(f"{status} tasks at the end: {'some' if statuses[status] else 'none'}")
        self.conn.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # --- model helpers -------------------------------------------------------------------------

    def ids_with(self, *statuses: str) -> list[str]:
        return [t.id for t in sorted(self.model.values(), key=lambda t: t.seq) if t.status in statuses]

    def _end(self, task_id: str, status: str, error_type: str | None) -> None:
        task = self.model[task_id]
        task.status, task.completed_at, task.error_type = status, self.now, error_type
        self.holding.discard(task_id)

    def _cascade(self, ended: list[str]) -> None:
        """Cancel every pending task downstream of `ended` (SPEC §5), walking all edges."""
        seen: set[str] = set()
        stack = list(ended)
        while stack:
            for child in self.children[stack.pop()]:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        for child in seen:
            if self.model[child].status == PENDING:
                self._end(child, CANCELLED, DEPENDENCY_FAILED)

    def _settle(self) -> None:
        """Record when each run lost its last active task (its expected `completed_at`)."""
        for run_id, ids in self.run_tasks.items():
            if run_id not in self.run_completed_at and not any(
                self.model[i].status in ACTIVE for i in ids
            ):
                self.run_completed_at[run_id] = self.now

    def _ready(self) -> list[ModelTask]:
        return [
            t
            for t in self.model.values()
            if t.status == PENDING
            and t.not_before <= self.now
            and all(self.model[d].status == COMPLETED for d in t.deps)
        ]

    def _pick(self, data: st.DataObject, ids: list[str], label: str) -> str:
        return data.draw(st.sampled_from(ids), label=label)

    # --- rules: submission ---------------------------------------------------------------------

    @initialize(data=st.data(), batches=st.integers(0, 3))
    def seed_graph(self, data: st.DataObject, batches: int) -> None:
        """Start most examples with a few batches, so short examples still reach deep states."""
        for _ in range(batches):
            self.submit(data)

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        existing = self.ids_with(*ACTIVE, *TERMINAL)
        alive = self.ids_with(*ACTIVE, COMPLETED)
        if alive and data.draw(st.integers(0, 3), label="avoid dead dependencies") != 0:
            existing = alive  # mostly storable batches; failed/cancelled dependencies a quarter of the time
        size = data.draw(st.integers(1, 4), label="batch size")
        lines: list[dict[str, Any]] = []
        for index in range(size):
            external = (
                data.draw(st.lists(st.sampled_from(existing), max_size=2, unique=True), label="deps")
                if existing
                else []
            )
            earlier = (
                data.draw(
                    st.lists(st.sampled_from([f"L{j}" for j in range(index)]), max_size=2, unique=True),
                    label="batch deps",
                )
                if index
                else []
            )
            # Two references may resolve to one task (a line that reused an active task's key, and
            # that task's id, or two lines sharing a key): it must count as one dependency.
            refs = data.draw(st.permutations(external + earlier), label="order")
            line: dict[str, Any] = {
                "type": "T",
                "key": f"L{index}",
                "priority": data.draw(st.integers(-2, 2), label="priority"),
                "depends_on": refs,
            }
            key = data.draw(st.none() | st.sampled_from(IDEMPOTENCY_KEYS), label="idempotency key")
            if key is not None:
                line["idempotency_key"] = key
            lines.append(line)
        specs = [parse_spec(line) for line in lines]

        # A dependency that already failed or was cancelled does not refuse the batch (SPEC §5):
        # the lines naming it are stored and cancelled at once, with their dependents.
        dead = {
            ref for line in lines for ref in line["depends_on"]
            if not ref.startswith("L") and self.model[ref].status in (FAILED, CANCELLED)
        }
        event(f"submit: {'with dead dependencies' if dead else 'stored'}")

        submission = tasks.submit(self.conn, specs, now=self.now)

        # What the model expects, line by line.
        holder = {
            t.idempotency_key: t.id
            for t in self.model.values()
            if t.idempotency_key is not None and t.status in ACTIVE
        }
        assert len(submission.tasks) == len(lines)
        max_seq = max((t.seq for t in self.model.values()), default=0)
        resolved: list[str] = []
        created: list[str] = []
        for line, outcome in zip(lines, submission.tasks):
            key = line.get("idempotency_key")
            if key is not None and key in holder:
                assert not outcome.created, f"{line} was stored although {holder[key]} holds its key"
                assert outcome.id == holder[key]
                resolved.append(outcome.id)
                continue
            assert outcome.created, f"{line} was not stored"
            deps = tuple(
                dict.fromkeys(resolved[int(ref[1:])] if ref.startswith("L") else ref for ref in line["depends_on"])
            )
            row = tasks.get(self.conn, outcome.id)
            assert row.seq > max_seq, "strict submission order: seq must grow"
            max_seq = row.seq
            assert row.priority == line["priority"]
            assert row.workflow_run_id == submission.run_id
            assert tuple(dict.fromkeys(row.depends_on)) == deps
            self.model[outcome.id] = ModelTask(
                id=outcome.id,
                seq=row.seq,
                run_id=submission.run_id,
                priority=line["priority"],
                deps=deps,
                idempotency_key=key,
            )
            for dep in deps:
                self.children[dep].append(outcome.id)
            if key is not None:
                holder[key] = outcome.id
            resolved.append(outcome.id)
            created.append(outcome.id)
        for task_id in created:
            if dead & set(self.model[task_id].deps) and self.model[task_id].status == PENDING:
                self._end(task_id, CANCELLED, DEPENDENCY_FAILED)
                self._cascade([task_id])
        for task_id in created:
            row = tasks.get(self.conn, task_id)
            assert (row.status, row.error_type) == (self.model[task_id].status, self.model[task_id].error_type)
        if created:
            assert submission.run_id is not None
            self.run_tasks[submission.run_id] = created
            self._settle()  # a batch of only doomed tasks is a run that has ended
        else:
            # Every line was a duplicate: no run is left behind (checked by runs_match_their_tasks).
            assert submission.run_id is None

    # --- rules: the supervisor's transitions ---------------------------------------------------

    @rule()
    def claim(self) -> None:
        self._claim()

    def _claim(self) -> str | None:
        # Time moves on between claims, so a second start (after a retry or requeue) or a second
        # claim of the same task happens at a different time than the first.
        self.now += CLAIM_TICK
        ready = self._ready()
        expected = min(ready, key=lambda t: (-t.priority, t.seq)).id if ready else None
        claimed = store_steps.claim_next(self.conn, self.now)
        # A claim first promotes retries whose delay has passed into the ready tasks.
        for waiting in self.model.values():
            if waiting.status == PENDING and 0 < waiting.not_before <= self.now:
                waiting.not_before = 0
        event(f"claim: {'task' if claimed else 'nothing'}")
        if claimed is None:
            assert expected is None, f"claim returned nothing although {expected} is ready"
            assert not self._ready_in_rows(), "claim returned nothing although the rows show a ready task"
            return None
        assert claimed.id not in self.holding, f"{claimed.id} claimed twice while claimed/running"
        assert claimed.id == expected, f"claimed {claimed.id}, expected {expected}"
        self._check_claim_against_rows(claimed.id)
        task = self.model[claimed.id]
        task.status, task.claimed_at = CLAIMED, self.now
        self.holding.add(claimed.id)
        return claimed.id

    def _ready_in_rows(self) -> list[sqlite3.Row]:
        """Pending tasks that the raw rows alone say are ready."""
        rows = self._rows()
        return [
            row
            for row in rows.values()
            if row["status"] == PENDING
            and row["not_before"] <= self.now
            and all(rows[d]["status"] == COMPLETED for d in json.loads(row["depends_on"]))
        ]

    def _check_claim_against_rows(self, claimed_id: str) -> None:
        """From the raw rows alone: the claimed task was ready and came first."""
        rows = self._rows()
        me = rows[claimed_id]
        assert me["status"] == CLAIMED
        for dep in json.loads(me["depends_on"]):
            assert rows[dep]["status"] == COMPLETED, f"claimed {claimed_id} before its dependency {dep} completed"
        assert me["not_before"] <= self.now
        for other in self._ready_in_rows():
            assert (other["priority"], -other["seq"]) < (me["priority"], -me["seq"]), (
                f"claimed {claimed_id} (priority {me['priority']}, seq {me['seq']}) while "
                f"{other['id']} (priority {other['priority']}, seq {other['seq']}) was ready"
            )

    @rule(
        paused=st.booleans(),
        outcome=st.sampled_from(["complete", "retry", "requeue", "fail", "keep running"]),
        delay=RETRY_DELAYS,
    )
    def work(self, paused: bool, outcome: str, delay: float) -> None:
        """A worker's whole attempt in one step: claim and start the next ready task, then end it
        (or leave it running, maybe paused), so that short examples still go deep."""
        task_id = self._claim()
        if task_id is None:
            return
        self._start(task_id)
        if paused:
            assert attempts.set_paused(self.conn, task_id, True)
        if outcome == "complete":
            self._complete(task_id)
        elif outcome == "retry":
            self._retry(task_id, delay)
        elif outcome == "requeue":
            self._requeue(task_id)
        elif outcome == "fail":
            self._fail(task_id)

    def _start(self, task_id: str) -> None:
        tasks.start(self.conn, task_id, now=self.now, executor_pid=4242, executor_started_at=self.now)
        task = self.model[task_id]
        task.status = RUNNING
        if task.started_at is None:
            task.started_at = self.now

    @precondition(lambda self: self.ids_with(CLAIMED))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self._start(self._pick(data, self.ids_with(CLAIMED), "start"))

    @precondition(lambda self: self.ids_with(CLAIMED, RUNNING))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self._complete(self._pick(data, self.ids_with(CLAIMED, RUNNING), "complete"))

    def _complete(self, task_id: str) -> None:
        tasks.complete(self.conn, task_id, {"done": task_id}, now=self.now)
        self._end(task_id, COMPLETED, None)
        self._settle()

    @precondition(lambda self: self.ids_with(*ACTIVE))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        self._fail(self._pick(data, self.ids_with(*ACTIVE), "fail"))

    def _fail(self, task_id: str) -> None:
        tasks.fail(self.conn, task_id, error="boom", error_type="EXCEPTION", now=self.now)
        self._end(task_id, FAILED, "EXCEPTION")
        self._cascade([task_id])
        self._settle()

    @precondition(lambda self: self.ids_with(CLAIMED, RUNNING))
    @rule(data=st.data(), delay=RETRY_DELAYS)
    def retry(self, data: st.DataObject, delay: float) -> None:
        self._retry(self._pick(data, self.ids_with(CLAIMED, RUNNING), "retry"), delay)

    def _retry(self, task_id: str, delay: float) -> None:
        tasks.retry(
            self.conn, task_id, error="flaky", error_type="EXCEPTION", not_before=self.now + delay, now=self.now
        )
        task = self.model[task_id]
        task.status, task.not_before, task.error_type = PENDING, self.now + delay, "EXCEPTION"
        task.retry_count += 1
        self.holding.discard(task_id)

    @precondition(lambda self: self.ids_with(CLAIMED, RUNNING))
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        self._requeue(self._pick(data, self.ids_with(CLAIMED, RUNNING), "requeue"))

    def _requeue(self, task_id: str) -> None:
        tasks.requeue(self.conn, task_id, now=self.now)
        self.model[task_id].status = PENDING
        self.holding.discard(task_id)

    @precondition(lambda self: self.ids_with(*ACTIVE))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = self._pick(data, self.ids_with(*ACTIVE), "cancel")
        cancels.cancel(self.conn, task_id, now=self.now)
        self._end(task_id, CANCELLED, "CANCELLED")
        self._cascade([task_id])
        self._settle()

    @precondition(lambda self: self.run_tasks)
    @rule(data=st.data())
    def cancel_run(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(list(self.run_tasks)), label="run")
        in_run = sorted((self.model[i] for i in self.run_tasks[run_id]), key=lambda t: t.seq)
        waiting = [t.id for t in in_run if t.status in (PENDING, CLAIMED)]
        running = [t.id for t in in_run if t.status == RUNNING]
        outcome = cancels.cancel_waiting_in_run(self.conn, run_id, now=self.now)
        assert list(outcome.cancelled) == waiting
        assert list(outcome.running) == running
        for task_id in waiting:
            self._end(task_id, CANCELLED, "CANCELLED")
        self._cascade(waiting)
        self._settle()

    @rule()
    def restart(self) -> None:
        """The store side of startup recovery (SPEC §9 steps 3 and 6)."""
        running, claimed = self.ids_with(RUNNING), self.ids_with(CLAIMED)
        failed = recovery_store.fail_interrupted(self.conn, now=self.now)
        requeued = recovery_store.requeue_claimed(self.conn, now=self.now)
        runs.reconcile_non_terminal(self.conn, now=self.now)
        assert sorted(t.id for t in failed) == sorted(running)
        assert sorted(t.id for t in requeued) == sorted(claimed)
        for task_id in running:
            self._end(task_id, FAILED, "INTERRUPTED")
        self._cascade(running)
        for task_id in claimed:
            self.model[task_id].status = PENDING
            self.holding.discard(task_id)
        self._settle()

    @rule(step=st.sampled_from([0.5, 1.0, 4.0]))
    def advance_clock(self, step: float) -> None:
        self.now += step

    @precondition(lambda self: self.model)
    @rule(data=st.data(), op=st.sampled_from(["heartbeat", "progress", "pause", "pausable"]))
    def update_without_transition(self, data: st.DataObject, op: str) -> None:
        """Heartbeats, progress and pause flags change running tasks only, never a status."""
        candidates = self.ids_with(*ACTIVE, *TERMINAL)
        if self.ids_with(RUNNING) and data.draw(st.integers(0, 3), label="prefer running") != 0:
            candidates = self.ids_with(RUNNING)
        task_id = self._pick(data, candidates, op)
        running = self.model[task_id].status == RUNNING
        before = dump(self.conn)
        if op == "heartbeat":
            attempts.heartbeat(self.conn, [task_id], self.now)
            if running:
                assert tasks.get(self.conn, task_id).heartbeat_at == self.now
        elif op == "progress":
            percent = data.draw(st.integers(-5, 105), label="progress")
            assert attempts.record_progress(self.conn, [(task_id, percent, "working")]) == int(running)
            if running:
                assert tasks.get(self.conn, task_id).progress == max(0, min(100, percent))
        elif op == "pause":
            assert attempts.set_paused(self.conn, task_id, data.draw(st.booleans(), label="paused")) is running
        else:
            assert attempts.set_pausable(self.conn, task_id, data.draw(st.booleans(), label="pausable")) is running
        if not running:
            assert dump(self.conn) == before, f"{op} changed a task that is not running"

    # --- rules: refused requests ---------------------------------------------------------------

    INVALID_FROM = {
        "start": ACTIVE - {CLAIMED} | TERMINAL,
        "complete": {PENDING} | TERMINAL,
        "fail": TERMINAL,
        "retry": {PENDING} | TERMINAL,
        "requeue": {PENDING} | TERMINAL,
        "cancel": TERMINAL,
    }

    def _call(self, op: str, task_id: str) -> None:
        now = self.now
        if op == "start":
            tasks.start(self.conn, task_id, now=now)
        elif op == "complete":
            tasks.complete(self.conn, task_id, {"x": 1}, now=now)
        elif op == "fail":
            tasks.fail(self.conn, task_id, error="e", error_type="EXCEPTION", now=now)
        elif op == "retry":
            tasks.retry(self.conn, task_id, error="e", error_type="EXCEPTION", not_before=now, now=now)
        elif op == "requeue":
            tasks.requeue(self.conn, task_id, now=now)
        else:
            cancels.cancel(self.conn, task_id, now=now)

    @rule(data=st.data(), op=st.sampled_from([*sorted(INVALID_FROM), "submit", "cancel_run"]))
    def refused_request(self, data: st.DataObject, op: str) -> None:
        """A request the store must refuse, changing nothing."""
        before = dump(self.conn)
        if op == "submit":
            specs = [
                parse_spec({"type": "T", "key": "L0"}),
                parse_spec({"type": "T", "depends_on": ["L0", str(uuid.uuid4())]}),
            ]
            with pytest.raises(SubmissionRefused):
                tasks.submit(self.conn, specs, now=self.now)
        elif op == "cancel_run":
            with pytest.raises(UnknownRun):
                cancels.cancel_waiting_in_run(self.conn, str(uuid.uuid4()), now=self.now)
        elif (present := [s for s in sorted(self.INVALID_FROM[op]) if self.ids_with(s)]) and data.draw(
            st.booleans(), label="known task"
        ):
            # Pick the status first, so that rare ones (failed, claimed) are tried as often as others.
            status = data.draw(st.sampled_from(present), label="from status")
            task_id = self._pick(data, self.ids_with(status), op)
            with pytest.raises(InvalidTransition):
                self._call(op, task_id)
        else:
            with pytest.raises(UnknownTask):
                self._call(op, str(uuid.uuid4()))
        assert dump(self.conn) == before, f"a refused {op} changed the database"
        event(f"refused: {op}")

    # --- invariants, checked after every step --------------------------------------------------

    def _rows(self) -> dict[str, sqlite3.Row]:
        return {row["id"]: row for row in self.conn.execute("SELECT * FROM task ORDER BY seq")}

    @invariant()
    def database_matches_model(self) -> None:
        rows = self._rows()
        assert set(rows) == set(self.model)
        for task_id, task in self.model.items():
            row = rows[task_id]
            assert row["status"] == task.status, f"{task_id}: stored {row['status']}, model {task.status}"
            assert row["retry_count"] == task.retry_count
            assert row["not_before"] == task.not_before
            assert row["claimed_at"] == task.claimed_at
            assert row["started_at"] == task.started_at, "started_at must keep the first start"
            assert row["completed_at"] == task.completed_at
            if task.status in TERMINAL:
                assert row["error_type"] == task.error_type
            assert row["is_paused"] == 0 or task.status == RUNNING
            assert 0 <= row["progress"] <= 100
            assert row["progress"] == 100 or task.status != COMPLETED

    @invariant()
    def claimed_tasks_are_exactly_those_held(self) -> None:
        held = {r["id"] for r in self.conn.execute("SELECT id FROM task WHERE status IN ('claimed', 'running')")}
        assert held == self.holding

    @invariant()
    def no_pending_task_has_a_dead_ancestor(self) -> None:
        rows = self._rows()
        deps = {task_id: json.loads(row["depends_on"]) for task_id, row in rows.items()}
        for task_id, row in rows.items():
            if row["status"] != PENDING:
                continue
            seen, stack = set(), list(deps[task_id])
            while stack:
                ancestor = stack.pop()
                if ancestor in seen:
                    continue
                seen.add(ancestor)
                assert rows[ancestor]["status"] not in (FAILED, CANCELLED), (
                    f"pending {task_id} has a {rows[ancestor]['status']} ancestor {ancestor}"
                )
                stack.extend(deps[ancestor])

    @invariant()
    def unmet_deps_counts_unfinished_dependencies(self) -> None:
        rows = self._rows()
        for task_id, row in rows.items():
            if row["status"] == PENDING:
                unmet = sum(rows[d]["status"] != COMPLETED for d in dict.fromkeys(json.loads(row["depends_on"])))
                assert row["unmet_deps"] == unmet, (
                    f"pending {task_id}: unmet_deps={row['unmet_deps']}, dependencies not completed={unmet}"
                )

    @invariant()
    def runs_match_their_tasks(self) -> None:
        by_run: dict[str, list[str]] = collections.defaultdict(list)
        for row in self.conn.execute("SELECT workflow_run_id, status FROM task"):
            by_run[row[0]].append(row[1])
        stored = {row["id"]: row for row in self.conn.execute("SELECT * FROM workflow_run")}
        assert set(stored) == set(by_run) == set(self.run_tasks), "every run has tasks, every task a run"
        for run_id, statuses in by_run.items():
            run = stored[run_id]
            count = collections.Counter(statuses)
            assert run["status"] == expected_run_status(statuses), f"run {run_id} of {dict(count)}"
            assert run["total_tasks"] == len(statuses)
            assert run["done_tasks"] == count[COMPLETED]
            assert (
                run["pending_tasks"],
                run["claimed_tasks"],
                run["running_tasks"],
                run["failed_tasks"],
                run["cancelled_tasks"],
            ) == (count[PENDING], count[CLAIMED], count[RUNNING], count[FAILED], count[CANCELLED])
            assert run["completed_at"] == self.run_completed_at.get(run_id), (
                f"run {run_id}: completed_at {run['completed_at']}, "
                f"expected {self.run_completed_at.get(run_id)} ({dict(count)})"
            )
            recount = runs.counts_from_tasks(self.conn, run_id)
            assert runs.get(self.conn, run_id).counts == recount
            assert recount.total == len(statuses)

    @invariant()
    def one_active_task_per_idempotency_key(self) -> None:
        rows = self.conn.execute(
            "SELECT idempotency_key, count(*) FROM task WHERE idempotency_key IS NOT NULL "
            "AND status IN ('pending', 'claimed', 'running') GROUP BY idempotency_key HAVING count(*) > 1"
        ).fetchall()
        assert not rows, f"several active tasks share a key: {[tuple(r) for r in rows]}"

    @invariant()
    def terminal_tasks_never_change(self) -> None:
        for task_id, row in self._rows().items():
            snapshot = dict(row)
            # `unmet_deps` is internal bookkeeping (not a SPEC column, not in models.Task): the store
            # still decrements it on terminal dependents when a dependency completes, harmlessly.
            snapshot.pop("unmet_deps")
            if task_id in self.terminal_rows:
                assert snapshot == self.terminal_rows[task_id], f"terminal task {task_id} changed"
            elif row["status"] in TERMINAL:
                self.terminal_rows[task_id] = snapshot


MACHINE_SETTINGS = settings(
    # FREDICA_STATEFUL_EXAMPLES=1000 for a longer hunt (about 1 s of CPU per 20 examples).
    max_examples=int(os.environ.get("FREDICA_STATEFUL_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_state_machine(backend: str, request: pytest.FixtureRequest) -> None:
    opener: Opener = _fresh_sqlite
    if backend == "postgresql":
        url = request.getfixturevalue("postgres_module_database")

        def opener() -> tuple[sqlite3.Connection, str | None]:
            postgres_cluster.empty(url)
            return db.open_database(url), None

    machine = type(f"StoreMachineOn{backend.title()}", (StoreMachine,), {"open_store": staticmethod(opener)})
    run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


# --- regression: a store bug the machine found ---------------------------------------------------
#
# Found by the machine above on the first commit (9a988b2): when two references of a batch line
# resolved to one task, `_insert` counted that task twice in `unmet_deps` but stored one
# `task_dependency` edge, so the line stayed blocked forever after its dependency completed.
# Shrunk example: the first case below. Fixed in 8de1c0a (references deduplicated by resolved id).

DUPLICATE_REFERENCE_CASES = {
    # The machine's shrunk example: line 3 repeats line 1's idempotency key, so it resolves to line
    # 1's task, and line 4 depends on both.
    "same key in the batch": [
        {"type": "T", "key": "L0", "idempotency_key": "k3"},
        {"type": "T", "key": "L1"},
        {"type": "T", "key": "L2", "idempotency_key": "k3"},
        {"type": "T", "key": "L3", "depends_on": ["L2", "L0"]},
    ],
    # A line referenced both by its `key` and by its `id`.
    "key and id of one line": [
        {"type": "T", "key": "a", "id": "7d1c1c52-5a52-4e2b-9a53-2f3b1a9d0c11"},
        {"type": "T", "depends_on": ["a", "7d1c1c52-5a52-4e2b-9a53-2f3b1a9d0c11"]},
    ],
}


@pytest.mark.parametrize("lines", list(DUPLICATE_REFERENCE_CASES.values()), ids=list(DUPLICATE_REFERENCE_CASES))
def test_two_references_to_one_task_can_become_ready(conn: sqlite3.Connection, lines: list[dict]) -> None:
    submission = tasks.submit(conn, [parse_spec(line) for line in lines], now=1.0)
    last = submission.tasks[-1].id
    upstream = submission.tasks[0].id
    claimed = store_steps.claim_next(conn, 2.0)
    assert claimed is not None and claimed.id == upstream
    tasks.start(conn, upstream, now=3.0)
    tasks.complete(conn, upstream, {"ok": True}, now=4.0)
    while (claimed := store_steps.claim_next(conn, 5.0)) is not None and claimed.id != last:
        tasks.complete(conn, claimed.id, {"ok": True}, now=5.0)
    assert claimed is not None and claimed.id == last, "the dependent never became ready"


def test_reference_by_key_and_by_id_of_an_existing_task(conn: sqlite3.Connection) -> None:
    holder = tasks.submit(conn, [parse_spec({"type": "T", "idempotency_key": "k"})], now=1.0).tasks[0].id
    submission = tasks.submit(
        conn,
        [
            parse_spec({"type": "T", "key": "a", "idempotency_key": "k"}),
            parse_spec({"type": "T", "depends_on": ["a", holder]}),
        ],
        now=2.0,
    )
    dependent = submission.tasks[1].id
    assert conn.execute("SELECT unmet_deps FROM task WHERE id = ?", (dependent,)).fetchone()[0] == 1
    store_steps.claim_next(conn, 3.0)
    tasks.start(conn, holder, now=3.0)
    tasks.complete(conn, holder, {}, now=4.0)
    claimed = store_steps.claim_next(conn, 5.0)
    assert claimed is not None and claimed.id == dependent


# --- claiming never reads the tasks that cannot be claimed -------------------------------------
#
# Regression: migration 3's promotion of due retries was once planned on `task_by_status`, so
# every claim read every pending task (0.2 ms → 14 ms per claim with 100,000 blocked tasks).
# Measured in SQLite VM instructions, which are deterministic, not in time.


def _claim_cost(conn: sqlite3.Connection, now: float) -> int:
    """SQLite VM instructions (in tens) spent by one `claim_next`."""
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    conn.set_progress_handler(tick, 10)
    try:
        claimed = store_steps.claim_next(conn, now)
    finally:
        conn.set_progress_handler(None, 0)
    assert claimed is not None and claimed.type == "READY"
    return ticks[0]


def _waiting_mass(path: str, waiting: int, shape: str) -> sqlite3.Connection:
    """A database with `waiting` high-priority tasks that cannot be claimed, and 3 ready ones."""
    conn = db.open_database(path)
    gate = tasks.submit(conn, [parse_spec({"type": "GATE", "priority": 9})], now=1.0).tasks[0].id
    store_steps.claim_next(conn, 1.0)
    tasks.start(conn, gate, now=1.0)
    if shape == "blocked":  # behind an unfinished dependency
        mass = [parse_spec({"type": "BLOCKED", "priority": 5, "depends_on": [gate]}) for _ in range(waiting)]
        tasks.submit(conn, mass, now=1.0)
    else:  # waiting out a retry delay
        ids = [t.id for t in tasks.submit(conn, [parse_spec({"type": "DELAYED", "priority": 5})] * waiting, now=1.0).tasks]
        with db.write(conn):
            for task_id in ids:
                tasks.transition(conn, task_id, TaskStatus.CLAIMED, now=1.0)
                tasks.retry(conn, task_id, error="e", error_type="EXCEPTION", not_before=1e9, now=1.0)
    tasks.submit(conn, [parse_spec({"type": "READY"})] * 3, now=1.0)
    return conn


@pytest.mark.parametrize("shape", ["blocked", "delayed"])
def test_claim_cost_does_not_grow_with_waiting_tasks(tmp_path: Any, shape: str) -> None:
    costs = {}
    for waiting in (20, 2_000):
        conn = _waiting_mass(str(tmp_path / f"{shape}-{waiting}.db"), waiting, shape)
        try:
            costs[waiting] = _claim_cost(conn, 2.0)
        finally:
            conn.close()
    assert costs[2_000] <= 2 * costs[20], f"claim cost with 20 vs 2,000 waiting tasks: {costs}"
