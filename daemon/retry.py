"""`fredica retry` and `restarts recreate`: each id checked on its own, the accepted ones copied
together (`store.reruns`), and one result line per id (SPEC §14).

Both run on the supervisor's loop thread, in one transaction: an id that is refused changes
nothing, and the others are done all the same. `retry_tasks` takes full task ids (the bulk
selectors resolve theirs in one place); `retry_given` resolves what a user typed first.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Callable, Collection, Mapping, Sequence, cast

import structlog

from daemon import protocol
from daemon.errors import FredicaError
from daemon.models import Task, TaskStatus
from daemon.store import restarts, reruns, tasks
from daemon.store import ids as id_store
from daemon.store.db import write
from daemon.store.submissions import SubmittedTask

log = structlog.get_logger("fredica.retry")
SHORT = 8  # characters of an id in a result line: a prefix every command takes
RETRIABLE = (TaskStatus.FAILED, TaskStatus.CANCELLED)


@dataclasses.dataclass(frozen=True)
class Result:
    """One id's line: `id` the full id (or the text given, when it names nothing), `ok`, the message,
    and for a copy what it made: `new_id`, `run_id`, `copies` (the new ids of the cascaded tasks)."""

    id: str
    ok: bool
    message: str
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> protocol.Result:
        """The result as the reply carries it (`protocol.ResultsReply`)."""
        return cast(protocol.Result, {"id": self.id, "ok": self.ok, "message": self.message, **self.extra})


def short(full_id: str | None) -> str:
    """An id as a result line shows it."""
    return "-" if full_id is None else full_id[:SHORT]


def retry_given(
    conn: sqlite3.Connection, given: Sequence[str], *, now: float, routes: Mapping[str, str] | None = None,
    queue_names: Collection[str] = ("default",),
) -> list[Result]:
    """`retry_tasks` for ids or prefixes as typed; one that names no task (or several) is refused."""
    resolved: list[str | Result] = []
    for text in given:
        try:
            resolved.append(id_store.task_id(conn, text))
        except FredicaError as exc:
            resolved.append(Result(text, False, exc.message))
    done = retry_tasks(conn, [r for r in resolved if isinstance(r, str)], now=now, routes=routes,
                       queue_names=queue_names)
    by_id = {result.id: result for result in done}
    return [r if isinstance(r, Result) else by_id[r] for r in resolved]


def retry_tasks(
    conn: sqlite3.Connection, task_ids: Sequence[str], *, now: float, routes: Mapping[str, str] | None = None,
    queue_names: Collection[str] = ("default",),
) -> list[Result]:
    """Run each failed or cancelled task (by full id) again as a new task, with the tasks its
    failure cancelled, one new run per original run; a result per id, in order (repeats too)."""
    with write(conn):
        refused: dict[str, Result] = {}
        roots: dict[str, Task] = {}
        for task_id in dict.fromkeys(task_ids):
            task = tasks.find(conn, task_id)
            if task is None:
                refused[task_id] = Result(task_id, False, f"no task has id {task_id}")
            elif task.status not in RETRIABLE:
                refused[task_id] = Result(
                    task_id, False, f"task {short(task_id)} is {task.display_status}: only a failed or cancelled"
                    " task can be retried")
            else:
                roots[task_id] = task
        done = _copy(conn, roots, "retried", short, now, routes, queue_names)
    results = {**refused, **done}
    return [results[task_id] for task_id in task_ids]


def recreate_entries(
    conn: sqlite3.Connection, entry_ids: Sequence[str], *, now: float, routes: Mapping[str, str] | None = None,
    queue_names: Collection[str] = ("default",),
) -> list[Result]:
    """Run the tasks of restart-log entries again (SPEC §9, §14): entries from one original run make
    one new run, their dependencies kept. Each entry then says `recreated`, with that run."""
    with write(conn):
        refused: dict[str, Result] = {}
        roots: dict[str, Task] = {}
        entry_of: dict[str, str] = {}  # task id → the entry id given for it
        for given in dict.fromkeys(entry_ids):
            try:
                task = _entry_task(conn, given)
            except FredicaError as exc:
                refused[given] = Result(given, False, exc.message)
                continue
            roots[task.id] = task
            entry_of[task.id] = given
        done = _copy(conn, roots, "recreated", lambda task_id: f"entry {entry_of[task_id]} (task {short(task_id)})",
                     now, routes, queue_names)
    results = {**refused, **{entry_of[task_id]: dataclasses.replace(r, id=entry_of[task_id],
                                                                    extra={**r.extra, "task_id": task_id})
                             for task_id, r in done.items()}}
    return [results[given] for given in entry_ids]


def _entry_task(conn: sqlite3.Connection, given: str) -> Task:
    """The task of the entry awaiting review that `given` names; refused for any other entry."""
    try:
        entry = restarts.get(conn, int(given))
    except ValueError:
        raise FredicaError(f"restart-log entry ids are numbers, not {given!r}") from None
    if entry.disposition != restarts.PENDING_REVIEW:
        raise FredicaError(f"restart-log entry {given} is already {entry.disposition}")
    task = tasks.find(conn, entry.task_id)
    if task is None:
        raise FredicaError(f"restart-log entry {given}: its task {short(entry.task_id)} no longer exists")
    if not task.status.is_terminal:
        raise FredicaError(f"task {short(task.id)} is {task.display_status} again and will run: nothing to recreate")
    return task


def _copy(
    conn: sqlite3.Connection, roots: Mapping[str, Task], verb: str, named: Callable[[str], str], now: float,
    routes: Mapping[str, str] | None, queue_names: Collection[str],
) -> dict[str, Result]:
    """Copy `roots` (`store.reruns.rerun`) and say, for each, what became of it (`named(task id)`
    names it in its line); the restart-log entries of every task copied become `recreated`."""
    if not roots:
        return {}
    rerun = reruns.rerun(conn, list(roots.values()), now=now, routes=routes, queue_names=queue_names)
    restarts.mark_recreated(conn, rerun.runs, now=now)
    results: dict[str, Result] = {}
    for task_id in roots:
        if task_id in rerun.blocked:
            upstream, status = rerun.blocked[task_id]
            if status == reruns.GONE:
                why = f"it depends on task {short(upstream)}, which no longer exists"
            else:
                why = (f"task {short(upstream)} upstream of it is {status}; retry {short(upstream)},"
                       " which brings it along")
            results[task_id] = Result(task_id, False, f"task {short(task_id)} cannot run again: {why}")
            continue
        copy, run_id = rerun.copies[task_id], rerun.runs[task_id]
        cascade = [rerun.copies[original].id for original in rerun.cascaded.get(task_id, ())]
        extra = {"new_id": copy.id, "created": copy.created, "run_id": run_id, "copies": cascade}
        results[task_id] = Result(task_id, True, _done_line(verb, named(task_id), copy, roots[task_id], cascade,
                                                             run_id), extra)
        # As a cancel logs its own: inside the transaction, which a fault could still roll back.
        log.info("task_rerun", task_id=task_id, how=verb, new_id=copy.id, created=copy.created, run_id=run_id,
                 cascaded=len(cascade))
    return results


def _done_line(
    verb: str, name: str, copy: SubmittedTask, original: Task, cascade: Sequence[str], run_id: str | None
) -> str:
    """What was done for one id: the copy, the cascaded copies that came along, the new run."""
    if not copy.created:
        return (f"{verb} {name}: task {short(copy.id)}, already active with idempotency key"
                f" {original.idempotency_key!r}, runs instead (not copied)")
    count = len(cascade)
    tail = f", with {count} task{'s' * (count != 1)} its failure cancelled" if count else ""
    return f"{verb} {name} as {short(copy.id)}{tail} (run {short(run_id)})"
