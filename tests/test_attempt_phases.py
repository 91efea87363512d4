"""One attempt's phases (daemon.engine.attempt): the table of moves, and each move's guard.

Every pair of phases is tried: the moves `ADVANCES` lists are made, every other one is refused
with ImpossibleMove and changes nothing."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from daemon.engine.attempt import ADVANCES, STOPS, Attempt, ImpossibleMove, Phase
from executors.base import ExecuteResult
from tests.conftest import make_task

T0 = 1_700_000_000.0
GRACE = 5.0


class FakeProcess:
    """The calls an attempt makes on its process, recorded; `takes_another` as the test says."""

    holds_many = False

    def __init__(self, takes_another: bool = True) -> None:
        self.calls: list[str] = []
        self.takes = takes_another

    def takes_another(self, attempt: Attempt) -> bool:
        return self.takes

    def terminate_attempt(self) -> None:
        self.calls.append("terminate")

    def kill_attempt(self) -> None:
        self.calls.append("kill")


def attempt(phase: Phase = Phase.ASSIGNED, **fields: Any) -> Attempt:
    return Attempt(task=make_task("ECHO", timeout=fields.pop("timeout", None)), process=FakeProcess(**fields),  # type: ignore[arg-type]
                   executor=None, started_at=T0, phase=phase)  # type: ignore[arg-type]


@pytest.mark.parametrize("start,to", list(itertools.product(Phase, Phase)), ids=lambda p: p.value)
def test_every_move_the_table_lists_is_made_and_every_other_refused(start: Phase, to: Phase) -> None:
    at = attempt(start)
    if to in ADVANCES[start]:
        at._advance(to, T0 + 1)
        assert at.phase is to and at.entered[to] == T0 + 1
    else:
        with pytest.raises(ImpossibleMove):
            at._advance(to, T0 + 1)
        assert at.phase is start and set(at.entered) == {start}


def test_the_table_leads_every_phase_to_ended_and_ended_nowhere() -> None:
    assert ADVANCES[Phase.ENDED] == frozenset()
    for phase in Phase:
        seen, frontier = {phase}, [phase]
        while frontier:
            for nxt in ADVANCES[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert Phase.ENDED in seen, phase


def test_a_stop_escalates_to_sigterm_then_sigkill_a_grace_apart_and_keeps_its_reason() -> None:
    at = attempt(Phase.RUNNING)
    assert at.request_stop("cancel", T0)
    assert not at.request_stop("timeout", T0 + 1)  # a stop under way: the first reason stands
    at.escalate(T0 + GRACE - 0.001, GRACE)
    assert at.phase is Phase.STOPPING and at.process.calls == []  # type: ignore[attr-defined]
    at.escalate(T0 + GRACE, GRACE)
    assert at.phase is Phase.TERMINATED and at.process.calls == ["terminate"]  # type: ignore[attr-defined]
    assert at.deadlines(T0 + GRACE, 1.0, GRACE) == [T0 + 2 * GRACE]
    at.escalate(T0 + 2 * GRACE, GRACE)
    assert at.phase is Phase.KILLED and at.process.calls == ["terminate", "kill"]  # type: ignore[attr-defined]
    at.escalate(T0 + 10 * GRACE, GRACE)  # nothing after SIGKILL but the exit
    assert at.process.calls == ["terminate", "kill"] and at.stop_reason == "cancel"  # type: ignore[attr-defined]
    at.exited(-9, T0 + 10 * GRACE)
    assert at.is_over() and at.exitcode == -9 and at.reached(Phase.KILLED)


@pytest.mark.parametrize("phase", [Phase.REPORTED, Phase.EXITED, Phase.ENDED])
def test_a_stop_after_the_outcome_is_known_changes_nothing(phase: Phase) -> None:
    at = attempt(phase)
    assert not at.request_stop("cancel", T0 + 1)
    assert at.phase is phase and at.stop_reason is None


def test_a_result_after_a_stop_ends_the_escalation_and_keeps_the_reason() -> None:
    at = attempt(Phase.RUNNING)
    at.request_stop("timeout", T0)
    at.report(ExecuteResult(error="interrupted"), T0 + 1)
    assert at.phase is Phase.REPORTED and at.stop_reason == "timeout" and not at.stopping
    at.escalate(T0 + 10 * GRACE, GRACE)
    assert at.process.calls == []  # type: ignore[attr-defined]  # its process takes another: nothing to end


def test_a_process_that_lingers_after_its_last_result_is_killed_after_the_grace() -> None:
    at = attempt(Phase.RUNNING, takes_another=False)
    at.report(ExecuteResult(result={}), T0)
    assert not at.is_over() and at.deadlines(T0, 1.0, GRACE) == [T0 + GRACE]
    at.escalate(T0 + GRACE, GRACE)
    assert at.process.calls == ["kill"]  # type: ignore[attr-defined]
    at.exited(-9, T0 + GRACE)
    assert at.is_over() and at.result == ExecuteResult(result={})


def test_a_second_result_is_ignored() -> None:
    at = attempt(Phase.RUNNING)
    at.report(ExecuteResult(result={"first": 1}), T0)
    at.report(ExecuteResult(result={"second": 2}), T0 + 1)
    assert at.result == ExecuteResult(result={"first": 1}) and at.entered[Phase.REPORTED] == T0


def test_a_refused_users_stop_is_undone_whole() -> None:
    at = attempt(Phase.RUNNING)
    at.request_stop("cancel", T0)
    at.undo_stop(Phase.RUNNING, None)
    assert at.phase is Phase.RUNNING and at.stop_reason is None and Phase.STOPPING not in at.entered
    assert at.request_stop("shutdown", T0 + 1) and at.stop_reason == "shutdown"


def test_only_a_running_attempt_counts_down_its_timeout_and_a_pause_stops_the_clock() -> None:
    at = attempt(Phase.RUNNING, timeout=10)
    assert at.deadlines(T0 + 4, 1.0, GRACE) == [T0 + 10]
    at.note_paused(T0 + 4, "user")
    assert at.deadlines(T0 + 6, 1.0, GRACE) == []
    at.note_resumed(T0 + 6)
    assert at.deadlines(T0 + 6, 1.0, GRACE) == [T0 + 12] and at.active_seconds(T0 + 6) == 4


def test_stop_phases_are_the_escalation_only() -> None:
    assert STOPS == (Phase.STOPPING, Phase.TERMINATED, Phase.KILLED)
    with pytest.raises(ValueError):
        attempt(Phase.RUNNING).request_stop("because", T0)
