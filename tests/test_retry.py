"""`fredica retry` and `restarts recreate` in the store: what is copied, how it is wired, what is refused."""

from __future__ import annotations

import sqlite3

import pytest

from daemon import recovery, retry
from daemon.models import TaskStatus as S
from daemon.store import cancels, restarts, runs, task_reads, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 1_000.0


def batch(conn: sqlite3.Connection, *specs: TaskSpec, template: str = "adhoc") -> list[str]:
    return [t.id for t in tasks.submit(conn, list(specs), now=T0, template=template).tasks]


def complete(conn: sqlite3.Connection, task_id: str, result: dict | None = None) -> None:
    tasks.transition(conn, task_id, S.CLAIMED, now=T0)
    tasks.complete(conn, task_id, result or {"done": task_id}, now=T0)


def fail(conn: sqlite3.Connection, task_id: str) -> None:
    tasks.fail(conn, task_id, error="boom", error_type="EXCEPTION", now=T0)


def task_count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM task").fetchone()[0]


def ok(results: list[retry.Result]) -> list[retry.Result]:
    assert all(r.ok for r in results), [r.message for r in results]
    return results


def test_a_failed_head_comes_back_with_its_cascade_wired_as_before(conn: sqlite3.Connection) -> None:
    head, middle, tail, side = batch(
        conn,
        TaskSpec(type="A", key="a", payload={"n": 1}, priority=7, max_retries=2, timeout=9.0, material_id="m",
                 queue="media"),
        TaskSpec(type="B", key="b", depends_on=("a",)),
        TaskSpec(type="C", depends_on=("b",)),
        TaskSpec(type="D", depends_on=("b",)),
    )
    fail(conn, head)
    assert {tasks.get(conn, t).error_type for t in (middle, tail, side)} == {"DEPENDENCY_FAILED"}

    (result,) = ok(retry.retry_tasks(conn, [head], now=T0 + 1, queue_names=["default", "media"]))
    new_run = runs.get(conn, result.extra["run_id"])
    copies = task_reads.list_tasks(conn, run_id=new_run.id)
    assert [c.type for c in copies] == ["A", "B", "C", "D"]
    new_head, new_middle, new_tail, new_side = copies
    assert result.extra["new_id"] == new_head.id and result.extra["copies"] == [c.id for c in copies[1:]]
    assert result.message == (f"retried {head[:8]} as {new_head.id[:8]}, with 3 tasks its failure cancelled"
                              f" (run {new_run.id[:8]})")
    assert new_middle.depends_on == (new_head.id,)
    assert new_tail.depends_on == new_side.depends_on == (new_middle.id,)
    assert {c.status for c in copies} == {S.PENDING}
    assert (new_head.payload, new_head.priority, new_head.max_retries, new_head.timeout, new_head.material_id,
            new_head.queue, new_head.queue_explicit) == ({"n": 1}, 7, 2, 9.0, "m", "media", True)
    assert (new_run.status.value, new_run.total_tasks) == ("pending", 4)
    # The originals stay as they ended; only the head is ready to run.
    assert tasks.get(conn, head).status is S.FAILED
    assert [t.id for t in tasks.claim_ready(conn, T0 + 2, 10, queue="media")] == [new_head.id]
    assert tasks.claim_ready(conn, T0 + 2, 10) == []


def test_a_dependency_that_completed_stays_on_that_task_already_done(conn: sqlite3.Connection) -> None:
    done, head, joined = batch(
        conn, TaskSpec(type="X", key="x"), TaskSpec(type="A", key="a"), TaskSpec(type="J", depends_on=("x", "a"))
    )
    complete(conn, done, {"output": "/media/x"})
    fail(conn, head)

    (result,) = ok(retry.retry_tasks(conn, [head], now=T0 + 1))
    new_joined = tasks.get(conn, result.extra["copies"][0])
    assert new_joined.depends_on == (done, result.extra["new_id"])  # the order kept, for {@N} references
    complete(conn, result.extra["new_id"])
    assert [t.id for t in tasks.claim_ready(conn, T0 + 2, 10)] == [new_joined.id]
    assert task_reads.results_of(conn, new_joined.depends_on)[done] == {"output": "/media/x"}
    assert task_count(conn) == 5  # the completed task was not copied


def test_ids_of_one_run_make_one_run_and_no_task_is_copied_twice(conn: sqlite3.Connection) -> None:
    left, right, joined, after = batch(
        conn, TaskSpec(type="L", key="l"), TaskSpec(type="R", key="r"),
        TaskSpec(type="J", key="j", depends_on=("l", "r")), TaskSpec(type="K", depends_on=("j",)),
    )
    fail(conn, left)
    fail(conn, right)

    # Alone, the left one comes back without the join: its other upstream failed too.
    (alone,) = ok(retry.retry_tasks(conn, [left], now=T0 + 1))
    assert alone.extra["copies"] == [] and alone.message.endswith(f"(run {alone.extra['run_id'][:8]})")
    cancels.cancel(conn, alone.extra["new_id"], now=T0 + 1)

    before = task_count(conn)
    results = ok(retry.retry_tasks(conn, [left, right, joined, left], now=T0 + 2))
    assert len({r.extra["run_id"] for r in results}) == 1
    copies = task_reads.list_tasks(conn, run_id=results[0].extra["run_id"])
    assert [c.type for c in copies] == ["L", "R", "J", "K"] and task_count(conn) == before + 4
    new_left, new_right, new_joined, new_after = copies
    assert new_joined.depends_on == (new_left.id, new_right.id) and new_after.depends_on == (new_joined.id,)
    assert [r.extra["new_id"] for r in results] == [new_left.id, new_right.id, new_joined.id, new_left.id]
    assert results[0].extra["copies"] == [new_joined.id, new_after.id]


def test_tasks_of_two_runs_make_two_runs(conn: sqlite3.Connection) -> None:
    (first,) = batch(conn, TaskSpec(type="A"))
    (second,) = batch(conn, TaskSpec(type="B"))
    fail(conn, first)
    cancels.cancel(conn, second, now=T0)
    results = ok(retry.retry_tasks(conn, [first, second], now=T0 + 1))
    assert len({r.extra["run_id"] for r in results}) == 2


def test_a_task_cancelled_by_its_upstreams_failure_alone_is_refused(conn: sqlite3.Connection) -> None:
    head, middle, tail = batch(conn, TaskSpec(type="A", key="a"), TaskSpec(type="B", key="b", depends_on=("a",)),
                               TaskSpec(type="C", depends_on=("b",)))
    fail(conn, head)
    before = task_count(conn)
    # Each names the task whose failure cancelled it, however far up: that is the one to retry.
    results = retry.retry_tasks(conn, [tail, middle], now=T0 + 1)
    assert [r.ok for r in results] == [False, False]
    assert [r.message for r in results] == [
        f"task {t[:8]} cannot run again: task {head[:8]} upstream of it is failed; retry {head[:8]},"
        " which brings it along" for t in (tail, middle)]
    assert task_count(conn) == before


def test_what_cannot_be_retried_is_refused_one_line_each_and_the_rest_is_done(conn: sqlite3.Connection) -> None:
    waiting, done, failed = batch(conn, TaskSpec(type="A"), TaskSpec(type="B"), TaskSpec(type="C"))
    complete(conn, done)
    fail(conn, failed)
    # Two ids that share their first 4 characters, so that the prefix is ambiguous.
    twins = batch(conn, TaskSpec(type="T", id="abcd0000-0000-4000-8000-000000000001"),
                  TaskSpec(type="T", id="abcd0000-0000-4000-8000-000000000002"))
    before = task_count(conn)
    results = retry.retry_given(conn, [waiting, done, "nope-nope", "abcd", "abc", failed[:6]], now=T0 + 1)
    assert [(r.id, r.ok) for r in results] == [
        (waiting, False), (done, False), ("nope-nope", False), ("abcd", False), ("abc", False), (failed, True)]
    messages = [r.message for r in results]
    assert messages[0] == f"task {waiting[:8]} is waiting: only a failed or cancelled task can be retried"
    assert messages[1] == f"task {done[:8]} is completed: only a failed or cancelled task can be retried"
    assert messages[2] == "no task has id nope-nope"
    assert messages[3].startswith("id abcd is ambiguous") and all(t in messages[3] for t in twins)
    assert "too short" in messages[4]
    assert task_count(conn) == before + 1


def test_a_copy_takes_the_idempotency_key_its_ended_original_freed(conn: sqlite3.Connection) -> None:
    (first,) = batch(conn, TaskSpec(type="A", idempotency_key="k"))
    fail(conn, first)
    (result,) = ok(retry.retry_tasks(conn, [first], now=T0 + 1))
    copy = tasks.get(conn, result.extra["new_id"])
    assert (copy.idempotency_key, copy.status, result.extra["created"]) == ("k", S.PENDING, True)

    # While the copy is active it holds the key: a second retry gets it back, and copies nothing.
    before = task_count(conn)
    (again,) = ok(retry.retry_tasks(conn, [first], now=T0 + 2))
    assert (again.extra["new_id"], again.extra["created"], again.extra["run_id"]) == (copy.id, False, None)
    assert again.message == (f"retried {first[:8]}: task {copy.id[:8]}, already active with idempotency key 'k',"
                             " runs instead (not copied)")
    assert task_count(conn) == before


def test_two_copies_of_one_retry_with_one_key_are_one_task(conn: sqlite3.Connection) -> None:
    # Two runs, one after the other, each with a task keyed "k": both failed, retried together.
    (first,) = batch(conn, TaskSpec(type="A", idempotency_key="k"))
    fail(conn, first)
    (second,) = batch(conn, TaskSpec(type="A", idempotency_key="k"))
    fail(conn, second)
    before = task_count(conn)
    made, shared = ok(retry.retry_tasks(conn, [first, second], now=T0 + 1))
    assert (made.extra["created"], shared.extra["created"]) == (True, False)
    assert shared.extra["new_id"] == made.extra["new_id"] and task_count(conn) == before + 1


def interrupted_pair(conn: sqlite3.Connection) -> tuple[str, str, str]:
    """Two tasks of one run running when the daemon died, and a third that needs both."""
    left, right, joined = batch(
        conn, TaskSpec(type="L", key="l"), TaskSpec(type="R", key="r"), TaskSpec(type="J", depends_on=("l", "r")),
        template="pair",
    )
    for claimed in tasks.claim_ready(conn, T0, 2):
        tasks.start(conn, claimed.id, now=T0)
    recovery.recover(conn, now=T0 + 1)
    return left, right, joined


def test_recreating_entries_of_one_run_makes_one_run_with_their_dependencies(conn: sqlite3.Connection) -> None:
    left, right, joined = interrupted_pair(conn)
    entries = {e.task_id: str(e.id) for e in restarts.list_entries(conn)}
    results = ok(retry.recreate_entries(conn, [entries[left], entries[right]], now=T0 + 2))
    assert [r.id for r in results] == [entries[left], entries[right]]
    assert [r.extra["task_id"] for r in results] == [left, right]
    (run_id,) = {r.extra["run_id"] for r in results}
    assert runs.get(conn, run_id).template == "pair"
    new_left, new_right, new_joined = task_reads.list_tasks(conn, run_id=run_id)
    assert new_joined.depends_on == (new_left.id, new_right.id) and new_joined.type == "J"
    assert results[0].message == (f"recreated entry {entries[left]} (task {left[:8]}) as {new_left.id[:8]},"
                                  f" with 1 task its failure cancelled (run {run_id[:8]})")
    resolved = {e.task_id: e for e in restarts.list_entries(conn, include_resolved=True)}
    assert {(resolved[t].disposition, resolved[t].new_workflow_run_id) for t in (left, right)} == {
        ("recreated", run_id)}
    # Once recreated, an entry is refused; so are an unknown one and one that is no number.
    again = retry.recreate_entries(conn, [entries[left], "-9", "x"], now=T0 + 3)
    assert [(r.ok, r.message) for r in again] == [
        (False, f"restart-log entry {entries[left]} is already recreated"),
        (False, "no restart-log entry has id -9"),
        (False, "restart-log entry ids are numbers, not 'x'"),
    ]


def test_retrying_an_interrupted_task_resolves_its_restart_log_entry(conn: sqlite3.Connection) -> None:
    left, _, _ = interrupted_pair(conn)
    (result,) = ok(retry.retry_tasks(conn, [left], now=T0 + 2))
    (entry,) = [e for e in restarts.list_entries(conn, include_resolved=True) if e.task_id == left]
    assert (entry.disposition, entry.new_workflow_run_id) == ("recreated", result.extra["run_id"])
    assert {e.disposition for e in restarts.list_entries(conn, include_resolved=True) if e.task_id != left} == {
        "pending_review"}


@pytest.mark.parametrize("status", [S.PENDING, S.RUNNING])
def test_an_entry_whose_task_runs_again_is_refused(conn: sqlite3.Connection, status: S) -> None:
    (task_id,) = batch(conn, TaskSpec(type="A"))
    tasks.transition(conn, task_id, S.CLAIMED, now=T0)
    recovery.recover(conn, now=T0 + 1)  # claimed → pending, with an entry
    if status is S.RUNNING:
        tasks.start(conn, tasks.claim_ready(conn, T0 + 1, 1)[0].id, now=T0 + 1)
    (entry,) = restarts.list_entries(conn)
    (result,) = retry.recreate_entries(conn, [str(entry.id)], now=T0 + 2)
    shown = "waiting" if status is S.PENDING else "running"
    assert (result.ok, result.message) == (
        False, f"task {task_id[:8]} is {shown} again and will run: nothing to recreate")
