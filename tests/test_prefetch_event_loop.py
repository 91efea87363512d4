"""A real event-loop executor process given attempts sent ahead (prefetch, SPEC §15): each waits
behind the attempt it follows, says "started" before anything else, and a revoke takes it back
before that. No supervisor: tests/loop_harness.py drives the process through its pipes."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.loop_harness import LoopProcess, forkserver, start  # noqa: F401 (fixtures)


def test_an_attempt_sent_ahead_starts_when_the_one_it_follows_ends_and_says_so_first(
    start: Callable[..., LoopProcess], tmp_path: Path
) -> None:
    loop = start()
    gate = tmp_path / "go"
    first = loop.assign("UNTIL_FILE", {"path": str(gate)}, task_id="first")
    loop.until(lambda m: m.get("attempt") == first and m["type"] == "progress")
    ahead = loop.assign("SIZED", {"size": 1}, task_id="ahead", after=first)
    beside = loop.assign("SIZED", {"size": 2}, task_id="beside")  # read after the one sent ahead
    loop.result(beside)
    assert loop.of(ahead) == []  # it waits: the one it follows still runs
    gate.touch()
    loop.result(ahead)
    mine = loop.of(ahead)
    assert mine[0] == {"type": "started", "attempt": ahead} and mine[-1]["type"] == "result"
    order = [(m["attempt"], m["type"]) for m in loop.messages if m.get("attempt") in (first, ahead)]
    assert order.index((first, "result")) < order.index((ahead, "started"))


def test_a_revoked_attempt_never_starts_and_the_one_behind_it_takes_its_place(
    start: Callable[..., LoopProcess], tmp_path: Path
) -> None:
    loop = start()
    gate = tmp_path / "go"
    first = loop.assign("UNTIL_FILE", {"path": str(gate)}, task_id="first")
    revoked = loop.assign("SIZED", {"size": 1}, task_id="revoked", after=first)
    second = loop.assign("SIZED", {"size": 1}, task_id="second", after=revoked)
    loop.command("revoke", revoked)
    assert loop.until(lambda m: m.get("attempt") == revoked) == {"type": "revoked", "attempt": revoked}
    gate.touch()
    loop.result(second)  # it followed the revoked one: now the first
    after_end = loop.assign("SIZED", {"size": 3}, task_id="later")
    loop.result(after_end)
    assert loop.of(revoked) == [{"type": "revoked", "attempt": revoked}]  # and nothing more, ever
    loop.command("revoke", second)  # it started: no answer
    probe = loop.assign("SIZED", {"size": 4}, task_id="probe")
    loop.result(probe)
    assert [m["type"] for m in loop.of(second)] == ["started", "result"]
