"""The supervisor's timers, stepped: retry backoff, timeouts, cancel escalation, the grace after a
last result, the shutdown grace, pause and resume, a blocked event loop, each driven by
`Supervisor.tick(now)` at the `now` the test chooses, with fake executor processes
(tests/fake_processes.py) whose "executor" the test scripts. No test here waits for anything.

What lives in the processes themselves (signals reaching a tree, forks, executors honouring a
cancel or a pause) is tested with real ones in tests/test_supervisor.py and tests/test_processes.py.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import threading

import pytest

from daemon import models, paths, queues
from daemon.config import Settings
from daemon.engine.dispatching import CLAIMS_PER_TICK
from daemon.models import Task, TaskStatus
from daemon.store import queues as queue_store
from daemon.store import attempts, tasks
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor
from tests.conftest import wait_for
from tests.fake_processes import FakeProcesses

EXECUTORS = {
    "ECHO": "tests.sample_executors:Echo",
    "COUNT": "tests.sample_executors:Counter",  # pausable
    "UNTIL_CANCELLED": "tests.async_executors:UntilCancelled",  # runs in an event-loop process
}
T = TypeVar("T")


class Stepped:
    """A supervisor on fake processes, and the clock its ticks read."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.now = 0.0
        self.fakes = FakeProcesses()
        self.sup = Supervisor(
            Settings(database=tmp_path / "fredica.db", socket=tmp_path / "control.sock", log_dir=tmp_path / "logs",
                     executors=EXECUTORS, **options),
            clock=lambda: self.now, start_process=self.fakes,
        )
        self.sup.bind_loop_thread()  # this test's thread is the loop's: requests from others queue

    def request(self, now: float, call: Callable[[], T]) -> T:
        """Make a request from another thread, as the control socket does, and tick at `now` to
        take it: it runs in that tick's first transaction, its commands to the processes follow
        that commit (as in the daemon)."""
        self.now = now
        answer: list[Any] = []

        def client() -> None:
            try:
                answer.append(call())
            except BaseException as exc:
                answer.append(exc)

        thread = threading.Thread(target=client)
        thread.start()
        wait_for(self.sup._handoff.pending, timeout=5)  # queued for the loop
        self.sup.tick(now)
        thread.join(5)
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def at(self, now: float) -> float:
        """One tick at `now`; how long the loop would then sleep."""
        self.now = now
        return self.sup.tick(now)

    def submit(self, task_type: str, **fields: Any) -> str:
        return self.sup.submit([parse_spec({"type": task_type, **fields})]).tasks[0].id

    def task(self, task_id: str) -> Task:
        return tasks.get(self.sup.conn, task_id)

    def process(self, task_id: str) -> Any:
        return self.fakes.running(task_id)

    def close(self) -> None:
        self.sup.idle.dismiss_all()
        for loops in self.sup.loops.values():
            loops.dismiss_all()
        self.fakes.close_all()
        self.sup.conn.close()


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[Callable[..., Stepped]]:
    made: list[Stepped] = []

    def make(**options: Any) -> Stepped:
        made.append(Stepped(tmp_path / f"s{len(made)}", **options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_a_retry_waits_its_backoff_doubling_up_to_the_cap(stepped: Callable[..., Stepped]) -> None:
    s = stepped(backoff_base=1.0, backoff_max=3.0, max_workers=1)
    task_id = s.submit("ECHO", max_retries=4)
    s.at(0.0)
    failed_at, delays = 0.5, []
    for attempt in range(4):
        s.process(task_id).result(error="boom", error_type=models.EXCEPTION)
        s.at(failed_at)
        row = s.task(task_id)
        assert row.status is TaskStatus.PENDING and row.retry_count == attempt + 1
        delays.append(row.not_before - failed_at)
        # The loop sleeps until the retry is due (nothing else is), and claims it no earlier.
        assert s.at(failed_at + 0.01) == pytest.approx(row.not_before - (failed_at + 0.01))
        s.at(row.not_before - 0.001)
        assert s.task(task_id).status is TaskStatus.PENDING
        s.at(row.not_before)
        assert s.task(task_id).status is TaskStatus.RUNNING
        failed_at = row.not_before + 0.5
    assert delays == pytest.approx([1.0, 2.0, 3.0, 3.0])
    s.process(task_id).result(error="boom", error_type=models.EXCEPTION)
    s.at(failed_at)
    row = s.task(task_id)
    assert row.status is TaskStatus.FAILED and row.retry_count == 4


def test_a_timeout_counts_running_time_only_not_time_paused(stepped: Callable[..., Stepped]) -> None:
    s = stepped(cancel_grace=1.0)
    task_id = s.submit("COUNT", timeout=10)
    s.at(0.0)
    fake = s.process(task_id)
    s.request(2.0, lambda: s.sup.pause(task_id))
    assert fake.told("pause") and s.task(task_id).is_paused
    assert s.at(6.0) == pytest.approx(1.0)  # paused: no timeout to wake for (the poll interval)
    s.request(7.0, lambda: s.sup.resume(task_id))  # paused for 5 s: the timeout falls due at 15, not 10
    assert s.at(10.0) == pytest.approx(1.0) and not fake.told("cancel")
    assert s.at(14.5) == pytest.approx(0.5)
    s.at(14.99)
    assert not fake.told("cancel")
    s.at(15.0)
    assert fake.told("cancel") == [("cancel", s.sup.running[task_id].token, "timeout")]
    fake.result(error="cancelled", error_type=models.CANCELLED)  # honours it
    s.at(15.1)
    row = s.task(task_id)
    assert row.status is TaskStatus.FAILED and row.error_type == models.TIMEOUT


def test_a_cancel_escalates_to_sigterm_then_sigkill_each_a_grace_later(stepped: Callable[..., Stepped]) -> None:
    s = stepped(cancel_grace=2.0)
    s.fakes.on_sigterm = "ignore"
    task_id = s.submit("ECHO")
    s.at(0.0)
    fake = s.process(task_id)
    assert s.request(1.0, lambda: s.sup.cancel(task_id)).stopping == (task_id,)
    token = s.sup.running[task_id].token
    assert fake.commands[-1] == ("cancel", token, "cancel")
    assert s.at(2.5) == pytest.approx(0.5)  # wakes for the SIGTERM
    s.at(2.99)
    assert not fake.told("SIGTERM")
    s.at(3.0)
    assert fake.commands[-1] == ("SIGTERM", "attempt")  # ignored
    s.at(4.99)
    assert not fake.told("SIGKILL")
    s.at(5.0)
    assert fake.commands[-1] == ("SIGKILL", "attempt")
    s.at(5.01)  # the launcher reported its fork killed
    row = s.task(task_id)
    assert row.status is TaskStatus.CANCELLED
    assert [c[0] for c in fake.commands] == ["assign", "cancel", "SIGTERM", "SIGKILL"]
    assert fake.is_alive()  # the launcher is not in its fork's tree: it takes the next task
    next_id = s.submit("ECHO")
    s.at(5.02)
    assert s.process(next_id) is fake


def test_an_attempt_that_stops_at_sigterm_ends_with_no_sigkill(stepped: Callable[..., Stepped]) -> None:
    s = stepped(cancel_grace=2.0)
    task_id = s.submit("ECHO")
    s.at(0.0)
    fake = s.process(task_id)
    s.request(0.0, lambda: s.sup.cancel(task_id))
    s.at(2.0)  # SIGTERM: it dies of it
    s.at(2.01)
    assert s.task(task_id).status is TaskStatus.CANCELLED
    s.at(10.0)
    assert [c[0] for c in fake.commands] == ["assign", "cancel", "SIGTERM"]


def test_a_process_lingering_after_its_last_result_is_killed_after_the_grace(
    stepped: Callable[..., Stepped]
) -> None:
    s = stepped(tasks_per_process=2, max_workers=1, cancel_grace=2.0)
    first = s.submit("ECHO")
    s.at(0.0)
    fake = s.process(first)
    fake.result({"n": 1})
    s.at(0.5)  # it takes another: over at its result
    assert s.task(first).status is TaskStatus.COMPLETED
    second = s.submit("ECHO")
    s.at(0.6)
    assert s.process(second) is fake and fake.sent[-1].last  # its last attempt
    fake.lingers = True
    fake.result({"n": 2})
    s.at(1.0)
    assert s.task(second).status is TaskStatus.RUNNING  # reported; its exit not yet seen
    assert s.at(2.5) == pytest.approx(0.5)  # wakes at the grace's end
    s.at(2.99)
    assert not fake.told("SIGKILL")
    s.at(3.0)
    assert fake.commands[-1] == ("SIGKILL", "attempt")
    s.at(3.01)
    row = s.task(second)
    assert row.status is TaskStatus.COMPLETED and row.result == {"n": 2}  # its result stands


def test_at_shutdown_running_tasks_get_the_grace_then_are_put_back(stepped: Callable[..., Stepped]) -> None:
    s = stepped(shutdown_grace=5.0, cancel_grace=1.0, max_workers=2)
    quick, slow = s.submit("ECHO"), s.submit("ECHO")
    s.at(0.0)
    s.sup.request_stop()
    waiting = s.submit("ECHO")
    s.at(1.0)  # the deadline: 6.0
    s.process(quick).result({"done": True})
    s.at(2.0)
    assert s.task(quick).status is TaskStatus.COMPLETED
    assert s.task(waiting).status is TaskStatus.PENDING  # nothing is claimed once stopping
    assert not s.process(slow).told("cancel")
    assert s.at(3.0) == pytest.approx(1.0)  # the poll interval, then the deadline
    s.at(5.99)
    assert not s.process(slow).told("cancel")
    s.at(6.0)
    assert s.process(slow).told("cancel") == [("cancel", s.sup.running[slow].token, "shutdown")]
    s.at(7.0)  # ignored past cancel_grace: SIGTERM, which ends it
    assert s.process(slow).told("SIGTERM")
    s.at(7.01)
    row = s.task(slow)
    assert row.status is TaskStatus.PENDING and row.retry_count == 0  # interrupted: costs no attempt
    assert not s.sup.running and s.task(waiting).status is TaskStatus.PENDING


def test_pause_and_resume_round_trip(stepped: Callable[..., Stepped]) -> None:
    s = stepped()
    task_id = s.submit("COUNT")
    s.at(0.0)
    fake = s.process(task_id)
    token = s.sup.running[task_id].token
    s.request(1.0, lambda: s.sup.pause(task_id))
    assert fake.commands[-1] == ("pause", token) and s.task(task_id).is_paused
    s.request(2.0, lambda: s.sup.resume(task_id))
    assert fake.commands[-1] == ("resume", token) and not s.task(task_id).is_paused
    fake.send({"type": "pause_request", "reason": "waiting for a disk"})  # its own pause
    s.at(3.0)
    assert s.task(task_id).is_paused
    fake.send({"type": "resume_request"})
    fake.progress(40, "counting")
    s.at(4.0)
    row = s.task(task_id)
    assert not row.is_paused and row.progress == 40 and row.status_text == "counting"
    fake.result({"n": 3})
    s.at(5.0)
    assert s.task(task_id).status is TaskStatus.COMPLETED


def test_an_event_loop_whose_heartbeat_stops_is_killed_and_its_attempts_crash(
    stepped: Callable[..., Stepped]
) -> None:
    s = stepped(max_workers=2)
    s.sup.loops["default"].block_limit = 3.0
    first, second = s.submit("UNTIL_CANCELLED"), s.submit("UNTIL_CANCELLED")
    s.at(0.0)
    fake = s.process(first)
    assert s.process(second) is fake and fake.kind == "event_loop"
    for now in (1.0, 2.0, 4.0, 6.0):
        fake.heartbeat()
        s.at(now)
    assert fake.is_alive() and s.task(first).status is TaskStatus.RUNNING
    assert s.at(8.0) == pytest.approx(1.0)  # the poll interval; the watch is due at 9.0
    s.at(9.0)
    assert fake.is_alive()  # 3 s without a beat: not more than the limit
    s.at(9.01)
    assert fake.commands[-1] == ("SIGKILL", "process")
    s.at(9.02)
    for task_id in (first, second):
        row = s.task(task_id)
        assert row.status is TaskStatus.FAILED and row.error_type == models.CRASHED
    third = s.submit("UNTIL_CANCELLED")
    s.at(9.03)
    assert s.process(third) is not fake  # a new process serves


def an_async_attempt(s: Stepped) -> tuple[str, Any]:
    """An UNTIL_CANCELLED task running (from t=2) in a fake event-loop process: its id and the process."""
    s.at(1.0)
    task_id = s.submit("UNTIL_CANCELLED")
    s.at(2.0)
    return task_id, s.process(task_id)


# --- regressions found in review: a rolled-back tick leaves memory as if it never ran -----------


def fail_once(monkeypatch: pytest.MonkeyPatch, name: str, store: Any = tasks) -> None:
    """The store's `name` (of the module `store`) meets a full disk once, then works."""
    real = getattr(store, name)
    armed = [True]

    def full_once(*args: Any, **kwargs: Any) -> Any:
        if armed.pop() if armed else False:
            raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, name, full_once)


def test_a_committed_queue_pause_survives_a_rollback_of_the_rest_of_its_tick(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped()
    s.at(1.0)
    s.submit("ECHO")
    s.at(2.0)  # running: the tick stamps heartbeats
    fail_once(monkeypatch, "heartbeat", attempts)
    s.sup._next_heartbeat = 0.0
    # The pause commits in the requests' own transaction; the heartbeat's then fails.
    assert s.request(3.0, lambda: s.sup.set_queue_paused("default", True)) is True
    assert s.sup.fault is not None
    assert s.sup.queues.paused == {"default"} == queue_store.paused(s.sup.conn)


def test_a_request_that_arrives_during_a_tick_waits_for_the_next_requests_transaction(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run in the tick's main transaction, its answer would wait behind that tick's claims and
    # process starts (and be refused with them if they failed).
    s = stepped()
    s.at(1.0)
    task_id = s.submit("ECHO")
    answer: list[Any] = []
    caller = threading.Thread(target=lambda: answer.append(s.sup.cancel(task_id)))
    caller.start()
    wait_for(s.sup._handoff.pending, timeout=5)
    real_pending, looks = s.sup._handoff.pending, [0]

    def pending() -> int:  # the cancel arrives just after the tick's first look
        looks[0] += 1
        return 0 if looks[0] == 1 else real_pending()

    monkeypatch.setattr(s.sup._handoff, "pending", pending)
    commits = s.sup.commits()
    s.sup.tick(2.0)
    assert s.sup.commits() == commits + 1 and real_pending() == 1 and not answer  # not part of it
    s.sup.tick(3.0)  # the requests' own transaction first, then the tick's
    caller.join(5)
    # Started by the tick it arrived in, it is asked to stop now.
    assert s.sup.commits() == commits + 3 and answer and answer[0].stopping == (task_id,)


def test_an_event_loop_process_whose_channel_breaks_after_every_result_is_ended_and_they_conclude(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(cancel_grace=5.0)
    task_id, fake = an_async_attempt(s)
    fake.heartbeat()
    fake.result({"ok": 1})
    os.write(fake._writers["status"], b"\x00\x00\x00\x05notjs")  # garbled after the result
    timeouts = [s.at(float(t)) for t in range(3, 8)]
    assert not s.sup.running and s.task(task_id).status is TaskStatus.COMPLETED
    assert min(timeouts[1:]) > 0  # no spin


def test_an_idle_event_loop_process_that_died_is_closed_when_the_next_attempt_needs_one(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped()
    first, fake = an_async_attempt(s)
    fake.result({"ok": 1})
    s.at(3.0)
    assert s.task(first).status is TaskStatus.COMPLETED and fake.holding == 0
    fake.process_exit(1)  # dies idle; the next attempt's take() finds it so before any tick does
    second = s.submit("UNTIL_CANCELLED")
    s.at(4.0)
    assert s.process(second) is not fake
    assert list(s.sup.loops["default"]) == [s.process(second)]  # the dead one closed, not kept


def test_a_task_that_cannot_be_sent_to_a_shared_event_loop_process_crashes_alone(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped()
    beside, fake = an_async_attempt(s)
    unsendable = s.submit("UNTIL_CANCELLED")
    real_private_dir = paths.private_dir

    def full(path: Any) -> None:  # the task's log directory cannot be made: the hand-over fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths, "private_dir", full)
    s.at(3.0)
    monkeypatch.setattr(paths, "private_dir", real_private_dir)
    s.at(4.0)
    failed = s.task(unsendable)
    assert failed.status is TaskStatus.FAILED and failed.error_type == models.CRASHED
    assert "could not be sent to its executor process: OSError" in (failed.error or "")
    # The process, and the attempt it holds, go on.
    assert fake.is_alive() and s.task(beside).status is TaskStatus.RUNNING and fake.holding == 1
    fake.result({"ok": 1}, token=s.sup.running[beside].token)
    s.at(5.0)
    assert s.task(beside).status is TaskStatus.COMPLETED


def test_a_paused_task_shows_why_as_its_status_text_and_its_own_text_again_after(
    stepped: Callable[..., Stepped],
) -> None:
    # SPEC §14: a self-paused task shows its reason; a user's pause shows "paused by user".
    s = stepped()
    task_id = s.submit("COUNT")
    s.at(0.0)
    fake = s.process(task_id)
    fake.progress(10, "counting")
    s.at(1.0)
    assert s.task(task_id).status_text == "counting"
    fake.send({"type": "pause_request", "reason": "need a human"})
    fake.progress(11, "still counting")  # another thread's report while paused: the reason stays shown
    s.at(2.0)
    row = s.task(task_id)
    assert row.is_paused and row.status_text == "need a human" and row.progress == 11
    fake.send({"type": "resume_request"})
    s.at(3.0)
    assert s.task(task_id).status_text == "still counting"
    s.request(4.0, lambda: s.sup.pause(task_id))
    s.at(4.1)
    assert s.task(task_id).status_text == "paused by user"
    s.request(5.0, lambda: s.sup.resume(task_id))
    s.at(5.1)
    row = s.task(task_id)
    assert not row.is_paused and row.status_text == "still counting"


def test_at_shutdown_a_task_its_user_paused_is_put_back_held_at_once(stepped: Callable[..., Stepped]) -> None:
    # SPEC §14: a user's pause outlives the restart, as a hold. It cannot finish within the
    # grace, so it is stopped at once. A task that paused itself, or runs, gets the grace, and
    # comes back waiting: its executor asks again if it still must.
    s = stepped(shutdown_grace=5.0, cancel_grace=1.0, max_workers=3)
    by_user, by_itself, going = s.submit("COUNT"), s.submit("COUNT"), s.submit("COUNT")
    s.at(0.0)
    s.request(0.5, lambda: s.sup.pause(by_user))
    s.process(by_itself).send({"type": "pause_request", "reason": "need a human"})
    s.at(0.6)
    s.sup.request_stop()
    s.at(1.0)  # the deadline: 6.0
    assert s.process(by_user).told("cancel") == [("cancel", s.sup.running[by_user].token, "shutdown")]
    assert not s.process(by_itself).told("cancel") and not s.process(going).told("cancel")
    s.process(by_user).result(error="cancelled", error_type=models.CANCELLED)
    s.at(1.1)
    row = s.task(by_user)
    assert (row.status, row.is_held, row.display_status, row.retry_count) == (TaskStatus.PENDING, True, "held", 0)
    s.at(6.0)
    for task_id in (by_itself, going):
        s.process(task_id).result(error="cancelled", error_type=models.CANCELLED)
    s.at(6.1)
    assert [s.task(t).display_status for t in (by_user, by_itself, going)] == ["held", "waiting", "waiting"]


def test_a_burst_of_ready_tasks_is_claimed_a_bounded_number_per_tick_with_no_sleep_between(
    stepped: Callable[..., Stepped],
) -> None:
    # All in one tick, none would start before its commit (seconds for 10,000), and the control
    # socket would wait as long; a bounded tick commits, hands its attempts over, and comes back.
    s = stepped(max_workers=CLAIMS_PER_TICK + 44, tasks_per_process=1_000_000)
    batch = [parse_spec({"type": "ECHO"}) for _ in range(CLAIMS_PER_TICK + 44)]
    s.sup.submit(batch)
    assert s.at(1.0) == 0.0  # more claimable: the next tick at once
    assert len(s.sup.running) == CLAIMS_PER_TICK
    assert s.at(1.0) > 0.0 and len(s.sup.running) == CLAIMS_PER_TICK + 44


def test_the_claim_bound_is_each_queues_so_a_busy_queue_never_holds_another_back(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(max_workers=CLAIMS_PER_TICK * 3, tasks_per_process=1_000_000,
                queues={"b": queues.QueueConfig(name="b", workers=1, types=("COUNT",))})
    s.sup.submit([parse_spec({"type": "ECHO"}) for _ in range(CLAIMS_PER_TICK * 2)])
    other = s.submit("COUNT")
    s.at(1.0)
    assert s.task(other).status is TaskStatus.RUNNING  # in the first tick, beside the backlog's first claims


def test_attempts_that_complete_in_one_tick_are_recorded_together_and_a_refused_result_alone(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped(max_workers=3, max_result_bytes=1000)
    ids = [s.submit("ECHO") for _ in range(3)]
    s.at(0.0)
    together: list[list[str]] = []
    complete_many = tasks.complete_many
    monkeypatch.setattr(tasks, "complete_many", lambda conn, done, **kw: (
        together.append([task.id for task, _ in done]), complete_many(conn, done, **kw))[1])
    s.process(ids[0]).result({"n": 0})
    s.process(ids[1]).result({"n": 1})
    s.process(ids[2]).result("x" * 2000)  # over max_result_bytes: refused, the task failed
    s.at(0.5)
    assert together == [ids[:2]]
    assert [s.task(i).result for i in ids[:2]] == [{"n": 0}, {"n": 1}]
    assert all(s.task(i).status is TaskStatus.COMPLETED for i in ids[:2])
    assert s.task(ids[2]).status is TaskStatus.FAILED and "result" in (s.task(ids[2]).error or "")


def test_completions_recorded_alone_after_a_failed_write_together_keep_their_last_status_text(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped(max_workers=2)
    ids = [s.submit("ECHO") for _ in range(2)]
    s.at(0.0)

    def fails(*args: Any, **kw: Any) -> None:
        raise ValueError("a bug of ours")

    monkeypatch.setattr(tasks, "complete_many", fails)
    for n, task_id in enumerate(ids):
        s.process(task_id).progress(70, f"final text {n}")
        s.process(task_id).result({"n": n})
    s.at(0.5)
    rows = [s.task(i) for i in ids]
    assert [(r.status, r.result, r.status_text) for r in rows] == [
        (TaskStatus.COMPLETED, {"n": n}, f"final text {n}") for n in range(2)
    ]


def test_an_attempt_that_cannot_begin_crashes_alone_and_its_process_is_put_back(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.engine import dispatching

    s = stepped(max_workers=2, tasks_per_process=1_000_000)
    ids = [s.submit("ECHO", max_retries=0) for _ in range(2)]
    real = dispatching.Attempt

    def attempt(**fields: Any) -> Any:
        if fields["task"].id == ids[0]:
            raise RuntimeError("a bug of ours")
        return real(**fields)

    monkeypatch.setattr(dispatching, "Attempt", attempt)
    s.at(0.0)  # the tick goes on: the other task of the claim starts
    crashed, other = s.task(ids[0]), s.task(ids[1])
    assert crashed.status is TaskStatus.FAILED and crashed.error_type == models.CRASHED
    assert other.status is TaskStatus.RUNNING and list(s.sup.running) == [ids[1]]
    assert s.sup.idle._lent == [s.sup.running[ids[1]].process]  # the first one's process is back
    monkeypatch.setattr(dispatching, "Attempt", real)
    s.process(ids[1]).result({"ok": 1})
    s.at(0.5)
    third = s.submit("ECHO")
    s.at(1.0)
    assert s.task(ids[1]).status is TaskStatus.COMPLETED and s.task(third).status is TaskStatus.RUNNING
