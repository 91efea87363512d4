"""A queue's prefetch (SPEC §15), stepped: tasks sent ahead to reused processes stay `claimed`
with their process recorded, start when their process says "started", and are taken back
("revoke") for a worker that frees first, a cancel, the shutdown; a process that dies with tasks
sent ahead puts back those it never started. Fake executor processes (tests/fake_processes.py),
`Supervisor.tick(now)`: nothing here waits.

Real processes and the real daemon: tests/test_prefetch_daemon.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon import models, queues, recovery
from daemon.engine.attempt import Phase
from daemon.errors import NotPausable
from daemon.models import TaskStatus
from daemon.store import restarts, tasks
from daemon.submission import parse_spec
from tests.test_supervisor_stepped import Stepped, fail_once


def prefetching(tmp_path: Path, *, workers: int = 2, prefetch: int = 2, **options: Any) -> Stepped:
    return Stepped(
        tmp_path, max_workers=workers, tasks_per_process=options.pop("tasks_per_process", 10),
        queues={"default": queues.QueueConfig("default", 0, prefetch=prefetch)}, warm_spare=False, **options,
    )


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[Callable[..., Stepped]]:
    made: list[Stepped] = []

    def make(**options: Any) -> Stepped:
        made.append(prefetching(tmp_path / f"s{len(made)}", **options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def statuses(s: Stepped, ids: list[str]) -> list[str]:
    return [s.task(task_id).status.value for task_id in ids]


def token(s: Stepped, task_id: str) -> str:
    return s.sup.ahead[task_id].token


def test_each_worker_holds_prefetch_tasks_claimed_behind_the_one_it_runs_with_its_process_recorded(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=2, prefetch=2)
    ids = [s.submit("ECHO", payload={"n": n}) for n in range(9)]
    s.at(0.0)
    # Two run; each of their workers holds two more (free workers + prefetch × workers).
    assert statuses(s, ids) == ["running"] * 2 + ["claimed"] * 4 + ["pending"] * 3
    first, second = s.process(ids[0]), s.process(ids[1])
    assert first is not second
    for task_id in ids[2:6]:
        row, fake = s.task(task_id), s.process(task_id)
        assert fake in (first, second) and row.executor_pid == fake.pid  # recorded before it was sent
        assert row.started_at is None
    sent = {a.task.id: a for fake in (first, second) for a in fake.sent}
    assert not sent[ids[0]].prefetched and sent[ids[0]].prefetching
    assert all(sent[task_id].prefetched for task_id in ids[2:6])
    # The first one's result: its worker's next is its own to start, so nothing more is claimed.
    first.result({"n": 0})
    s.at(1.0)
    assert statuses(s, ids) == ["completed", "running"] + ["claimed"] * 4 + ["pending"] * 3
    behind_first = [task_id for task_id in ids[2:6] if s.process(task_id) is first]
    first.send({"type": "started", "attempt": token(s, behind_first[0])})
    s.at(2.0)
    started = s.task(behind_first[0])
    assert started.status is TaskStatus.RUNNING and started.executor_pid == first.pid and started.started_at == 2.0
    assert s.sup.running[behind_first[0]].phase is Phase.RUNNING
    # Its worker holds one fewer behind it: one more is claimed and sent ahead there.
    assert statuses(s, ids[6:]) == ["claimed", "pending", "pending"]
    assert s.process(ids[6]) is first and s.task(ids[6]).executor_pid == first.pid
    first.result({"ran": behind_first[0]})  # untagged: the current attempt's, the started one
    s.at(3.0)
    assert s.task(behind_first[0]).status is TaskStatus.COMPLETED
    assert s.task(behind_first[0]).result == {"ran": behind_first[0]}


def test_a_started_attempts_messages_and_result_are_its_own(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=1)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    assert s.process(b) is fake and s.task(b).status is TaskStatus.CLAIMED
    # In one drain: the first's result, then the next's start, progress and result.
    fake.result({"who": "a"})
    fake.send({"type": "started", "attempt": token(s, b)})
    fake.progress(40, "half")
    fake.result({"who": "b"})
    s.at(1.0)
    assert s.task(a).result == {"who": "a"} and s.task(b).result == {"who": "b"}
    assert s.task(b).status is TaskStatus.COMPLETED and s.task(b).started_at == 1.0
    assert not s.sup.running and not s.sup.ahead and not s.sup.lanes
    assert list(s.sup.idle) == [fake]  # its last attempt over: back in the pool


def test_a_worker_that_frees_first_takes_over_the_oldest_task_waiting_behind_another(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=2, prefetch=1)
    a, b, c = s.submit("ECHO"), s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    p1, p2 = s.process(a), s.process(b)
    assert s.process(c) is p1 and s.task(c).executor_pid == p1.pid
    p2.result({})  # b's worker frees, with nothing of its own behind it
    s.at(1.0)
    assert p1.told("revoke") == [("revoke", token(s, c))]
    assert s.task(c).status is TaskStatus.CLAIMED and s.task(c).executor_pid == p1.pid
    s.at(1.5)  # no answer yet: the freed worker is kept for c, nothing else is claimed into it
    assert len(p1.told("revoke")) == 1
    p1.send({"type": "revoked", "attempt": token(s, c)})
    s.at(2.0)
    row = s.task(c)
    assert row.status is TaskStatus.RUNNING and row.executor_pid == p2.pid  # handed to the freed worker
    assert s.process(c) is p2 and not p2.sent[-1].prefetched
    assert s.task(a).status is TaskStatus.RUNNING  # the one it waited behind runs on


def test_a_revoke_that_crosses_the_start_leaves_the_task_where_it_started(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=2, prefetch=1)
    a, b, c = s.submit("ECHO"), s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    p1, p2 = s.process(a), s.process(b)
    p2.result({})
    s.at(1.0)
    assert p1.told("revoke")
    p1.result({})  # a ended meanwhile, and p1 started c before it read the revoke: no answer to it
    p1.send({"type": "started", "attempt": s.sup.ahead[c].token})
    s.at(2.0)
    assert s.task(c).status is TaskStatus.RUNNING and s.task(c).executor_pid == p1.pid
    assert len([cmd for cmd in p2.commands if cmd[0] == "assign"]) == 1  # c never went to p2 too
    p1.result({"c": True})
    s.at(3.0)
    assert s.task(c).status is TaskStatus.COMPLETED and s.task(c).result == {"c": True}


def test_a_cancel_of_a_task_sent_ahead_revokes_it_and_cancels_it_once_revoked(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=2)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    report = s.request(1.0, lambda: s.sup.cancel(b))
    assert report.stopping == (b,) and not report.cancelled
    assert fake.told("revoke") == [("revoke", token(s, b))]
    assert s.task(b).status is TaskStatus.CLAIMED
    fake.send({"type": "revoked", "attempt": token(s, b)})
    s.at(2.0)
    row = s.task(b)
    assert row.status is TaskStatus.CANCELLED and row.error_type == models.CANCELLED
    assert s.task(a).status is TaskStatus.RUNNING


def test_a_cancel_that_crosses_the_start_cancels_the_running_attempt(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=1)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    s.request(1.0, lambda: s.sup.cancel(b))
    b_token = token(s, b)
    fake.result({})
    fake.send({"type": "started", "attempt": b_token})  # before it read the revoke
    s.at(2.0)
    assert s.task(b).status is TaskStatus.RUNNING
    assert fake.told("cancel") == [("cancel", b_token, "cancel")]
    fake.result(error="cancelled", error_type=models.CANCELLED)
    s.at(3.0)
    assert s.task(b).status is TaskStatus.CANCELLED


def test_a_task_sent_ahead_cannot_be_paused(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=1)
    s.submit("COUNT")
    b = s.submit("COUNT")
    s.at(0.0)
    with pytest.raises(NotPausable, match="only a running task can be paused"):
        s.request(1.0, lambda: s.sup.pause(b))


def test_at_shutdown_tasks_sent_ahead_are_revoked_and_put_back_while_the_running_finish(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=1, prefetch=2, shutdown_grace=30.0)
    a, b, c = s.submit("ECHO"), s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    s.sup.request_stop()
    s.at(1.0)
    assert [cmd[1] for cmd in fake.told("revoke")] == [token(s, b), token(s, c)]
    fake.send({"type": "revoked", "attempt": token(s, b)})
    fake.send({"type": "revoked", "attempt": token(s, c)})
    s.at(2.0)
    assert statuses(s, [a, b, c]) == ["running", "pending", "pending"]
    assert s.task(b).executor_pid is None  # back as it was: nothing of its process is kept
    fake.result({})
    s.at(3.0)
    assert statuses(s, [a, b, c]) == ["completed", "pending", "pending"]
    assert not s.sup.running and not s.sup.ahead


def test_a_process_that_dies_puts_back_what_it_never_started_and_crashes_what_it_had(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=1, prefetch=2)
    a, b, c = s.submit("ECHO", max_retries=0), s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    fake.result({})
    fake.send({"type": "started", "attempt": token(s, b)})
    s.at(1.0)
    assert statuses(s, [a, b, c]) == ["completed", "running", "claimed"]
    fake.process_exit(-9)  # killed while it ran b, with c sent ahead
    s.at(2.0)
    row = s.task(b)
    assert row.status is TaskStatus.FAILED and row.error_type == models.CRASHED
    row = s.task(c)
    # Never started ("started" comes before any executor code): back to pending, no attempt spent;
    # then claimed again into the worker that freed, in a new process.
    assert row.retry_count == 0 and row.error_type is None
    assert row.status is TaskStatus.RUNNING and row.executor_pid != fake.pid
    assert not s.sup.lanes or all(lane.process is not fake for lane in s.sup.lanes.values())


def test_no_task_is_sent_ahead_to_a_process_that_will_not_run_it(stepped: Callable[..., Stepped]) -> None:
    # tasks_per_process 2: the process's second attempt is its last, sent only when it is idle.
    s = stepped(workers=1, prefetch=3, tasks_per_process=2)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    assert statuses(s, [a, b]) == ["running", "pending"]


def test_with_a_fresh_process_per_attempt_prefetch_has_no_effect(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=3, tasks_per_process=1)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    assert statuses(s, [a, b]) == ["running", "pending"]


def test_recovery_fails_a_task_sent_ahead_as_interrupted_and_puts_back_a_claimed_one(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=1, prefetch=1)
    a, b, c = s.submit("ECHO"), s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    claimed_only = tasks.claim_ready(s.sup.conn, 0.5, 1)[0]  # claimed, no process: never sent
    assert claimed_only.id == c and claimed_only.executor_pid is None
    assert statuses(s, [a, b, c]) == ["running", "claimed", "claimed"]
    report = recovery.recover(s.sup.conn, now=1.0, kill_grace=0.1)  # the fakes are no real processes
    assert statuses(s, [a, b, c]) == ["failed", "failed", "pending"]
    assert s.task(b).error_type == models.INTERRUPTED and "sent ahead" in (s.task(b).error or "")
    assert report.interrupted == 2 and report.requeued == 1
    logged = {entry.task_id: entry.status_at_restart for entry in restarts.list_entries(s.sup.conn)}
    assert logged == {a: "running", b: "claimed", c: "claimed"}


def test_an_event_loop_queue_sends_tasks_ahead_each_behind_one_attempt_it_runs(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=2, prefetch=1)
    ids = [s.submit("UNTIL_CANCELLED") for _ in range(5)]
    s.at(0.0)
    loop = s.process(ids[0])
    assert all(s.process(task_id) is loop for task_id in ids[:4]) and loop.kind == "event_loop"
    assert statuses(s, ids) == ["running", "running", "claimed", "claimed", "pending"]
    sent = {a.task.id: a for a in loop.sent}
    heads = {s.sup.running[ids[0]].token, s.sup.running[ids[1]].token}
    # Each waits behind a different attempt: the process runs two at once, whatever ends first.
    assert {sent[ids[2]].after, sent[ids[3]].after} == heads and sent[ids[2]].prefetched
    assert all(s.task(task_id).executor_pid == loop.pid for task_id in ids[2:4])
    follower = next(task_id for task_id in ids[2:4] if sent[task_id].after == s.sup.running[ids[0]].token)
    loop.result({}, token=s.sup.running[ids[0]].token)
    loop.send({"type": "started"}, token=token(s, follower))
    s.at(1.0)
    assert s.task(ids[0]).status is TaskStatus.COMPLETED and s.task(follower).status is TaskStatus.RUNNING
    # The follower's lane has room again: the fifth is sent ahead behind it.
    assert s.task(ids[4]).status is TaskStatus.CLAIMED and loop.sent[-1].after == s.sup.running[follower].token


def test_in_an_event_loop_queue_a_freed_worker_takes_over_a_task_waiting_behind_another(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(workers=2, prefetch=1)
    a, b, c = (s.submit("UNTIL_CANCELLED") for _ in range(3))
    s.at(0.0)
    loop = s.process(a)
    behind = loop.sent[-1].after
    ended = b if behind == s.sup.running[a].token else a
    loop.result({}, token=s.sup.running[ended].token)
    s.at(1.0)
    assert loop.told("revoke") == [("revoke", token(s, c))]
    loop.send({"type": "revoked"}, token=token(s, c))
    s.at(2.0)
    assert s.task(c).status is TaskStatus.RUNNING and not loop.sent[-1].prefetched  # starts at once
    assert loop.holding == 2  # the one still running, and c


def test_an_event_loop_process_that_dies_puts_back_what_it_never_started(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=2)
    a, b, c = (s.submit("UNTIL_CANCELLED", max_retries=0) for _ in range(3))
    s.at(0.0)
    loop = s.process(a)
    loop.process_exit(-9)
    s.at(1.0)
    assert s.task(a).status is TaskStatus.FAILED and s.task(a).error_type == models.CRASHED
    # b and c never started: back to pending, then claimed again (into a new process).
    assert [s.task(t).retry_count for t in (b, c)] == [0, 0]
    assert s.task(b).status is TaskStatus.RUNNING and s.task(b).executor_pid != loop.pid


def test_a_run_cancel_cancels_a_task_sent_ahead_at_once_and_revokes_it(stepped: Callable[..., Stepped]) -> None:
    s = stepped(workers=1, prefetch=1)
    a = s.submit("ECHO")
    submitted = s.sup.submit([parse_spec({"type": "ECHO"})])
    b, run = submitted.tasks[0].id, submitted.run_id
    s.at(0.0)
    fake = s.process(a)
    assert s.task(b).status is TaskStatus.CLAIMED
    report = s.request(1.0, lambda: s.sup.cancel(run))
    assert report.cancelled == (b,) and s.task(b).status is TaskStatus.CANCELLED
    assert fake.told("revoke") == [("revoke", token(s, b))]
    fake.send({"type": "revoked", "attempt": token(s, b)})
    s.at(2.0)
    assert s.task(b).status is TaskStatus.CANCELLED and not s.sup.ahead
    fake.result({})
    s.at(3.0)
    assert s.task(a).status is TaskStatus.COMPLETED and list(s.sup.idle) == [fake]


def test_a_start_read_while_the_database_cannot_be_written_is_recorded_once_it_can(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped(workers=1, prefetch=1)
    a, b = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    fake = s.process(a)
    fail_once(monkeypatch, "start")
    fake.result({"a": 1})
    fake.send({"type": "started", "attempt": token(s, b)})
    s.at(1.0)
    assert s.sup.fault is not None
    assert statuses(s, [a, b]) == ["running", "claimed"]  # nothing of that tick was written
    s.at(s.sup.fault.retry_at)
    assert s.sup.fault is None
    assert statuses(s, [a, b]) == ["completed", "running"] and s.task(b).started_at == 1.0
    fake.result({"b": 2})
    s.at(s.now + 1)
    assert s.task(b).status is TaskStatus.COMPLETED and s.task(b).result == {"b": 2}
