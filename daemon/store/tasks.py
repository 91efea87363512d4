"""Task repository: the one guarded transition, and the transitions the supervisor makes on the
tasks it claims and runs (submission: `submissions`); a task read by id, and its dependents.

Every status change of a task goes through `_transition`, which runs
`UPDATE task ... WHERE seq IN (...) AND status IN (<allowed sources>)`, moves the run counters and
applies the consequences (dependents unblocked or cancelled) in the caller's transaction. The
store's modules that move many rows at once call it too: `cancels` (a user's cancels) and
`recovery` (what a supervisor left in flight). Elsewhere: `attempts`, the updates of a running
attempt that change no status; `task_reads`, the reads of many tasks.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from daemon import models
from daemon.errors import InvalidTransition, StaleAttempt, UnknownTask
from daemon.models import Task, TaskStatus
from daemon.store import backend, db, runs, statuses, submissions
from daemon.store.postgres import claim as postgres_claim
from daemon.store.postgres import wakeups
from daemon.store.db import write
from daemon.store.submissions import Submission, SubmittedTask  # noqa: F401 (the repository's API)
from daemon.submission import TaskSpec

# Columns a transition may set besides the status and the timestamps it sets itself.
TRANSITION_FIELDS = frozenset(
    {
        "result",
        "error",
        "error_type",
        "progress",
        "status_text",
        "retry_count",
        "not_before",
        "executor_pid",
        "executor_started_at",
        "is_pausable",
        "is_held",
        "supervisor",
    }
)


class AttemptRef(NamedTuple):
    """Which attempt of a task a write is about: the supervisor that claimed it and its claim
    count (`attempt`). A write so named is applied only while that attempt is the task's current
    one: a late write from a supervisor presumed dead, whose task was rescued and claimed again,
    changes nothing (SPEC §16). Given a bare task id instead, a write applies to whichever
    attempt runs (a user's request)."""

    task_id: str
    supervisor: str | None
    attempt: int

    @classmethod
    def of(cls, task: Task) -> "AttemptRef":
        return cls(task.id, task.supervisor, task.attempt)


# Appended to a guarded UPDATE's WHERE: the row is still at the attempt the write names.
# COALESCE: a task claimed with no supervisor named (the store's own tests) is fenced by ''.
_FENCE = "COALESCE(supervisor, '') = :fence_supervisor AND attempt = :fence_attempt"


# --- reads -------------------------------------------------------------------------------------


def find(conn: sqlite3.Connection, task_id: str) -> Task | None:
    row = conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else Task.from_row(row)


def get(conn: sqlite3.Connection, task_id: str) -> Task:
    task = find(conn, task_id)
    if task is None:
        raise UnknownTask(f"no task has id {task_id}")
    return task


# The seqs of every task that depends on the task of seq `?`, directly or transitively.
_BELOW = """
    WITH RECURSIVE below(seq) AS (
        SELECT task_seq FROM task_dependency WHERE depends_on_seq = ?
        UNION
        SELECT d.task_seq FROM task_dependency AS d JOIN below ON d.depends_on_seq = below.seq
    )
"""


def downstream(conn: sqlite3.Connection, task_id: str) -> list[Task]:
    """Every task that depends on `task_id`, directly or transitively, in submission order."""
    seq = _current(conn, task_id)["seq"]
    rows = conn.execute(f"{_BELOW} SELECT task.* FROM task JOIN below USING (seq) ORDER BY seq", (seq,))
    return [Task.from_row(row) for row in rows]


def active_downstream(conn: sqlite3.Connection, task_id: str) -> int:
    """How many tasks not yet ended depend on `task_id`, directly or transitively."""
    seq = _current(conn, task_id)["seq"]
    return conn.execute(
        f"{_BELOW} SELECT count(*) FROM task JOIN below USING (seq) WHERE status IN ({statuses.ACTIVE})", (seq,)
    ).fetchone()[0]


# --- the guarded transition --------------------------------------------------------------------


def _transition(
    conn: sqlite3.Connection,
    rows: Sequence[Mapping[str, Any]],
    target: TaskStatus,
    *,
    now: float,
    fields: Mapping[str, Any] | None = None,
    cascade: bool = True,
    snapshots: bool = True,
    fence: AttemptRef | None = None,
    partial: bool = False,
    each: Sequence[Mapping[str, Any]] | None = None,
    fences: Sequence[AttemptRef] | None = None,
) -> list[Task]:
    """Move the given task rows (seq, id, status, workflow_run_id) to `target`; all or nothing.

    Each row's status must be an allowed source of `target` (SPEC §3), and the UPDATE re-checks it,
    so a row that changed under us makes the whole call fail rather than half-apply. Returns the
    updated tasks, or nothing with `snapshots=False` (a cascade over 100,000 tasks would otherwise
    read back and parse every row it just wrote). `fence` (one row): the UPDATE also re-checks
    that the row is at that attempt, else StaleAttempt. A claim names its supervisor in
    `fields` and counts one more attempt.

    `partial`: the rows that changed since they were read, or whose attempt is not `fence`'s (which
    then names the supervisor and attempt of every row, its task id aside), are left as they are
    instead, and the tasks returned are the ones moved. For many attempts started at once, whose
    caller moves the rows left out one by one to learn why.

    `each` (with `snapshots=False`): what differs from row to row (a result), one mapping of the
    same fields per row, and `fences` the attempt of each row: one statement run for every row
    (`executemany`), all or nothing as ever. For many attempts ended at once.
    """
    fields = dict(fields or {})
    unexpected = set(fields).union(*(each or ())) - TRANSITION_FIELDS
    if unexpected:
        raise ValueError(f"a transition cannot set {sorted(unexpected)}")
    sources = models.sources_of(target)
    for row in rows:
        current = TaskStatus(row["status"])
        if current not in sources:
            raise InvalidTransition(row["id"], current.value, target.value)
    if not rows:
        return []

    assignments = {"status": target.value, **fields}
    raw: dict[str, str] = {}
    if target is TaskStatus.CLAIMED:
        assignments["claimed_at"] = now
        raw["attempt"] = "attempt + 1"
    elif target is TaskStatus.RUNNING:
        raw["started_at"] = "COALESCE(started_at, :now)"
        assignments["heartbeat_at"] = now
        # A new attempt starts unpaused, with nothing asked of it by another supervisor yet.
        assignments.update(is_paused=0, pause_wanted=None)
    elif target is TaskStatus.PENDING:
        assignments.update(is_paused=0, executor_pid=None, executor_started_at=None, pause_wanted=None)
    else:  # terminal
        assignments.update(completed_at=now, is_paused=0, pause_wanted=None)
    # (`pause_wanted`: what another supervisor asked of a running attempt, gone with it.)
    if target is not TaskStatus.PENDING:
        assignments["is_held"] = 0  # only a pending task is held
        if target is TaskStatus.COMPLETED:
            assignments["progress"] = 100
    if "result" in assignments and assignments["result"] is not None:
        assignments["result"] = _result_json(assignments["result"])
    if each is not None:
        assert not snapshots and not partial and fence is None and len(each) == len(rows)
        assert fences is None or len(fences) == len(rows)
        each = [{**one, "result": _result_json(one["result"])} if one.get("result") is not None else one
                for one in each]
        assignments.update(dict.fromkeys(each[0] if each else ()))  # named in the SET; given per row

    set_sql = ", ".join([f"{col} = :{col}" for col in assignments] + [f"{c} = {e}" for c, e in raw.items()])
    seqs = [row["seq"] for row in rows]
    if each is not None:
        _update_each(conn, rows, each, fences, set_sql, {**assignments, "now": now}, target)
        return _consequences(conn, rows, seqs, target, now=now, cascade=cascade, updated=[])
    # Each row must still be in the status it was read in, which the run counters move by: a
    # caller's snapshot may be stale, and on PostgreSQL another connection may have moved it since
    # (SQLite's writers cannot interleave). So one guarded UPDATE per status read (and per 500).
    read_in: dict[str, list[int]] = {}
    for row in rows:
        read_in.setdefault(row["status"], []).append(row["seq"])
    chunks = [(status, group[i : i + 500]) for status, group in read_in.items() for i in range(0, len(group), 500)]
    params = {**assignments, "now": now}
    fenced = ""
    assert snapshots or not partial, "a partial transition returns what it moved"
    if fence is not None:
        assert partial or len(rows) == 1, "an attempt's fence names one task"
        fenced = f" AND {_FENCE}"
        params.update(fence_supervisor=fence.supervisor or "", fence_attempt=fence.attempt)
    updated: list[Task] = []
    changed = 0
    returning = " RETURNING *" if snapshots else ""
    for status, chunk in chunks:
        marks = ", ".join(f":s{i}" for i in range(len(chunk)))
        params_chunk = {**params, **{f"s{i}": seq for i, seq in enumerate(chunk)}}
        cursor = conn.execute(
            f"UPDATE task SET {set_sql} WHERE seq IN ({marks}) AND status = '{status}'{fenced}{returning}",
            params_chunk,
        )
        if snapshots:
            batch = [Task.from_row(r) for r in cursor]
            updated += batch
            changed += len(batch)
        else:
            changed += cursor.rowcount
    if partial and changed != len(rows):
        moved = {task.seq for task in updated}
        rows = [row for row in rows if row["seq"] in moved]
        seqs = [row["seq"] for row in rows]
        if not rows:
            return []
    elif changed != len(rows):
        # The guard caught a row whose status moved since it was read: undo by failing the caller's
        # transaction (every caller runs inside `write`).
        if fence is not None:
            _refuse_stale(conn, fence, target)
        raise InvalidTransition(rows[0]["id"], str(rows[0]["status"]), target.value,
                                "a task changed status while it was being updated")

    return _consequences(conn, rows, seqs, target, now=now, cascade=cascade, updated=updated)


def _update_each(
    conn: sqlite3.Connection, rows: Sequence[Mapping[str, Any]], each: Sequence[Mapping[str, Any]],
    fences: Sequence[AttemptRef] | None, set_sql: str, params: Mapping[str, Any], target: TaskStatus,
) -> None:
    """`_transition`'s UPDATE with fields of each row's own: one statement, run once per row, each
    guarded by the status its row was read in (and its attempt). InvalidTransition, to undo the
    caller's transaction, if any row had moved: the rows one by one then say which, and why."""
    fenced = f" AND {_FENCE}" if fences is not None else ""
    per_row = []
    for n, (row, own) in enumerate(zip(rows, each)):
        one = {**params, **own, "seq": row["seq"], "was": row["status"]}
        if fences is not None:
            one.update(fence_supervisor=fences[n].supervisor or "", fence_attempt=fences[n].attempt)
        per_row.append(one)
    cursor = conn.executemany(f"UPDATE task SET {set_sql} WHERE seq = :seq AND status = :was{fenced}", per_row)
    if cursor.rowcount != len(rows):
        raise InvalidTransition(rows[0]["id"], str(rows[0]["status"]), target.value,
                                "a task changed status or attempt while it was being updated")


def _consequences(
    conn: sqlite3.Connection, rows: Sequence[Mapping[str, Any]], seqs: list[int], target: TaskStatus, *,
    now: float, cascade: bool, updated: list[Task],
) -> list[Task]:
    """What follows a transition of `rows` to `target`: their runs' counters move, dependents are
    unblocked or cancelled, other supervisors are woken. Returns `updated`."""
    runs.shift_counts(
        conn, [(row["workflow_run_id"], TaskStatus(row["status"]), target) for row in rows], now
    )
    if target in (TaskStatus.COMPLETED, TaskStatus.PENDING):
        # Its dependents may be claimable now, or it is itself again: supervisors sharing a
        # PostgreSQL queue are woken at the commit (one wake-up per transaction; none on SQLite).
        wakeups.notify(conn)
    if target is TaskStatus.COMPLETED:
        _unblock_dependents(conn, seqs)
    elif target in (TaskStatus.FAILED, TaskStatus.CANCELLED) and cascade:
        _cascade_cancel(conn, rows, now)
    return updated


def _refuse_stale(conn: sqlite3.Connection, fence: AttemptRef, target: TaskStatus) -> None:
    """StaleAttempt if the task has moved on to another attempt than `fence` names (else the
    caller reports the status that changed)."""
    row = conn.execute("SELECT supervisor, attempt FROM task WHERE id = ?", (fence.task_id,)).fetchone()
    if row is not None and ((row["supervisor"] or "") != (fence.supervisor or "") or row["attempt"] != fence.attempt):
        raise StaleAttempt(
            fence.task_id, None, target.value,
            f"task {fence.task_id}: attempt {fence.attempt} of supervisor {fence.supervisor or '-'} is no longer "
            f"its current one (attempt {row['attempt']} of {row['supervisor'] or '-'}): nothing was written",
        )


def _result_json(result: Any) -> str:
    """A result as stored: JSON for the value. An executor's result given as JSON text (SPEC §8)
    was decoded in its process already: a str here is a JSON string value, stored as one."""
    return json.dumps(result, allow_nan=False)  # NaN is not JSON: refused rather than stored


# On PostgreSQL the dependents are read first (an InitPlan) and then found by primary key, and the
# status test cannot use task_by_status: without statistics (a queue just loaded in bulk, before
# ANALYZE or autovacuum) its planner otherwise hashed every pending task, or and-ed the status
# index's 100,000 entries in, at each completion: 24-46 ms against 0.16 ms, at 100,000 pending.
_UNBLOCK = {
    backend.SQLITE: f"""
        UPDATE task SET unmet_deps = unmet_deps - 1
        WHERE seq IN (SELECT task_seq FROM task_dependency WHERE depends_on_seq = ?) AND status = {statuses.PENDING}
        """,
    backend.POSTGRESQL: f"""
        UPDATE task SET unmet_deps = unmet_deps - 1
        WHERE seq = ANY(ARRAY(SELECT task_seq FROM task_dependency WHERE depends_on_seq = ?))
          AND status || '' = {statuses.PENDING}
        """,
}


def _unblock_dependents(conn: sqlite3.Connection, completed_seqs: Sequence[int]) -> None:
    # Nothing reads what it returns, and what reads the dependents next (the claim) comes after
    # it on the same connection: on PostgreSQL it goes with that statement, not alone.
    db.executemany_later(conn, _UNBLOCK[backend.of(conn)], [(seq,) for seq in completed_seqs])


def _cascade_cancel(conn: sqlite3.Connection, ended: Sequence[Mapping[str, Any]], now: float) -> None:
    """Cancel every pending task downstream of `ended`, transitively (SPEC §5 failure propagation)."""
    for start in range(0, len(ended), 500):
        chunk = ended[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"""
            WITH RECURSIVE downstream(seq) AS (
                SELECT task_seq FROM task_dependency WHERE depends_on_seq IN ({marks})
                UNION
                SELECT d.task_seq FROM task_dependency AS d JOIN downstream ON d.depends_on_seq = downstream.seq
            )
            SELECT t.seq, t.id, t.status, t.workflow_run_id FROM task AS t JOIN downstream USING (seq)
            WHERE t.status = {statuses.PENDING}
            """,
            [row["seq"] for row in chunk],
        ).fetchall()
        if rows:
            first = chunk[0]["id"]
            _transition(
                conn,
                rows,
                TaskStatus.CANCELLED,
                now=now,
                fields={
                    "error": f"an upstream task ({first}) failed or was cancelled",
                    "error_type": models.DEPENDENCY_FAILED,
                },
                # The recursive query already reached every descendant.
                cascade=False,
                snapshots=False,
            )


def _current(conn: sqlite3.Connection, task_id: str) -> sqlite3.Row:
    row = conn.execute(
        "SELECT seq, id, status, workflow_run_id FROM task WHERE id = ?", (task_id,)
    ).fetchone()
    if row is None:
        raise UnknownTask(f"no task has id {task_id}")
    return row


def transition(
    conn: sqlite3.Connection,
    task_id: str,
    target: TaskStatus,
    *,
    now: float,
    expect: Iterable[TaskStatus] | None = None,
    known: Task | None = None,
    **fields: Any,
) -> Task:
    """Move one task to `target` if SPEC §3 allows it from its current status (and it is in `expect`).

    `known` is a snapshot of the task the caller holds (the supervisor, for the tasks it runs): it
    saves reading the row first, and fences the write to the attempt it names (`AttemptRef`). A
    snapshot of another status is harmless, since the UPDATE re-checks the status it names; one of
    another attempt is refused (StaleAttempt). Raises UnknownTask or InvalidTransition and changes
    nothing when refused.
    """
    with write(conn):
        fence = None
        if known is not None and known.id == task_id:
            row: Mapping[str, Any] = {
                "seq": known.seq, "id": known.id, "status": known.status.value,
                "workflow_run_id": known.workflow_run_id,
            }
            fence = AttemptRef.of(known)
        else:
            row = _current(conn, task_id)
        if expect is not None and TaskStatus(row["status"]) not in set(expect):
            raise InvalidTransition(task_id, row["status"], target.value)
        return _transition(conn, [row], target, now=now, fields=fields, fence=fence)[0]


def submit(
    conn: sqlite3.Connection,
    specs: Sequence[TaskSpec],
    *,
    now: float,
    template: str = "adhoc",
    material_id: str | None = None,
    routes: Mapping[str, str] | None = None,
) -> Submission:
    """Store a workflow run with `specs` as its tasks, atomically (SPEC §5, §10). A task whose
    dependency has already failed or been cancelled is stored and cancelled at once
    (`DEPENDENCY_FAILED`), with its dependents in the batch. `routes`: task type → queue, for
    the specs that name none (`submissions.insert_run`)."""
    with write(conn):
        stored = submissions.insert_run(
            conn, specs, now=now, template=template, material_id=material_id, routes=routes
        )
        if stored.submission.startable:  # the other supervisors of a PostgreSQL queue claim it at once
            wakeups.notify(conn)
        for task_id, dead in stored.doomed:
            if _current(conn, task_id)["status"] != TaskStatus.PENDING.value:
                continue  # cancelled already, as a dependent of a doomed task earlier in the batch
            transition(
                conn, task_id, TaskStatus.CANCELLED, now=now, expect=[TaskStatus.PENDING],
                error=f"an upstream task ({dead}) failed or was cancelled", error_type=models.DEPENDENCY_FAILED,
            )
    return stored.submission


# --- the transitions the supervisor makes -------------------------------------------------------


def claim_ready(
    conn: sqlite3.Connection, now: float, limit: int, *, queue: str = "default", promote_delayed: bool = True,
    supervisor: str | None = None,
) -> list[Task]:
    """Claim up to `limit` ready tasks of `queue`, in the order they come (priority, then
    submission order): a lookup in the ready index by queue, whatever other queues hold.

    One read and one guarded UPDATE for all of them: with every slot free at once (a tick that
    saw several attempts end), claiming one by one repeated both, and found out only by an extra
    empty read that nothing else was ready. `promote_delayed=False`: the caller knows no retry
    is waiting out a delay, and the statement that would make it ready is skipped.

    On PostgreSQL, where several supervisors claim at once, the read locks the rows it takes and
    passes over those another claimer holds (`FOR UPDATE SKIP LOCKED`): the guarded UPDATE that
    follows then finds them as read, and no two claimers take one task. Each claimed row names
    `supervisor` and counts one more attempt (the fence of that attempt's writes, `AttemptRef`).
    """
    if limit <= 0:
        return []
    with write(conn):
        if promote_delayed:
            # Retries whose delay has passed join the ready tasks (a cheap range read when none has).
            if backend.of(conn) == backend.POSTGRESQL:
                postgres_claim.promote_delayed(conn, now)
            else:
                conn.execute(
                    # INDEXED BY: left to itself SQLite reads this through task_by_status, i.e.
                    # every pending task, blocked ones included, on every claim.
                    "UPDATE task INDEXED BY task_delayed SET not_before = 0"
                    f" WHERE status = {statuses.PENDING} AND not_before > 0 AND not_before <= ?",
                    (now,),
                )
        rows = conn.execute(
            f"""
            SELECT seq, id, status, workflow_run_id FROM task INDEXED BY task_ready
            WHERE queue = ? AND status = {statuses.PENDING} AND unmet_deps = 0 AND not_before = 0 AND is_held = 0
            ORDER BY priority DESC, seq LIMIT ?{backend.skip_locked(conn)}
            """,
            (queue, limit),
        ).fetchall()
        if not rows:
            return []
        by_id = {task.id: task for task in _transition(conn, rows, TaskStatus.CLAIMED, now=now,
                                                       fields={"supervisor": supervisor})}
    return [by_id[row["id"]] for row in rows]  # RETURNING gives no order: keep the claim's


def next_ready_at(conn: sqlite3.Connection) -> float | None:
    """The earliest time a task waiting out its retry delay becomes claimable, if any."""
    row = conn.execute(
        f"SELECT min(not_before) FROM task INDEXED BY task_delayed WHERE status = {statuses.PENDING} AND not_before > 0"
    ).fetchone()
    return row[0]


def start(
    conn: sqlite3.Connection,
    task_id: str,
    *,
    now: float,
    executor_pid: int | None = None,
    executor_started_at: float | None = None,
    is_pausable: bool = False,
    known: Task | None = None,
) -> Task:
    """claimed → running, recording the executor process that runs it."""
    return transition(
        conn,
        task_id,
        TaskStatus.RUNNING,
        now=now,
        expect=[TaskStatus.CLAIMED],
        known=known,
        executor_pid=executor_pid,
        executor_started_at=executor_started_at,
        is_pausable=int(is_pausable),
    )


class Start(NamedTuple):
    """A claimed task to start (`start_many`): the claim's snapshot, and the process given it."""

    task: Task
    executor_pid: int | None
    executor_started_at: float | None
    is_pausable: bool


def start_many(conn: sqlite3.Connection, starts: Sequence[Start], *, now: float) -> dict[str, Task]:
    """claimed → running for many claimed tasks, each fenced to the attempt its snapshot names:
    the started tasks by id. One guarded UPDATE for the tasks given one process (an event-loop
    process takes hundreds in a tick), where `start` costs one each. A task whose row moved on
    since its snapshot (no longer claimed, or at another attempt) is left out, unchanged: `start`
    of it alone says why."""
    groups: dict[tuple[int | None, float | None, bool, str | None, int], list[Task]] = {}
    for entry in starts:
        task = entry.task
        key = (entry.executor_pid, entry.executor_started_at, bool(entry.is_pausable), task.supervisor, task.attempt)
        groups.setdefault(key, []).append(task)
    started: dict[str, Task] = {}
    with write(conn):
        for (pid, pid_started, pausable, supervisor, attempt), group in groups.items():
            rows = [{"seq": task.seq, "id": task.id, "status": task.status.value,
                     "workflow_run_id": task.workflow_run_id} for task in group]
            moved = _transition(
                conn, rows, TaskStatus.RUNNING, now=now, partial=True,
                fence=AttemptRef(group[0].id, supervisor, attempt),
                fields={"executor_pid": pid, "executor_started_at": pid_started, "is_pausable": int(pausable)},
            )
            started.update((task.id, task) for task in moved)
    return started


def complete_many(
    conn: sqlite3.Connection, completions: Sequence[tuple[Task, Any]], *, now: float
) -> None:
    """running → completed for many attempts that ended at `now`, each with its result, each
    fenced to the attempt its snapshot names: one statement run once per row, where `complete`
    costs a transition each. InvalidTransition, with nothing changed, if any row moved on
    (`complete` of each alone then says which)."""
    if not completions:
        return
    rows = [{"seq": task.seq, "id": task.id, "status": task.status.value, "workflow_run_id": task.workflow_run_id}
            for task, _ in completions]
    with write(conn):
        _transition(
            conn, rows, TaskStatus.COMPLETED, now=now, snapshots=False, fields={"error": None, "error_type": None},
            each=[{"result": result} for _, result in completions],
            fences=[AttemptRef.of(task) for task, _ in completions],
        )


def record_sent_ahead(
    conn: sqlite3.Connection, task: Task, *, executor_pid: int, executor_started_at: float | None
) -> Task:
    """Record the process a `claimed` task is sent ahead to (a queue's prefetch, SPEC §15), before
    it is sent: not a status change (it stays `claimed` until that process starts it), but from
    here on recovery must count it as one that may have run. InvalidTransition if not `claimed`."""
    with write(conn):
        changed = conn.execute(
            f"UPDATE task SET executor_pid = ?, executor_started_at = ? WHERE seq = ? AND status = {statuses.CLAIMED}",
            (executor_pid, executor_started_at, task.seq),
        ).rowcount
    if changed != 1:
        raise InvalidTransition(task.id, task.status.value, TaskStatus.CLAIMED.value,
                                f"task {task.id} is no longer claimed: it cannot be sent ahead")
    return task.but(executor_pid=executor_pid, executor_started_at=executor_started_at)


def complete(conn: sqlite3.Connection, task_id: str, result: Any, *, now: float, known: Task | None = None) -> Task:
    """running (or claimed, when skipped) → completed with `result`."""
    return transition(
        conn, task_id, TaskStatus.COMPLETED, now=now, known=known, result=result, error=None, error_type=None
    )


def fail(
    conn: sqlite3.Connection, task_id: str, *, error: str, error_type: str, now: float, known: Task | None = None
) -> Task:
    """→ failed for good; pending dependents are cancelled in the same transaction."""
    return transition(conn, task_id, TaskStatus.FAILED, now=now, known=known, error=error, error_type=error_type)


def retry(
    conn: sqlite3.Connection,
    task_id: str,
    *,
    error: str,
    error_type: str,
    not_before: float,
    now: float,
    known: Task | None = None,
) -> Task:
    """running → pending for another attempt: `retry_count + 1`, not before `not_before`.

    With `known` (the caller's snapshot) the row is not read first; the guarded UPDATE still
    refuses it if the task's status has moved since."""
    with write(conn):
        task = known if known is not None and known.id == task_id else get(conn, task_id)
        return transition(
            conn,
            task_id,
            TaskStatus.PENDING,
            now=now,
            known=task,
            expect=[TaskStatus.RUNNING, TaskStatus.CLAIMED],
            error=error,
            error_type=error_type,
            retry_count=task.retry_count + 1,
            not_before=not_before,
        )


def requeue(
    conn: sqlite3.Connection, task_id: str, *, now: float, known: Task | None = None, hold: bool = False
) -> Task:
    """claimed or running → pending without counting a retry (recovery, graceful shutdown);
    `hold`: and held, for a user to release (a task the user had paused, SPEC §14)."""
    return transition(
        conn, task_id, TaskStatus.PENDING, now=now, known=known, progress=0, status_text=None, is_held=int(hold)
    )
