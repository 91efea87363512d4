"""The executor process's side of a queue's prefetch (SPEC §15, executors/ahead.py): an attempt
sent ahead is started or revoked, never both, and in an event-loop process each waits behind the
attempt it follows (a revoked one's followers take its place)."""

from __future__ import annotations

import threading
from typing import Any

from executors.ahead import AheadAttempts, WaitingBehind
from executors.assignment import Assignment
from tests.conftest import make_task


class Status:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def put(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


def sent(token: str, after: str | None) -> Assignment:
    return Assignment(make_task("ECHO", id=token.split("#")[0]), "m:C", {}, "/dev/null", token,
                      prefetched=True, after=after)


def test_a_reused_process_starts_or_revokes_each_attempt_sent_ahead_never_both() -> None:
    status = Status()
    ahead = AheadAttempts(status)
    ahead.revoke("b#2")
    assert not ahead.start("b#2")  # revoked before its turn: dropped
    assert ahead.start("c#3")
    ahead.revoke("c#3")  # crossed its start: no answer
    ahead.revoke("b#2")  # asked twice: answered once
    assert status.messages == [{"type": "revoked", "attempt": "b#2"}, {"type": "started", "attempt": "c#3"}]


def test_start_and_revoke_from_two_threads_decide_each_attempt_once() -> None:
    for round_ in range(200):
        status = Status()
        ahead = AheadAttempts(status)
        token = f"t{round_}#1"
        go = threading.Barrier(2)
        started: list[bool] = []
        threads = [threading.Thread(target=lambda: (go.wait(), started.append(ahead.start(token)))),
                   threading.Thread(target=lambda: (go.wait(), ahead.revoke(token)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        kinds = [m["type"] for m in status.messages]
        assert kinds == (["started"] if started[0] else ["revoked"])


def test_in_an_event_loop_process_each_waits_behind_the_one_it_follows() -> None:
    behind = WaitingBehind()
    running = {"a#1", "b#2"}
    assert not behind.arrive(sent("c#3", "a#1"), running.__contains__)
    assert not behind.arrive(sent("d#4", "c#3"), running.__contains__)  # behind c, itself waiting
    assert behind.arrive(sent("e#5", "gone#0"), running.__contains__)  # follows one that is over: now
    assert behind.ended("b#2") == []
    assert [a.attempt for a in behind.ended("a#1")] == ["c#3"]
    running.add("c#3")
    assert [a.attempt for a in behind.ended("c#3")] == ["d#4"]


def test_a_revoked_attempts_followers_take_its_place() -> None:
    behind = WaitingBehind()
    running = {"a#1"}
    behind.arrive(sent("c#3", "a#1"), running.__contains__)
    behind.arrive(sent("d#4", "c#3"), running.__contains__)
    assert behind.revoke("c#3", running.__contains__) == (True, [])
    assert [a.attempt for a in behind.ended("a#1")] == ["d#4"]  # d now follows a


def test_an_attempt_revoked_before_it_arrives_is_dropped_and_its_followers_follow_its_place() -> None:
    behind = WaitingBehind()
    running = {"a#1"}
    assert behind.revoke("c#3", running.__contains__) == (True, [])
    assert not behind.arrive(sent("c#3", "a#1"), running.__contains__)  # dropped
    assert not behind.arrive(sent("d#4", "c#3"), running.__contains__)  # waits behind a instead
    assert [a.attempt for a in behind.ended("a#1")] == ["d#4"]
    assert behind.revoke("d#4", running.__contains__) == (False, [])  # started: no answer
