"""Held tasks, priority changes and bulk selection in the store (SPEC §14): a held task is never
claimed, shows as held, keeps its run unfinished; its dependents wait; selectors read ids a chunk
at a time, only of the tasks an operation can act on."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from daemon import models
from daemon.models import TaskStatus as S
from daemon.store import cancels, runs, selection, task_reads, tasks, waiting
from daemon.store.selection import Scope
from daemon.submission import parse_spec
from tests import store_steps
from tests.conformance import conn, sqlite_only  # noqa: F401 (every test on every backend)

T0 = 7_000.0


def submit(conn: sqlite3.Connection, *lines: dict[str, Any]) -> list[str]:
    return [t.id for t in tasks.submit(conn, [parse_spec(line) for line in lines], now=T0).tasks]


def claim_all(conn: sqlite3.Connection) -> list[str]:
    claimed = []
    while (task := store_steps.claim_next(conn, T0)) is not None:
        claimed.append(task.id)
    return claimed


def test_a_held_task_is_never_claimed_and_is_claimable_once_released(conn: sqlite3.Connection) -> None:
    held, free = submit(conn, {"type": "A", "hold": True, "priority": 9}, {"type": "B"})
    assert tasks.get(conn, held).is_held and tasks.get(conn, held).display_status == "held"
    assert claim_all(conn) == [free]
    assert waiting.release(conn, [held]) == {held: None}
    assert claim_all(conn) == [held]
    assert not tasks.get(conn, held).is_held


@sqlite_only  # its query plan
def test_the_claim_stays_a_lookup_in_the_ready_index_with_held_tasks(conn: sqlite3.Connection) -> None:
    submit(conn, *({"type": "A", "hold": True, "priority": 5} for _ in range(50)), {"type": "B"})
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    claimed = store_steps.claim_next(conn, T0)
    conn.set_trace_callback(None)
    assert claimed is not None and claimed.type == "B"
    select = next(sql for sql in traced if sql.lstrip().startswith("SELECT"))
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + select))  # traced as bound
    assert "SEARCH task USING INDEX task_ready (queue=?)" in plan, plan
    # The held ones are not in the index at all: a claim never walks past them.
    in_ready = conn.execute("SELECT count(*) FROM task INDEXED BY task_ready WHERE status = 'pending'"
                            " AND unmet_deps = 0 AND not_before = 0 AND is_held = 0").fetchone()[0]
    assert in_ready == 0


def test_hold_release_and_their_refusals(conn: sqlite3.Connection) -> None:
    pending, running, done, claimed = submit(conn, {"type": "A"}, {"type": "A"}, {"type": "A"}, {"type": "A"})
    for task_id in (running, done, claimed):
        tasks.transition(conn, task_id, S.CLAIMED, now=T0)
    tasks.start(conn, running, now=T0)
    tasks.start(conn, done, now=T0)
    tasks.complete(conn, done, {}, now=T0)
    missing = "0000dead-0000-4000-8000-000000000000"
    outcome = waiting.hold(conn, [pending, running, done, claimed, missing])
    assert outcome[pending] is None
    assert outcome[running] == f"task {running} is running: only a waiting task can be held"
    assert outcome[done] == f"task {done} is completed: only a waiting task can be held"
    assert outcome[claimed] == f"task {claimed} is waiting (it is starting): only a waiting task can be held"
    assert outcome[missing] == f"no task has id {missing}"
    assert waiting.hold(conn, [pending]) == {pending: f"task {pending} is already held"}
    assert [t.is_held for t in (tasks.get(conn, i) for i in (running, done, claimed))] == [False] * 3
    assert waiting.release(conn, [pending]) == {pending: None}
    assert waiting.release(conn, [pending]) == {pending: f"task {pending} is not held"}
    assert waiting.release(conn, [running])[running] == f"task {running} is running: only a waiting task can be released"


def test_a_run_whose_task_is_held_is_not_finished_and_its_dependents_wait(conn: sqlite3.Connection) -> None:
    first, held, after = submit(conn, {"type": "A", "key": "a"}, {"type": "B", "key": "b", "hold": True},
                                {"type": "C", "depends_on": ["b"]})
    run_id = tasks.get(conn, first).workflow_run_id
    assert claim_all(conn) == [first]
    tasks.start(conn, first, now=T0)
    tasks.complete(conn, first, {}, now=T0)
    assert claim_all(conn) == []  # `held` is held, and `after` waits for it
    run = runs.get(conn, run_id)
    assert run.status is models.RunStatus.RUNNING and run.completed_at is None
    waiting.release(conn, [held])
    assert claim_all(conn) == [held]


def test_a_held_task_whose_upstream_fails_is_cancelled_and_no_longer_held(conn: sqlite3.Connection) -> None:
    up, down = submit(conn, {"type": "A", "key": "a"}, {"type": "B", "depends_on": ["a"], "hold": True})
    store_steps.claim_next(conn, T0)
    tasks.start(conn, up, now=T0)
    tasks.fail(conn, up, error="boom", error_type="EXCEPTION", now=T0)
    after = tasks.get(conn, down)
    assert (after.status, after.is_held, after.display_status) == (S.CANCELLED, False, "cancelled")


def test_priority_changes_the_next_claim_of_waiting_tasks_held_or_not(conn: sqlite3.Connection) -> None:
    low, held, mid = submit(conn, {"type": "A", "priority": 1}, {"type": "B", "hold": True}, {"type": "C", "priority": 5})
    assert waiting.set_priority(conn, [low, held], 10) == {low: None, held: None}
    assert tasks.get(conn, held).priority == 10 and tasks.get(conn, held).is_held
    assert claim_all(conn) == [low, mid]
    tasks.start(conn, low, now=T0)
    assert waiting.set_priority(conn, [low], 3) == {low: f"task {low} is running: only a waiting task can be given a priority"}


def test_requeue_at_shutdown_may_hold(conn: sqlite3.Connection) -> None:
    paused, other = submit(conn, {"type": "A"}, {"type": "B"})
    for task_id in claim_all(conn):
        tasks.start(conn, task_id, now=T0)
    tasks.requeue(conn, paused, now=T0, hold=True)
    tasks.requeue(conn, other, now=T0)
    assert (tasks.get(conn, paused).display_status, tasks.get(conn, other).display_status) == ("held", "waiting")
    assert claim_all(conn) == [other]


def test_status_words_held_and_waiting_split_pending(conn: sqlite3.Connection) -> None:
    held, claimed, free = submit(conn, {"type": "A", "hold": True}, {"type": "A"}, {"type": "A"})
    assert store_steps.claim_next(conn, T0).id == claimed

    def listed(status: Any) -> list[str]:
        return [t.id for t in task_reads.list_tasks(conn, status=status)]

    assert listed("held") == [held]
    assert listed("waiting") == [claimed, free]  # not the held one: it shows as held
    assert listed("pending") == [held, free]  # the stored status, held or not
    assert listed(["waiting", "held"]) == [held, claimed, free]
    assert listed(["held", "claimed"]) == [held, claimed]
    assert task_reads.count_by_status(conn)["held"] == 1 and task_reads.count_by_status(conn)["pending"] == 2


@pytest.mark.parametrize("newest_first", [False, True])
def test_selection_reads_ids_a_chunk_at_a_time_in_scope(conn: sqlite3.Connection, newest_first: bool) -> None:
    ids = submit(conn, *({"type": "ECHO" if i % 2 else "Other", "hold": i % 3 == 0} for i in range(25)))
    chunks = list(selection.task_ids(conn, scope=Scope.HELD, task_type="echo", chunk=2, newest_first=newest_first))
    expected = [task_id for i, task_id in enumerate(ids) if i % 2 and i % 3 == 0]
    assert [len(chunk) for chunk in chunks] == [2, 2]
    assert sum(chunks, []) == (expected[::-1] if newest_first else expected)
    run_id = tasks.get(conn, ids[0]).workflow_run_id
    assert sum(selection.task_ids(conn, scope=Scope.NOT_HELD, run_id=run_id, status=["waiting"]), []) == [
        task_id for i, task_id in enumerate(ids) if i % 3]
    assert list(selection.task_ids(conn, scope=Scope.PAUSED)) == []
    assert selection.newest_first(conn, [ids[3], "nope", ids[7]]) == [ids[7], ids[3], "nope"]


def test_cancel_waiting_cancels_the_waiting_ones_together_and_counts_their_dependents(conn: sqlite3.Connection) -> None:
    up, down, alone, running = submit(conn, {"type": "A", "key": "a", "hold": True},
                                      {"type": "B", "depends_on": ["a"]}, {"type": "C"}, {"type": "D"})
    for task_id in claim_all(conn):  # `alone` and `running`; `down` waits for `up`
        tasks.transition(conn, task_id, S.PENDING if task_id == alone else S.RUNNING, now=T0)
    assert cancels.cancel_waiting(conn, [up, alone, running, "nope"], now=T0) == {up: 1, alone: 0}
    assert [tasks.get(conn, t).status for t in (up, down, alone, running)] == [S.CANCELLED, S.CANCELLED,
                                                                               S.CANCELLED, S.RUNNING]
    assert tasks.get(conn, down).error_type == models.DEPENDENCY_FAILED
    assert runs.get(conn, tasks.get(conn, up).workflow_run_id).counts.cancelled == 3


def test_a_bulk_by_selectors_is_handed_to_the_loop_in_chunks_not_whole() -> None:
    from daemon import protocol

    for op in ("cancel", "pause", "resume", "hold", "release", "priority"):
        assert protocol.OPERATIONS[op].runs_on_loop({"ids": ["abcd"]})  # a few ids: whole, at once
        assert not protocol.OPERATIONS[op].runs_on_loop({"status": "held"})  # may reach 50,000
    assert protocol.OPERATIONS["submit"].runs_on_loop({"tasks": []})
    assert not protocol.OPERATIONS["ls"].runs_on_loop({})


def test_hold_in_a_submission_must_be_true_or_false() -> None:
    from daemon.errors import SubmissionRefused

    assert parse_spec({"type": "A", "hold": True}).hold and not parse_spec({"type": "A"}).hold
    with pytest.raises(SubmissionRefused, match='hold must be true or false, not "yes"'):
        parse_spec({"type": "A", "hold": "yes"})


def test_fredica_queues_counts_held_tasks_as_held_not_waiting(conn: sqlite3.Connection, tmp_path: Any) -> None:
    from daemon import config, operations, render
    from daemon.store import queues as queue_store

    submit(conn, {"type": "A", "hold": True}, {"type": "A", "hold": True}, {"type": "B"})
    assert queue_store.held(conn) == {"default": 2} and queue_store.waiting(conn) == {"default": 3}
    reads = operations.Reads(config.Settings(database=tmp_path / "unused.db", socket=tmp_path / "s", log_dir=tmp_path), lambda: conn)
    [default] = reads.op_queues()
    assert (default["waiting"], default["held"]) == (1, 2)
    assert "1 waiting 2 held" in render.queues_summary({"default": default})
    assert render.queue_table([default])[0].split() == ["QUEUE", "WORKERS", "BUSY", "WAITING", "HELD", "PAUSED"]
