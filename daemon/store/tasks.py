"""Task repository: reads, claiming, and the one guarded transition (submission: `submissions`).

Every status change of a task goes through `_transition`, which runs
`UPDATE task ... WHERE seq IN (...) AND status IN (<allowed sources>)`, moves the run counters and
applies the consequences (dependents unblocked or cancelled) in the caller's transaction.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from daemon import models
from daemon.errors import InvalidTransition, StaleAttempt, UnknownRun, UnknownTask
from daemon.models import Task, TaskStatus
from daemon.store import backend, runs, statuses, submissions
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
_FENCE_QMARK = "COALESCE(supervisor, '') = ? AND attempt = ?"


# --- reads -------------------------------------------------------------------------------------


def find(conn: sqlite3.Connection, task_id: str) -> Task | None:
    row = conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else Task.from_row(row)


def get(conn: sqlite3.Connection, task_id: str) -> Task:
    task = find(conn, task_id)
    if task is None:
        raise UnknownTask(f"no task has id {task_id}")
    return task


def list_tasks(
    conn: sqlite3.Connection,
    *,
    status: str | Iterable[str] | None = None,
    run_id: str | None = None,
    task_type: str | None = None,
    limit: int | None = None,
) -> list[Task]:
    """Tasks in submission order, filtered by status(es), run and type (any case).

    A status is a stored one or a word people see (`waiting`, `held`, `paused`: `status_clause`)."""
    clauses, params = filters(status=status, run_id=run_id, task_type=task_type)
    sql = "SELECT * FROM task"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [Task.from_row(row) for row in conn.execute(sql, params)]


def filters(
    *, status: str | Iterable[str] | None = None, run_id: str | None = None, task_type: str | None = None
) -> tuple[list[str], list[Any]]:
    """The WHERE clauses (to join with AND) and their parameters for a task filter: status
    words (`status_clause`), a run's full id, a type in any case."""
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clause, values = status_clause([status] if isinstance(status, str) else list(status))
        clauses.append(clause)
        params.extend(values)
    if run_id is not None:
        clauses.append("workflow_run_id = ?")
        params.append(run_id)
    if task_type is not None:
        clauses.append("type = ? COLLATE NOCASE")
        params.append(task_type)
    return clauses, params


def status_where(words: Sequence[str]) -> tuple[str, list[str]]:
    """The SQL condition, and its parameters, that keeps the tasks in any of the status `words`
    as `list_tasks` filters them: for the readers of the task table outside this module (`export`)."""
    return status_clause(words)


def status_clause(words: Sequence[str]) -> tuple[str, list[str]]:
    """The WHERE clause for status words, as people see them (SPEC §14): `waiting` is a claimed
    task or a pending one not held, `held` a pending task that is held, `paused` a running task
    that is paused. The stored statuses take all theirs: `running` takes paused tasks in, and
    `pending` held ones."""
    stored = {str(word) for word in words if word in set(TaskStatus)}
    waiting, held = models.DisplayStatus.WAITING in words, models.DisplayStatus.HELD in words
    if waiting:
        stored.add(TaskStatus.CLAIMED.value)
    if waiting and held:
        stored.add(TaskStatus.PENDING.value)  # both halves of pending: the plain stored status
    parts = [f"status IN ({', '.join('?' * len(stored))})"] if stored else []
    if TaskStatus.PENDING not in stored and (waiting or held):
        parts.append(f"(status = {statuses.PENDING} AND is_held = {int(held)})")
    if models.DisplayStatus.PAUSED in words and TaskStatus.RUNNING not in stored:
        parts.append(f"(status = {statuses.RUNNING} AND is_paused = 1)")
    if not parts:
        return "1 = 0", []  # no word that names a state: nothing matches (PostgreSQL wants a boolean)
    return "(" + " OR ".join(parts) + ")", sorted(stored)


def results_of(conn: sqlite3.Connection, task_ids: Sequence[str]) -> dict[str, Any]:
    """Parsed `result` of each given task (dependency id → result), for `ctx.upstream`."""
    if not task_ids:
        return {}
    rows = conn.execute(
        f"SELECT id, result FROM task WHERE id IN ({', '.join('?' * len(task_ids))})", list(task_ids)
    )
    return {row["id"]: (None if row["result"] is None else json.loads(row["result"])) for row in rows}


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
) -> list[Task]:
    """Move the given task rows (seq, id, status, workflow_run_id) to `target`; all or nothing.

    Each row's status must be an allowed source of `target` (SPEC §3), and the UPDATE re-checks it,
    so a row that changed under us makes the whole call fail rather than half-apply. Returns the
    updated tasks, or nothing with `snapshots=False` (a cascade over 100,000 tasks would otherwise
    read back and parse every row it just wrote). `fence` (one row): the UPDATE also re-checks
    that the row is at that attempt, else StaleAttempt. A claim names its supervisor in
    `fields` and counts one more attempt.
    """
    fields = dict(fields or {})
    unexpected = set(fields) - TRANSITION_FIELDS
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
        # A new attempt starts unpaused, with nothing asked of it by another supervisor yet (an
        # earlier attempt's unanswered request is not this one's).
        assignments.update(is_paused=0, pause_wanted=None)
    elif target is TaskStatus.PENDING:
        assignments.update(is_paused=0, executor_pid=None, executor_started_at=None)
    else:  # terminal
        assignments.update(completed_at=now, is_paused=0)
    if target is not TaskStatus.PENDING:
        assignments["is_held"] = 0  # only a pending task is held
        if target is TaskStatus.COMPLETED:
            assignments["progress"] = 100
    if "result" in assignments and assignments["result"] is not None:
        assignments["result"] = _result_json(assignments["result"])

    set_sql = ", ".join([f"{col} = :{col}" for col in assignments] + [f"{c} = {e}" for c, e in raw.items()])
    seqs = [row["seq"] for row in rows]
    # Each row must still be in the status it was read in, which the run counters move by: a
    # caller's snapshot may be stale, and on PostgreSQL another connection may have moved it since
    # (SQLite's writers cannot interleave). So one guarded UPDATE per status read (and per 500).
    read_in: dict[str, list[int]] = {}
    for row in rows:
        read_in.setdefault(row["status"], []).append(row["seq"])
    chunks = [(status, group[i : i + 500]) for status, group in read_in.items() for i in range(0, len(group), 500)]
    params = {**assignments, "now": now}
    fenced = ""
    if fence is not None:
        assert len(rows) == 1, "an attempt's fence names one task"
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
    if changed != len(rows):
        # The guard caught a row whose status moved since it was read: undo by failing the caller's
        # transaction (every caller runs inside `write`).
        if fence is not None:
            _refuse_stale(conn, fence, target)
        raise InvalidTransition(rows[0]["id"], str(rows[0]["status"]), target.value,
                                "a task changed status while it was being updated")

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


def _unblock_dependents(conn: sqlite3.Connection, completed_seqs: Sequence[int]) -> None:
    conn.executemany(
        f"""
        UPDATE task SET unmet_deps = unmet_deps - 1
        WHERE seq IN (SELECT task_seq FROM task_dependency WHERE depends_on_seq = ?) AND status = {statuses.PENDING}
        """,
        [(seq,) for seq in completed_seqs],
    )


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
        wakeups.notify(conn)  # the other supervisors of a PostgreSQL queue claim it at once
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
    return dataclasses.replace(task, executor_pid=executor_pid, executor_started_at=executor_started_at)


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


def cancel(
    conn: sqlite3.Connection, task_id: str, *, now: float, reason: str = "cancelled by user", known: Task | None = None
) -> Task:
    """Any active status → cancelled; pending dependents are cancelled too. On a PostgreSQL queue
    the supervisors are woken at the commit: one that runs the task stops its attempt then."""
    cancelled = transition(
        conn, task_id, TaskStatus.CANCELLED, now=now, known=known, error=reason, error_type=models.CANCELLED
    )
    wakeups.notify(conn)
    return cancelled


@dataclasses.dataclass(frozen=True)
class RunCancellation:
    """What cancelling a run did: tasks cancelled outright, and running ones left to stop."""

    cancelled: tuple[str, ...]
    running: tuple[str, ...]


def cancel_waiting_in_run(
    conn: sqlite3.Connection, run_id: str, *, now: float, reason: str = "run cancelled by user"
) -> RunCancellation:
    """Cancel every pending and claimed task of a run; report the running ones (the supervisor
    stops those through their executors)."""
    with write(conn):
        if runs.find(conn, run_id) is None:
            raise UnknownRun(f"no workflow run has id {run_id}")
        rows = conn.execute(
            f"""SELECT seq, id, status, workflow_run_id FROM task
                WHERE workflow_run_id = ? AND status IN ({statuses.ACTIVE}) ORDER BY seq""",
            (run_id,),
        ).fetchall()
        waiting = [r for r in rows if r["status"] != TaskStatus.RUNNING.value]
        running = tuple(r["id"] for r in rows if r["status"] == TaskStatus.RUNNING.value)
        _transition(
            conn,
            waiting,
            TaskStatus.CANCELLED,
            now=now,
            fields={"error": reason, "error_type": models.CANCELLED},
        )
    return RunCancellation(tuple(r["id"] for r in waiting), running)


def cancel_waiting(
    conn: sqlite3.Connection, task_ids: Sequence[str], *, now: float, reason: str = "cancelled by user"
) -> dict[str, int]:
    """Cancel those of `task_ids` that are pending or claimed, in one guarded transition (a bulk
    cancel: SPEC §14), their pending dependents with them. For each one cancelled, how many tasks
    not yet ended depended on it, counted before; the others (running, finished, unknown) are
    left alone for the caller."""
    found: list[sqlite3.Row] = []
    for start in range(0, len(task_ids), 500):
        part = list(task_ids[start : start + 500])
        found += conn.execute(
            # `+status`: by the ids' index, not every waiting task's entry in the status index.
            f"SELECT seq, id, status, workflow_run_id FROM task WHERE id IN ({', '.join('?' * len(part))})"
            f" AND +status IN ({statuses.WAITING})", part,
        ).fetchall()
    if not found:
        return {}
    with write(conn):
        seqs = [row["seq"] for row in found]
        with_dependents: set[int] = set()
        for start in range(0, len(seqs), 500):
            part = seqs[start : start + 500]
            with_dependents.update(row[0] for row in conn.execute(
                f"SELECT DISTINCT depends_on_seq FROM task_dependency WHERE depends_on_seq IN ({', '.join('?' * len(part))})",
                part))
        # Only a task that has dependents needs its own count (a recursive query each).
        dependents = {row["id"]: active_downstream(conn, row["id"]) if row["seq"] in with_dependents else 0
                      for row in found}
        _transition(conn, found, TaskStatus.CANCELLED, now=now, snapshots=False,
                    fields={"error": reason, "error_type": models.CANCELLED})
    return dependents


# --- updates of a running task that do not change its status ------------------------------------
# Each names the task by id (whichever attempt runs it: a user's request, the store's tests) or by
# `AttemptRef` (only that attempt: the supervisor's writes about the attempts it runs). A write
# that matches no row changes nothing; each returns how many it wrote, for its caller to log the
# rest.


def _by_attempt(items: Sequence[tuple[Any, ...]], sql: str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The statements (`sql` with its WHERE completed) and their parameter rows for `items`, each
    (task id or AttemptRef, *values): an AttemptRef's row is fenced to its attempt."""
    plain, fenced = [], []
    for target, *values in items:
        if isinstance(target, AttemptRef):
            fenced.append((*values, target.task_id, target.supervisor or "", target.attempt))
        else:
            plain.append((*values, target))
    where = f" WHERE id = ? AND status = {statuses.RUNNING}"
    return [(statement, batch) for statement, batch in (
        (sql + where, plain), (sql + where + f" AND {_FENCE_QMARK}", fenced)) if batch]


def _update_running(conn: sqlite3.Connection, items: Sequence[tuple[Any, ...]], sql: str) -> int:
    with write(conn):
        return sum(conn.executemany(statement, batch).rowcount for statement, batch in _by_attempt(items, sql))


def set_paused(conn: sqlite3.Connection, task: str | AttemptRef, paused: bool) -> bool:
    """Record that a running task is paused or not; False if it is not running (at that attempt)."""
    return _update_running(conn, [(task, int(paused))], "UPDATE task SET is_paused = ?") == 1


def ask_pause(conn: sqlite3.Connection, ref: AttemptRef, paused: bool) -> bool:
    """Ask the supervisor that runs a task (at that attempt) to pause or resume it: the request of
    a user on another host of a shared queue (SPEC §16), which wakes the supervisors at the
    commit. False if the task is not running at that attempt any more."""
    asked = _update_running(conn, [(ref, int(paused))], "UPDATE task SET pause_wanted = ?") == 1
    if asked:
        wakeups.notify(conn)
    return asked


def answer_pause(conn: sqlite3.Connection, ref: AttemptRef) -> None:
    """Clear what another supervisor asked of this attempt: acted on, or refused."""
    _update_running(conn, [(ref, None)], "UPDATE task SET pause_wanted = ?")


def set_pausable(conn: sqlite3.Connection, task: str | AttemptRef, pausable: bool) -> bool:
    """Record whether a running task can be paused; False if it is not running (at that attempt)."""
    return _update_running(conn, [(task, int(pausable))], "UPDATE task SET is_pausable = ?") == 1


def record_pause_states(
    conn: sqlite3.Connection, states: Sequence[tuple[str | AttemptRef, bool, bool, str | None]]
) -> int:
    """Record (task, is_paused, is_pausable, status text) of running tasks as the supervisor
    knows them (the text: why it is paused, or its executor's own); tasks no longer running (at
    that attempt) are left alone. How many were written."""
    return _update_running(
        conn, [(task, int(paused), int(pausable), text) for task, paused, pausable, text in states],
        "UPDATE task SET is_paused = ?, is_pausable = ?, status_text = ?",
    )


def heartbeat(conn: sqlite3.Connection, running: Sequence[str | AttemptRef], now: float) -> int:
    """Stamp `heartbeat_at` of running tasks whose executors are alive; how many were stamped."""
    return _update_running(conn, [(task, now) for task in running], "UPDATE task SET heartbeat_at = ?")


def record_progress(conn: sqlite3.Connection, updates: Sequence[tuple[str | AttemptRef, int, str | None]]) -> int:
    """Record progress (clamped to 0-100) of several running tasks in one transaction; returns
    how many were running (others are left alone)."""
    return _update_running(
        conn, [(task, max(0, min(100, int(p))), text) for task, p, text in updates],
        "UPDATE task SET progress = ?, status_text = COALESCE(?, status_text)",
    )


IN_FLIGHT_VALUES = (TaskStatus.CLAIMED.value, TaskStatus.RUNNING.value)


@dataclasses.dataclass(frozen=True)
class AttemptRows:
    """What the rows of a supervisor's running attempts say that others changed (SPEC §16)."""

    replaced: list[str]  # no longer in flight at that attempt: cancelled elsewhere, or rescued
    pause_wanted: dict[str, bool]  # asked by another supervisor: pause (True) or resume (False)


def look_at_attempts(conn: sqlite3.Connection, refs: Sequence[AttemptRef]) -> AttemptRows:
    """Read the rows of `refs` (one SELECT) for what another supervisor did to them. An attempt
    sent ahead (SPEC §15) is still `claimed`, at the attempt its claim counted: in flight too."""
    replaced: list[str] = []
    wanted: dict[str, bool] = {}
    if not refs:
        return AttemptRows(replaced, wanted)
    found = {row["id"]: row for row in conn.execute(
        f"SELECT id, status, supervisor, attempt, pause_wanted FROM task WHERE id IN ({', '.join('?' * len(refs))})",
        [ref.task_id for ref in refs])}
    for ref in refs:
        row = found.get(ref.task_id)
        if row is None or row["status"] not in IN_FLIGHT_VALUES \
                or (row["supervisor"] or "") != (ref.supervisor or "") or row["attempt"] != ref.attempt:
            replaced.append(ref.task_id)
        elif row["pause_wanted"] is not None:
            wanted[ref.task_id] = bool(row["pause_wanted"])
    return AttemptRows(replaced, wanted)


# --- startup recovery (SPEC §9) -----------------------------------------------------------------


def _rows(conn: sqlite3.Connection, where: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
    return conn.execute(
        f"SELECT seq, id, status, workflow_run_id FROM task WHERE {where} ORDER BY seq{backend.for_update(conn)}", params
    ).fetchall()


def owned_by(supervisor: str | None, *, unnamed: bool = False) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) that keeps the tasks claimed by `supervisor` (None:
    by anyone, the one daemon of a SQLite file); `unnamed`: and those that name no supervisor,
    claimed before supervisors were named (schema 10): a start's recovery takes them."""
    if supervisor is None:
        return "1 = 1", []
    if unnamed:
        return "(supervisor = ? OR supervisor IS NULL)", [supervisor]
    return "supervisor = ?", [supervisor]


def in_flight(
    conn: sqlite3.Connection, *, supervisor: str | None = None, unnamed: bool = False, lock: bool = False
) -> list[Task]:
    """The `running` and `claimed` tasks of `supervisor` (`owned_by`), in submission order: what
    a start's recovery, or a rescue, finds left in flight. `lock`: their rows locked until the
    transaction ends, on PostgreSQL (a rescue's, which moves them next)."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    locked = backend.for_update(conn) if lock else ""
    return [Task.from_row(row) for row in conn.execute(
        f"SELECT * FROM task WHERE status IN ({statuses.IN_FLIGHT}) AND {where} ORDER BY seq{locked}", params)]


def fail_interrupted(
    conn: sqlite3.Connection, *, now: float, supervisor: str | None = None, unnamed: bool = False
) -> list[Task]:
    """Every `running` task (of `supervisor`: `owned_by`) → failed (INTERRUPTED): its outcome is
    unknown after a crash. So is that of a `claimed` task with a recorded executor process: it was
    sent ahead (prefetch, SPEC §15) to a process that may have started it."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    with write(conn):
        failed = _transition(
            conn,
            _rows(conn, f"status = {statuses.RUNNING} AND {where}", params),
            TaskStatus.FAILED,
            now=now,
            fields={"error": "interrupted: the supervisor stopped while the task ran", "error_type": models.INTERRUPTED},
        )
        return failed + _transition(
            conn,
            _rows(conn, f"status = {statuses.CLAIMED} AND executor_pid IS NOT NULL AND {where}", params),
            TaskStatus.FAILED,
            now=now,
            fields={"error": "interrupted: the supervisor stopped while the task was sent ahead to its executor "
                             "process, which may have started it", "error_type": models.INTERRUPTED},
        )


def requeue_claimed(
    conn: sqlite3.Connection, *, now: float, supervisor: str | None = None, unnamed: bool = False
) -> list[Task]:
    """Every `claimed` task (of `supervisor`: `owned_by`) → pending: it never started, so it can
    safely run again."""
    where, params = owned_by(supervisor, unnamed=unnamed)
    with write(conn):
        return _transition(conn, _rows(conn, f"status = {statuses.CLAIMED} AND {where}", params), TaskStatus.PENDING,
                           now=now)


def fail_orphans(conn: sqlite3.Connection, *, now: float) -> list[Task]:
    """Every active task whose workflow run does not exist → failed (ORPHANED)."""
    with write(conn):
        rows = _rows(
            conn,
            f"status IN ({statuses.ACTIVE}) AND NOT EXISTS (SELECT 1 FROM workflow_run WHERE workflow_run.id = task.workflow_run_id)",
        )
        return _transition(
            conn,
            rows,
            TaskStatus.FAILED,
            now=now,
            fields={"error": "its workflow run does not exist", "error_type": models.ORPHANED},
        )


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


def count_by_status(conn: sqlite3.Connection) -> dict[str, int]:
    """How many tasks are in each status (every status present, zero included), and how many
    of the pending ones are `held` (SPEC §14: they show as held)."""
    counts = {status.value: 0 for status in TaskStatus}
    for status, count in conn.execute("SELECT status, count(*) FROM task GROUP BY status"):
        counts[status] = count
    counts[models.DisplayStatus.HELD.value] = conn.execute(
        f"SELECT count(*) FROM task WHERE status = {statuses.PENDING} AND is_held = 1"
    ).fetchone()[0]
    return counts
