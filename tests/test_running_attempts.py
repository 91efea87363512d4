"""The supervisor's running attempts count themselves per queue as they come and go
(`daemon.engine.running`): the counts the claim and the sleep read must equal a count of the
attempts, through every way the loop changes them."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from daemon.engine.running import RunningAttempts


def attempt(queue: str) -> SimpleNamespace:
    return SimpleNamespace(task=SimpleNamespace(queue=queue))


def counted(running: RunningAttempts) -> dict[str, int]:
    return dict(collections.Counter(rt.task.queue for rt in running.values()))


ops = st.lists(st.tuples(st.sampled_from(["set", "pop", "del", "clear"]), st.sampled_from("abcde"),
                         st.sampled_from(["q1", "q2", "q3"])), max_size=60)


@given(ops)
def test_the_counts_per_queue_follow_every_change(steps: list[tuple[str, str, str]]) -> None:
    running = RunningAttempts()
    for op, task_id, queue in steps:
        if op == "set":
            running[task_id] = attempt(queue)  # a task id seen again replaces its attempt
        elif op == "pop":
            running.pop(task_id, None)
        elif op == "del" and task_id in running:
            del running[task_id]
        elif op == "clear":
            running.clear()
        assert running.by_queue == counted(running)


def test_a_missing_task_pops_its_default_or_raises_and_changes_nothing() -> None:
    running = RunningAttempts()
    running["a"] = attempt("q1")
    assert running.pop("b", None) is None
    with pytest.raises(KeyError):
        running.pop("b")
    assert running.by_queue == {"q1": 1}


@pytest.mark.parametrize("change", [
    lambda r: r.update({"b": attempt("q1")}), lambda r: r.setdefault("b", attempt("q1")), lambda r: r.popitem(),
])
def test_the_changes_the_counts_could_not_follow_are_refused(change) -> None:
    running = RunningAttempts()
    running["a"] = attempt("q1")
    with pytest.raises(TypeError, match="changes only by"):
        change(running)
    assert running.by_queue == {"q1": 1} and list(running) == ["a"]
