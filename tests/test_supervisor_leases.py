"""Supervisors, leases, rescue and fencing in the store (SPEC §16), on both backends: a claim
names its supervisor and counts an attempt; a lease is refused to a second live holder; an
expired one is rescued by §9's rules in one transaction, the row last; a late write about an
attempt that is no longer current changes nothing. And the loop's side of it (`daemon.leases`),
stepped with the time passed in."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from daemon import leases, models
from daemon.config import Settings
from daemon.errors import AlreadyRunning, InvalidTransition, StaleAttempt
from daemon.models import TaskStatus as S
from daemon.store import attempts, cancels, restarts, runs, supervisors, tasks, waiting
from daemon.submission import TaskSpec, parse_spec
from tests.conftest import wait_for
from tests.conformance import conn  # noqa: F401 (every test on every backend)

T0 = 7_000.0
LIVE = 3600.0  # a lease that outlives any test
SHORT = 0.01  # a lease that has expired by the time the test looks again


def submit(conn: sqlite3.Connection, count: int) -> list[str]:
    return [t.id for t in tasks.submit(conn, [TaskSpec(type="T") for _ in range(count)], now=T0).tasks]


def register(conn: sqlite3.Connection, name: str, *, lease: float = LIVE, pid: int = 100, gone: bool = False) -> None:
    supervisors.register(conn, name, host="h1", pid=pid, pid_started_at=1.0, lease_timeout=lease,
                         gone=lambda row: gone)


def claim(conn: sqlite3.Connection, supervisor: str, limit: int = 1) -> list[models.Task]:
    return tasks.claim_ready(conn, T0 + 1, limit, supervisor=supervisor)


def expire(conn: sqlite3.Connection, name: str) -> None:
    wait_for(lambda: name in supervisors.expired(conn, besides="nobody"), timeout=5)


def started(conn: sqlite3.Connection, supervisor: str) -> models.Task:
    """One task submitted, claimed by `supervisor` and started: its first attempt running."""
    (task_id,) = submit(conn, 1)
    (claimed,) = claim(conn, supervisor)
    return tasks.start(conn, task_id, now=T0 + 2, known=claimed)


def row(conn: sqlite3.Connection, task_id: str) -> tuple:
    return tuple(conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone())


# --- the claim names its supervisor and counts attempts ----------------------------------------


def test_a_claim_names_its_supervisor_and_counts_an_attempt_kept_after_the_end(conn: sqlite3.Connection) -> None:
    (task_id,) = submit(conn, 1)
    assert tasks.get(conn, task_id).attempt == 0 and tasks.get(conn, task_id).supervisor is None
    (claimed,) = claim(conn, "alpha")
    assert (claimed.supervisor, claimed.attempt) == ("alpha", 1)
    started = tasks.start(conn, task_id, now=T0 + 2, known=claimed)
    tasks.retry(conn, task_id, error="x", error_type="E", not_before=0, now=T0 + 3, known=started)
    (again,) = claim(conn, "beta")
    assert (again.supervisor, again.attempt) == ("beta", 2)
    tasks.start(conn, task_id, now=T0 + 4, known=again)
    done = tasks.complete(conn, task_id, {"ok": True}, now=T0 + 5, known=tasks.get(conn, task_id))
    assert (done.status, done.supervisor, done.attempt) == (S.COMPLETED, "beta", 2)


# --- fencing -----------------------------------------------------------------------------------


def test_a_late_start_of_a_rescued_claim_changes_nothing_of_the_new_claim(conn: sqlite3.Connection) -> None:
    (task_id,) = submit(conn, 1)
    register(conn, "alpha", lease=SHORT)
    (stale,) = claim(conn, "alpha")
    expire(conn, "alpha")
    assert supervisors.rescue(conn, "alpha", now=T0 + 2, session_id="s1") is not None
    (current,) = claim(conn, "beta")
    before = row(conn, task_id)
    with pytest.raises(StaleAttempt, match="attempt 1 of supervisor alpha is no longer"):
        tasks.start(conn, task_id, now=T0 + 3, known=stale, executor_pid=4242)
    assert row(conn, task_id) == before
    assert tasks.start(conn, task_id, now=T0 + 3, known=current).status is S.RUNNING


def test_a_start_of_many_moves_the_current_claims_and_leaves_a_rescued_one_unchanged(
    conn: sqlite3.Connection,
) -> None:
    ids = submit(conn, 3)
    register(conn, "alpha", lease=SHORT)
    (stale,) = claim(conn, "alpha")
    expire(conn, "alpha")
    assert supervisors.rescue(conn, "alpha", now=T0 + 2, session_id="s1") is not None
    claims = {task.id: task for task in claim(conn, "beta", 3)}
    before = row(conn, stale.id)
    starts = [tasks.Start(stale, 4242, 1.0, False)] + [
        tasks.Start(task, 5000 + n, 2.0, n == 0) for n, task in enumerate(claims.values())
    ]
    started = tasks.start_many(conn, starts, now=T0 + 3)
    # The rescued claim's attempt is beta's now (claimed again): alpha's start of it is left out.
    assert sorted(started) == sorted(ids) and started[stale.id].executor_pid != 4242
    assert row(conn, stale.id) != before  # beta's start of it went through
    for n, task_id in enumerate(claims):
        assert started[task_id].status is S.RUNNING and started[task_id].executor_pid == 5000 + n
        assert started[task_id].is_pausable is (n == 0) and started[task_id].started_at == T0 + 3
    run = runs.get(conn, claims[ids[0]].workflow_run_id)
    assert run.counts == runs.counts_from_tasks(conn, run.id)  # moved for the rows moved only
    # A task started already is left out too, unchanged.
    again = tasks.start_many(conn, [tasks.Start(claims[ids[1]], 1, 1.0, False)], now=T0 + 4)
    assert again == {} and tasks.get(conn, ids[1]).executor_pid == 5001


def test_a_completion_of_many_stores_each_result_and_unblocks_the_dependents(conn: sqlite3.Connection) -> None:
    specs = [parse_spec({"type": "A", "key": f"a{n}"}) for n in range(3)]
    specs.append(parse_spec({"type": "DOWN", "depends_on": ["a0", "a2"]}))
    sub = tasks.submit(conn, specs, now=T0)
    *heads, dependent = (t.id for t in sub.tasks)
    claims = claim(conn, "alpha", 3)
    running = tasks.start_many(conn, [tasks.Start(t, 10, 1.0, False) for t in claims], now=T0 + 2)
    results = {heads[0]: {"n": 0}, heads[1]: None, heads[2]: [1, "two"]}
    tasks.complete_many(conn, [(running[i], results[i]) for i in heads], now=T0 + 3)
    for task_id in heads:
        done = tasks.get(conn, task_id)
        assert (done.status, done.result, done.completed_at, done.progress) == (S.COMPLETED, results[task_id], T0 + 3, 100)
    assert tasks.get(conn, dependent).status is S.PENDING  # both its dependencies met
    (next_up,) = claim(conn, "alpha")
    assert next_up.id == dependent
    run = runs.get(conn, next_up.workflow_run_id)
    assert run.counts == runs.counts_from_tasks(conn, run.id)


def test_a_completion_of_many_with_one_rescued_attempt_changes_nothing(conn: sqlite3.Connection) -> None:
    submit(conn, 2)
    register(conn, "alpha", lease=SHORT)
    (stale,) = claim(conn, "alpha")
    (current,) = claim(conn, "beta")
    running = tasks.start_many(conn, [tasks.Start(t, 10, 1.0, False) for t in (stale, current)], now=T0 + 2)
    expire(conn, "alpha")
    assert supervisors.rescue(conn, "alpha", now=T0 + 3, session_id="s1") is not None
    assert tasks.get(conn, stale.id).status is not S.RUNNING
    before = {task_id: row(conn, task_id) for task_id in running}
    # All or nothing: beta's attempt, still current, is not completed with alpha's stale one.
    with pytest.raises(InvalidTransition):
        tasks.complete_many(conn, [(task, {"ok": 1}) for task in running.values()], now=T0 + 4)
    assert {task_id: row(conn, task_id) for task_id in running} == before
    assert tasks.complete_many(conn, [(running[current.id], {"ok": 1})], now=T0 + 4) is None
    assert tasks.get(conn, current.id).status is S.COMPLETED


def test_late_writes_of_a_replaced_attempt_are_refused_and_the_new_attempt_keeps_its_own(
    conn: sqlite3.Connection,
) -> None:
    stale = started(conn, "alpha")
    task_id = stale.id
    # Put back and claimed again by another supervisor (what a rescue of a claim, or a retry, leads to).
    tasks.requeue(conn, task_id, now=T0 + 3, known=stale)
    (second,) = claim(conn, "beta")
    current = tasks.start(conn, task_id, now=T0 + 4, known=second)
    old, new = tasks.AttemptRef.of(stale), tasks.AttemptRef.of(current)
    assert attempts.record_progress(conn, [(new, 30, "beta's")]) == 1
    attempts.record_pause_states(conn, [(new, False, True, "beta's")])
    before = row(conn, task_id)

    assert attempts.record_progress(conn, [(old, 90, "alpha's")]) == 0
    assert attempts.record_pause_states(conn, [(old, True, True, "alpha's")]) == 0
    assert attempts.heartbeat(conn, [old], T0 + 50) == 0
    assert not attempts.set_paused(conn, old, True)
    assert not attempts.set_pausable(conn, old, False)
    for late in (
        lambda: tasks.complete(conn, task_id, {"by": "alpha"}, now=T0 + 5, known=stale),
        lambda: tasks.fail(conn, task_id, error="x", error_type="E", now=T0 + 5, known=stale),
        lambda: tasks.retry(conn, task_id, error="x", error_type="E", not_before=0, now=T0 + 5, known=stale),
        lambda: tasks.requeue(conn, task_id, now=T0 + 5, known=stale),
        lambda: cancels.cancel(conn, task_id, now=T0 + 5, known=stale),
    ):
        with pytest.raises(StaleAttempt):
            late()
    assert row(conn, task_id) == before

    assert attempts.heartbeat(conn, [new], T0 + 6) == 1
    done = tasks.complete(conn, task_id, {"by": "beta"}, now=T0 + 7, known=current)
    assert (done.status, done.result, done.progress) == (S.COMPLETED, {"by": "beta"}, 100)


def test_a_late_outcome_of_a_rescued_running_attempt_is_refused(conn: sqlite3.Connection) -> None:
    (task_id,) = submit(conn, 1)
    register(conn, "alpha", lease=SHORT)
    (claimed,) = claim(conn, "alpha")
    stale = tasks.start(conn, task_id, now=T0 + 2, known=claimed)
    expire(conn, "alpha")
    supervisors.rescue(conn, "alpha", now=T0 + 3, session_id="s1")
    with pytest.raises(InvalidTransition):
        tasks.complete(conn, task_id, {"late": True}, now=T0 + 4, known=stale)
    after = tasks.get(conn, task_id)
    assert (after.status, after.error_type, after.result) == (S.FAILED, models.INTERRUPTED, None)


def test_a_pause_asked_of_another_supervisor_names_its_attempt_and_is_not_carried_to_the_next(
    conn: sqlite3.Connection,
) -> None:
    running = started(conn, "alpha")
    task_id, ref = running.id, tasks.AttemptRef.of(running)
    assert attempts.look_at_attempts(conn, [ref]) == attempts.AttemptRows([], {})
    assert attempts.ask_pause(conn, ref, True)
    assert attempts.look_at_attempts(conn, [ref]) == attempts.AttemptRows([], {task_id: True})
    assert attempts.ask_pause(conn, ref, False)  # the latest wish is the one that counts
    assert attempts.look_at_attempts(conn, [ref]).pause_wanted == {task_id: False}
    attempts.answer_pause(conn, ref)
    assert attempts.look_at_attempts(conn, [ref]) == attempts.AttemptRows([], {})

    assert attempts.ask_pause(conn, ref, True)  # left unanswered: the attempt ends first
    tasks.requeue(conn, task_id, now=T0 + 3, known=running)
    # Gone with its attempt: a row out of running holds no wish.
    assert conn.execute("SELECT pause_wanted FROM task WHERE id = ?", (task_id,)).fetchone()[0] is None
    assert not attempts.ask_pause(conn, ref, True)  # not running: nothing to ask
    assert attempts.look_at_attempts(conn, [ref]) == attempts.AttemptRows([task_id], {})
    (second,) = claim(conn, "beta")
    assert not attempts.ask_pause(conn, ref, True)  # a claim is not a start, and names another attempt
    current = tasks.start(conn, task_id, now=T0 + 4, known=second)
    new = tasks.AttemptRef.of(current)
    assert attempts.look_at_attempts(conn, [new]) == attempts.AttemptRows([], {})  # the old wish is not this one's
    assert not attempts.ask_pause(conn, ref, False)  # the old attempt's fence
    assert attempts.look_at_attempts(conn, [ref, new]) == attempts.AttemptRows([task_id], {})


# --- leases ------------------------------------------------------------------------------------


def test_a_second_live_supervisor_of_a_name_is_refused_in_one_line(conn: sqlite3.Connection) -> None:
    register(conn, "alpha", pid=100)
    with pytest.raises(AlreadyRunning, match=r"^another supervisor named 'alpha' \(host h1, pid 100\) holds a lease"):
        register(conn, "alpha", pid=200)
    assert supervisors.find(conn, "alpha").pid == 100
    register(conn, "beta", pid=200)  # another name is another supervisor
    assert [s.name for s in supervisors.list_all(conn)] == ["alpha", "beta"]


def test_a_name_is_taken_over_once_its_process_is_known_gone_or_its_lease_expired(conn: sqlite3.Connection) -> None:
    register(conn, "alpha", pid=100)
    register(conn, "alpha", pid=200, gone=True)  # killed -9 on this host, restarted at once
    assert supervisors.find(conn, "alpha").pid == 200
    register(conn, "beta", pid=300, lease=SHORT)
    expire(conn, "beta")
    register(conn, "beta", pid=400)
    held = supervisors.find(conn, "beta")
    assert (held.pid, held.expired) == (400, False)


def test_renewal_keeps_a_lease_and_fails_once_it_was_taken(conn: sqlite3.Connection) -> None:
    register(conn, "alpha", pid=100)
    first = supervisors.find(conn, "alpha").heartbeat_at
    wait_for(lambda: supervisors.database_now(conn) > first)
    assert supervisors.renew(conn, "alpha", host="h1", pid=100)
    assert supervisors.find(conn, "alpha").heartbeat_at > first
    register(conn, "alpha", pid=200, gone=True)
    assert not supervisors.renew(conn, "alpha", host="h1", pid=100)


# --- rescue ------------------------------------------------------------------------------------


def test_a_rescue_applies_recovery_to_the_dead_ones_tasks_only_then_removes_it(conn: sqlite3.Connection) -> None:
    ids = submit(conn, 5)
    register(conn, "dead", lease=SHORT)
    register(conn, "alive")
    running, claimed = claim(conn, "dead", 2)
    tasks.start(conn, running.id, now=T0 + 2, known=running)
    (theirs,) = claim(conn, "alive")
    tasks.start(conn, theirs.id, now=T0 + 2, known=theirs)
    expire(conn, "dead")
    assert supervisors.expired(conn, besides="alive") == ["dead"]

    rescued = supervisors.rescue(conn, "dead", now=T0 + 3, session_id="rescue-1")
    assert rescued is not None
    assert [t.id for t in rescued.in_flight] == [running.id, claimed.id]
    assert [t.id for t in rescued.interrupted] == [running.id]
    assert [t.id for t in rescued.requeued] == [claimed.id]
    failed = tasks.get(conn, running.id)
    assert (failed.status, failed.error_type, failed.supervisor) == (S.FAILED, models.INTERRUPTED, "dead")
    assert tasks.get(conn, claimed.id).status is S.PENDING
    assert tasks.get(conn, theirs.id).status is S.RUNNING  # the live supervisor's task is left alone
    assert [(e.session_id, e.task_id, e.status_at_restart) for e in restarts.list_entries(conn)] == [
        ("rescue-1", running.id, "running"), ("rescue-1", claimed.id, "claimed"),
    ]
    assert supervisors.find(conn, "dead") is None
    assert supervisors.rescue(conn, "dead", now=T0 + 4, session_id="rescue-2") is None  # once
    assert len(ids) == 5 and tasks.get(conn, ids[-1]).status is S.PENDING


def test_a_live_lease_is_never_rescued(conn: sqlite3.Connection) -> None:
    submit(conn, 1)
    register(conn, "alive")
    (task,) = claim(conn, "alive")
    assert supervisors.expired(conn, besides="other") == []
    assert supervisors.rescue(conn, "alive", now=T0 + 2, session_id="s") is None
    assert tasks.get(conn, task.id).status is S.CLAIMED and supervisors.find(conn, "alive") is not None


def test_a_graceful_release_keeps_the_row_while_tasks_are_in_flight(conn: sqlite3.Connection) -> None:
    submit(conn, 1)
    register(conn, "alpha", pid=100)
    (task,) = claim(conn, "alpha")
    assert not supervisors.release(conn, "alpha", host="h1", pid=100)
    tasks.requeue(conn, task.id, now=T0 + 2, known=task)
    assert not supervisors.release(conn, "alpha", host="h1", pid=999)  # not this process's lease
    assert supervisors.release(conn, "alpha", host="h1", pid=100)
    assert supervisors.find(conn, "alpha") is None


# --- the loop's side: daemon/leases.py ---------------------------------------------------------


def lease_settings(name: str, lease: float) -> Settings:
    return Settings(database=Path("/unused"), socket=Path("/unused"), log_dir=Path("/unused"), name=name,
                    lease_timeout=lease, heartbeat_interval=lease / 4)


def test_the_loop_renews_at_each_heartbeat_and_rescues_an_expired_lease_within_half_a_second(
    conn: sqlite3.Connection,
) -> None:
    submit(conn, 1)
    lease = leases.Lease(lease_settings("alive", LIVE))  # renewed every LIVE / 4 (900 s)
    lease.tick(conn, T0)  # registers "alive": a renewal finds no row of its own yet
    renewed = supervisors.find(conn, "alive")
    assert renewed.pid == os.getpid()
    register(conn, "dead", lease=SHORT)
    (task,) = claim(conn, "dead")
    expire(conn, "dead")
    assert lease.tick(conn, T0 + 0.2) == []  # not due: the last look was 0.2 s ago
    assert supervisors.find(conn, "dead") is not None
    (rescued,) = lease.tick(conn, T0 + 0.5)  # a look, long before the next renewal
    assert [t.id for t in rescued.requeued] == [task.id] and supervisors.find(conn, "dead") is None
    assert supervisors.find(conn, "alive").heartbeat_at == renewed.heartbeat_at  # not renewed by a look
    assert lease.next_at == T0 + 1.0
    lease.tick(conn, T0 + LIVE / 4)
    assert supervisors.find(conn, "alive").heartbeat_at > renewed.heartbeat_at
    assert lease.next_at == T0 + LIVE / 4 + 0.5


def test_a_bug_of_ours_in_the_look_is_logged_once_a_heartbeat_not_at_every_look(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = leases.Lease(lease_settings("alive", 20.0))  # renewed every 5 s, the default
    lease.tick(conn, T0)

    def bug(*_: object, **__: object) -> list[str]:
        raise TypeError("a bug of ours")

    monkeypatch.setattr(supervisors, "expired", bug)
    logged: list[tuple[object, ...]] = []
    monkeypatch.setattr(leases.log, "exception", lambda *event, **_: logged.append(event))
    now = T0
    while now < T0 + 60:
        now += 0.1
        if now >= lease.next_at:
            lease.tick(conn, now)
    # Once a heartbeat (5 s) over 60 s, not twice a second (120); and named for what failed.
    assert 11 <= len(logged) <= 13 and set(logged) == {("lease_look_failed",)}, logged


def test_after_a_reconnection_the_loop_rescues_no_one_for_a_lease_timeout(conn: sqlite3.Connection) -> None:
    submit(conn, 1)
    register(conn, "slow", lease=SHORT)
    claim(conn, "slow")
    lease = leases.Lease(lease_settings("alive", 100.0))  # renewed every 25 s
    lease.reconnected(T0)
    expire(conn, "slow")
    assert lease.tick(conn, T0 + 1) == []  # renewed its own, rescued no one: others reconnect too
    assert supervisors.find(conn, "alive") is not None and supervisors.find(conn, "slow") is not None
    assert lease.tick(conn, T0 + 99) == [] and supervisors.find(conn, "slow") is not None
    assert [r.supervisor for r in lease.tick(conn, T0 + 124)] == ["slow"]


def test_a_supervisor_taken_for_dead_takes_its_name_again_its_rescued_tasks_stay_rescued(
    conn: sqlite3.Connection,
) -> None:
    submit(conn, 1)
    lease = leases.Lease(lease_settings("alpha", SHORT * 8))
    lease.tick(conn, T0)
    (task,) = claim(conn, "alpha")
    expire(conn, "alpha")
    supervisors.rescue(conn, "alpha", now=T0 + 1, session_id="by-beta")
    lease.tick(conn, T0 + 2)
    assert supervisors.find(conn, "alpha").pid == os.getpid()
    assert (tasks.get(conn, task.id).status, tasks.get(conn, task.id).attempt) == (S.PENDING, 1)


# --- bulk requests of a shared queue ------------------------------------------------------------


def test_bulk_cancel_hold_and_priority_read_alike_on_both_backends(conn: sqlite3.Connection) -> None:
    # Their SQL holds SQLite's planner hint `+status`, which PostgreSQL has no operator for: a
    # cancel given on any host of a shared queue (SPEC §16) went through none of them there.
    first, second, third = submit(conn, 3)
    assert waiting.hold(conn, [first])[first] is None and tasks.get(conn, first).is_held
    assert waiting.set_priority(conn, [second], 5)[second] is None and tasks.get(conn, second).priority == 5
    (claimed,) = claim(conn, "alpha")
    assert claimed.id == second
    assert set(cancels.cancel_waiting(conn, [first, second, third], now=T0 + 2)) == {first, second, third}
    assert {tasks.get(conn, i).status for i in (first, second, third)} == {S.CANCELLED}
