"""Ids by unique prefix (SPEC §14), on a real SQLite file: the store's one resolution function,
and the status and type filters that take the words people see."""

from __future__ import annotations

import sqlite3

import pytest

from daemon.errors import AmbiguousId, IdTooShort, UnknownRun, UnknownTask
from daemon.models import TaskStatus as S
from daemon.store import attempts, ids, task_reads, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn, sqlite_only  # noqa: F401 (conn: every test on every backend)

T0 = 1_000.0


def submit(conn: sqlite3.Connection, *task_ids: str, task_type: str = "SHELL") -> str:
    """One run holding tasks with these ids; its run id."""
    return tasks.submit(conn, [TaskSpec(type=task_type, id=task_id) for task_id in task_ids], now=T0).run_id


def test_a_unique_prefix_names_its_task_and_its_run(conn: sqlite3.Connection) -> None:
    run_id = submit(conn, "3c1d6ff8-aaaa", "77aa0000-bbbb")
    assert ids.resolve(conn, "3c1d") == ids.Resolved("task", "3c1d6ff8-aaaa")
    assert ids.resolve(conn, "3c1d6ff8") == ids.Resolved("task", "3c1d6ff8-aaaa")
    assert ids.resolve(conn, "3c1d6ff8-aaaa") == ids.Resolved("task", "3c1d6ff8-aaaa")
    assert ids.task_id(conn, "77aa0") == "77aa0000-bbbb"
    # Run ids are uuid4s: the tasks above cannot share their first 8 characters.
    assert ids.resolve(conn, run_id[:8]) == ids.Resolved("run", run_id)
    assert ids.run_id(conn, run_id[:4]) == run_id


def test_an_ambiguous_prefix_lists_its_candidates_with_type_and_status(conn: sqlite3.Connection) -> None:
    submit(conn, "abcd-1", "abcd-2", "abce-3")
    tasks.transition(conn, "abcd-2", S.CANCELLED, now=T0 + 1)
    with pytest.raises(AmbiguousId) as caught:
        ids.resolve(conn, "abcd")
    assert caught.value.message == "id abcd is ambiguous: it matches task abcd-1 (pending), task abcd-2 (cancelled)"
    assert ids.resolve(conn, "abce") == ids.Resolved("task", "abce-3")  # the range stops at abcd's end


def test_an_ambiguous_prefix_lists_ten_and_says_there_are_more(conn: sqlite3.Connection) -> None:
    submit(conn, *(f"same-{n:02}" for n in range(12)))
    with pytest.raises(AmbiguousId) as caught:
        ids.resolve(conn, "same")
    message = caught.value.message
    assert message.count("task same-") == 10 and "same-09" in message and "same-10" not in message
    assert message.endswith(" and 1+ more")
    assert "\n" not in message


def test_a_whole_id_wins_over_longer_ids_that_start_with_it(conn: sqlite3.Connection) -> None:
    submit(conn, "step", "step-2", "a")
    assert ids.resolve(conn, "step") == ids.Resolved("task", "step")
    assert ids.resolve(conn, "a") == ids.Resolved("task", "a")  # short, but whole
    assert ids.resolve(conn, "step-") == ids.Resolved("task", "step-2")


def test_a_prefix_matching_a_task_and_a_run_is_ambiguous(conn: sqlite3.Connection) -> None:
    first_run = submit(conn, "unrelated")
    # A task whose chosen id begins like a run's id.
    submit(conn, first_run[:6] + "-task")
    with pytest.raises(AmbiguousId) as caught:
        ids.resolve(conn, first_run[:6])
    assert f"task {first_run[:6]}-task (pending)" in caught.value.message
    assert f"run {first_run} (pending)" in caught.value.message
    # Where only one kind is taken, the other kind is no candidate.
    assert ids.task_id(conn, first_run[:6]) == first_run[:6] + "-task"
    assert ids.run_id(conn, first_run[:6]) == first_run


def test_under_four_characters_is_refused_unless_it_is_a_whole_id(conn: sqlite3.Connection) -> None:
    submit(conn, "abcdef")
    for given in ("abc", "a", ""):
        with pytest.raises(IdTooShort, match="at least 4 characters"):
            ids.resolve(conn, given)


def test_no_match_says_what_was_looked_for(conn: sqlite3.Connection) -> None:
    submit(conn, "abcdef")
    with pytest.raises(UnknownTask, match="^no task or workflow run has id abcz$"):
        ids.resolve(conn, "abcz")
    with pytest.raises(UnknownTask, match="^no task has id bcde$"):
        ids.task_id(conn, "bcde")  # a prefix is a start, not a part
    with pytest.raises(UnknownRun, match="^no workflow run has id abcd$"):
        ids.run_id(conn, "abcd")


def test_prefixes_at_the_ends_of_text(conn: sqlite3.Connection) -> None:
    top = chr(0x10FFFF)  # no character above it: the range has no upper bound
    below_surrogates, above_surrogates = chr(0xD7FF), chr(0xE000)
    submit(conn, "zzz" + top + top + "x", "zzz" + top + "y",
           "abc" + below_surrogates + "-1", "abc" + above_surrogates + "-2")
    assert ids.task_id(conn, "zzz" + top + top) == "zzz" + top + top + "x"
    with pytest.raises(AmbiguousId):
        ids.task_id(conn, "zzz" + top)
    assert ids.task_id(conn, "abc" + below_surrogates) == "abc" + below_surrogates + "-1"
    assert ids.task_id(conn, "abc" + above_surrogates) == "abc" + above_surrogates + "-2"


@sqlite_only  # SQLite's query plan and statement trace
def test_the_lookup_is_a_range_on_the_id_index(conn: sqlite3.Connection) -> None:
    submit(conn, "abcdef", "abcdeg")
    ran: list[str] = []
    conn.set_trace_callback(ran.append)  # the statements as run, their values filled in
    with pytest.raises(AmbiguousId):
        ids.resolve(conn, "abcd")
    conn.set_trace_callback(None)
    ranges = [sql for sql in ran if ">=" in sql]
    assert len(ranges) == 2 and not any("LIKE" in sql.upper() for sql in ran)
    for sql in ranges:
        plan = " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING" in plan and "INDEX" in plan and "id>? AND id<?" in plan, plan


# --- filters ------------------------------------------------------------------------------------


def test_status_words_people_see_filter_as_shown(conn: sqlite3.Connection) -> None:
    submit(conn, "pend", "claim", "run", "pause", "done")
    for task_id, steps in {"claim": [S.CLAIMED], "run": [S.CLAIMED, S.RUNNING],
                           "pause": [S.CLAIMED, S.RUNNING], "done": [S.CLAIMED, S.RUNNING, S.COMPLETED]}.items():
        for step in steps:
            tasks.transition(conn, task_id, step, now=T0 + 1)
    assert attempts.set_paused(conn, "pause", True)

    def listed(status: str | list[str]) -> list[str]:
        return [task.id for task in task_reads.list_tasks(conn, status=status)]

    assert listed("waiting") == ["pend", "claim"]
    assert listed("paused") == ["pause"]
    assert listed("running") == ["run", "pause"]  # the stored status: paused tasks run too
    assert listed(["paused", "completed"]) == ["pause", "done"]
    assert listed(["waiting", "pending"]) == ["pend", "claim"]
    assert listed("held") == []  # no task can be held yet (the daemon refuses the word)


def test_type_filter_ignores_case(conn: sqlite3.Connection) -> None:
    submit(conn, "one", task_type="SHELL")
    submit(conn, "two", task_type="Download")
    assert [t.id for t in task_reads.list_tasks(conn, task_type="shell")] == ["one"]
    assert [t.id for t in task_reads.list_tasks(conn, task_type="DOWNLOAD")] == ["two"]
    assert task_reads.list_tasks(conn, task_type="transcode") == []
