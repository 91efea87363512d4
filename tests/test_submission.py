"""Submission (SPEC §5): invalid batches are refused whole; valid ones are stored as one run."""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest

from daemon.errors import SubmissionRefused
from daemon.models import RunStatus
from daemon.models import TaskStatus as S
from daemon.store import cancels, runs, task_reads, tasks
from daemon.submission import MAX_PRIORITY, MAX_RETRIES, parse_spec
from tests import store_steps
from tests.conformance import conn, sqlite_only  # noqa: F401 (conn: every test on every backend)

T0 = 2_000.0


def submit(conn: sqlite3.Connection, lines: list[Any], *, now: float = T0, **kwargs: Any) -> tasks.Submission:
    """Parse and submit `lines` the way a batch file is handled."""
    return tasks.submit(conn, [parse_spec(line) for line in lines], now=now, **kwargs)


def row_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {
        table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("task", "workflow_run", "task_dependency")
    }


@pytest.fixture
def stored(conn: sqlite3.Connection) -> dict[str, str]:
    """A database that already holds a task in each of pending, completed, failed and cancelled."""
    ids = {}
    for name in ("pending", "completed", "failed", "cancelled"):
        ids[name] = submit(conn, [{"type": name.upper(), "key": "k"}]).tasks[0].id
    tasks.transition(conn, ids["completed"], S.CLAIMED, now=T0)
    tasks.complete(conn, ids["completed"], {}, now=T0)
    tasks.fail(conn, ids["failed"], error="x", error_type="EXCEPTION", now=T0)
    cancels.cancel(conn, ids["cancelled"], now=T0)
    return ids


VALID = {"type": "OK"}
LATER_ID = "1d6b1d4c-2a1e-4cd0-9c4e-1f1f1f1f1f1f"
SELF_ID = "0b9b4c36-7d55-4a0e-9a53-0f5a3e2f4b11"
# name: (what the error must say, the batch)
REFUSED_BATCHES: dict[str, tuple[str, list[Any]]] = {
    # dependencies
    "unknown dependency id": (
        "unknown dependency 5b1f5a4e",
        [VALID, {"type": "T", "depends_on": ["5b1f5a4e-0000-4000-8000-000000000000"]}],
    ),
    "unknown dependency key": (
        "unknown dependency no-such-key",
        [VALID, {"type": "T", "depends_on": ["no-such-key"]}],
    ),
    "depends_on is a string": ("depends_on must be a list", [{"type": "T", "depends_on": "abc"}]),
    "depends_on is an object": ("depends_on must be a list", [{"type": "T", "depends_on": {"a": 1}}]),
    "depends_on holds a number": ("depends_on must be a list", [{"type": "T", "depends_on": [1]}]),
    "depends_on holds null": ("depends_on must be a list", [{"type": "T", "depends_on": [None]}]),
    "depends_on holds an empty string": ("depends_on must be a list", [{"type": "T", "depends_on": [""]}]),
    "self-dependency by key": ("depends on itself", [VALID, {"type": "T", "key": "me", "depends_on": ["me"]}]),
    "self-dependency by id": ("depends on itself", [{"type": "T", "id": SELF_ID, "depends_on": [SELF_ID]}]),
    "dependency on a later line": (
        "comes later",
        [{"type": "A", "depends_on": ["b"]}, {"type": "B", "key": "b"}],
    ),
    "dependency on a later line by id": (
        "comes later",
        [{"type": "A", "depends_on": [LATER_ID]}, {"type": "B", "id": LATER_ID}],
    ),
    "repeated key": ("repeats the key", [{"type": "A", "key": "a"}, {"type": "B", "key": "a"}]),
    # payload
    "payload is a list": ("must be a JSON object", [{"type": "T", "payload": [1, 2]}]),
    "payload is the text of a list": ("must be a JSON object", [{"type": "T", "payload": "[1, 2]"}]),
    "payload is invalid JSON text": ("not valid JSON", [{"type": "T", "payload": "{not json"}]),
    "payload is a number": ("must be a JSON object", [{"type": "T", "payload": 5}]),
    "payload is null": ("must be a JSON object", [{"type": "T", "payload": None}]),
    "payload holds NaN": ("cannot be stored as JSON", [{"type": "T", "payload": {"x": float("nan")}}]),
    # numbers
    "priority is a bool": ("priority must be an integer", [{"type": "T", "priority": True}]),
    "priority is a float": ("priority must be an integer", [{"type": "T", "priority": 1.5}]),
    "priority is text": ("priority must be an integer", [{"type": "T", "priority": "5"}]),
    "priority too high": ("priority must be between", [{"type": "T", "priority": MAX_PRIORITY + 1}]),
    "priority too low": ("priority must be between", [{"type": "T", "priority": -MAX_PRIORITY - 1}]),
    "max_retries negative": ("max_retries must be between", [{"type": "T", "max_retries": -1}]),
    "max_retries is a bool": ("max_retries must be an integer", [{"type": "T", "max_retries": True}]),
    "max_retries is a float": ("max_retries must be an integer", [{"type": "T", "max_retries": 2.0}]),
    "max_retries too high": ("max_retries must be between", [{"type": "T", "max_retries": MAX_RETRIES + 1}]),
    "timeout is zero": ("timeout must be a positive", [{"type": "T", "timeout": 0}]),
    "timeout is a bool": ("timeout must be a number", [{"type": "T", "timeout": True}]),
    "timeout beyond a float": ("timeout is too large", [{"type": "T", "timeout": 10**400}]),
    # shape
    "unknown field": ("unknown field", [{"type": "T", "prio": 1}]),
    "missing type": ("type must be", [{"payload": {}}]),
    "empty type": ("type must be", [{"type": "  "}]),
    "line is not an object": ("must be a JSON object", [VALID, ["type", "T"]]),
    "empty batch": ("no tasks", []),
    "id is not a UUID": ("id must be a UUID", [{"type": "T", "id": "task-1"}]),
}


@pytest.mark.parametrize("says, lines", REFUSED_BATCHES.values(), ids=REFUSED_BATCHES.keys())
def test_invalid_batch_is_refused_and_nothing_is_stored(
    conn: sqlite3.Connection, stored: dict[str, str], says: str, lines: list[Any]
) -> None:
    before = row_counts(conn)
    with pytest.raises(SubmissionRefused, match=says):
        submit(conn, lines)
    assert row_counts(conn) == before
    assert not conn.in_transaction


def test_bounds_are_accepted(conn: sqlite3.Connection) -> None:
    lines = [
        {"type": "T", "priority": MAX_PRIORITY, "max_retries": MAX_RETRIES},
        {"type": "T", "priority": -MAX_PRIORITY, "max_retries": 0},
    ]
    high, low = (tasks.get(conn, t.id) for t in submit(conn, lines).tasks)
    assert (high.priority, high.max_retries) == (MAX_PRIORITY, MAX_RETRIES)
    assert (low.priority, low.max_retries) == (-MAX_PRIORITY, 0)


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_dependency_on_a_failed_or_cancelled_task_is_stored_and_cancelled_at_once(
    conn: sqlite3.Connection, stored: dict[str, str], status: str
) -> None:
    """SPEC §5: what a script sees must not depend on how fast the upstream task failed."""
    submission = submit(conn, [
        VALID,
        {"type": "T", "key": "doomed", "depends_on": [stored["pending"], stored[status]]},
        {"type": "T", "depends_on": ["doomed"]},
        {"type": "T", "idempotency_key": "k-after", "depends_on": [stored["completed"]]},
    ])
    valid, doomed, downstream, unaffected = (tasks.get(conn, t.id) for t in submission.tasks)
    assert all(t.created for t in submission.tasks)
    assert (doomed.status, doomed.error_type) == (S.CANCELLED, "DEPENDENCY_FAILED")
    assert stored[status] in (doomed.error or "")
    assert (downstream.status, downstream.error_type) == (S.CANCELLED, "DEPENDENCY_FAILED")
    assert valid.status is S.PENDING and unaffected.status is S.PENDING
    run = runs.get(conn, submission.run_id)
    assert (run.total_tasks, run.counts.pending, run.counts.cancelled) == (4, 2, 2)
    assert run.status is RunStatus.RUNNING
    assert run.counts == runs.counts_from_tasks(conn, run.id)


def test_a_batch_of_only_doomed_tasks_is_a_cancelled_run(conn: sqlite3.Connection, stored: dict[str, str]) -> None:
    submission = submit(conn, [{"type": "T", "depends_on": [stored["failed"]]}])
    task = tasks.get(conn, submission.tasks[0].id)
    run = runs.get(conn, submission.run_id)
    assert task.status is S.CANCELLED and task.completed_at == T0
    assert run.status is RunStatus.CANCELLED and run.completed_at == T0


def test_unknown_dependency_is_named_in_the_error(conn: sqlite3.Connection) -> None:
    missing = str(uuid.uuid4())
    with pytest.raises(SubmissionRefused, match=missing):
        submit(conn, [{"type": "T", "depends_on": [missing]}])
    assert row_counts(conn) == {"task": 0, "workflow_run": 0, "task_dependency": 0}


def test_refusal_after_earlier_lines_were_inserted_rolls_them_back(
    conn: sqlite3.Connection, stored: dict[str, str]
) -> None:
    # The third line's explicit id is already taken: only the insert itself can find out, after
    # the first two lines (and the run) were written in the same transaction.
    before = row_counts(conn)
    with pytest.raises(SubmissionRefused, match="already taken"):
        submit(
            conn,
            [
                {"type": "A", "key": "a"},
                {"type": "B", "depends_on": ["a"]},
                {"type": "C", "id": stored["pending"]},
            ],
        )
    assert row_counts(conn) == before
    assert not conn.in_transaction


def test_valid_batch_is_one_adhoc_run(conn: sqlite3.Connection, stored: dict[str, str]) -> None:
    explicit = str(uuid.uuid4())
    lines = [
        {"type": "DOWNLOAD", "key": "dl", "payload": {"url": "http://example.invalid/v"}},
        {"type": "TRANSCODE", "id": explicit, "depends_on": ["dl"], "payload": '{"codec": "h264"}'},
        {
            "type": "UPLOAD",
            "depends_on": [explicit, "dl", stored["completed"]],
            "priority": 3,
            "max_retries": 2,
            "idempotency_key": "upload:1",
            "material_id": "m-1",
            "timeout": 5,
        },
    ]
    before = row_counts(conn)
    sub = submit(conn, lines, now=T0 + 1)

    assert [t.created for t in sub.tasks] == [True, True, True]
    download, transcode, upload = (tasks.get(conn, t.id) for t in sub.tasks)
    assert transcode.id == explicit
    assert row_counts(conn) == {
        "task": before["task"] + 3,
        "workflow_run": before["workflow_run"] + 1,
        "task_dependency": before["task_dependency"] + 4,
    }
    run = runs.get(conn, sub.run_id)
    assert run.template == "adhoc"
    assert run.status is RunStatus.PENDING
    assert run.total_tasks == 3 and run.done_tasks == 0
    assert run.created_at == T0 + 1
    assert {t.workflow_run_id for t in (download, transcode, upload)} == {sub.run_id}
    assert {t.status for t in (download, transcode, upload)} == {S.PENDING}

    assert download.payload == {"url": "http://example.invalid/v"}
    assert transcode.payload == {"codec": "h264"}
    assert transcode.depends_on == (download.id,)
    assert upload.depends_on == (explicit, download.id, stored["completed"])
    assert (upload.priority, upload.max_retries, upload.idempotency_key) == (3, 2, "upload:1")
    assert (upload.material_id, upload.timeout) == ("m-1", 5.0)
    assert download.created_at == T0 + 1

    # Only the download is ready (the stored pending task from the fixture is ready too).
    ready = []
    while (claimed := store_steps.claim_next(conn, T0 + 2)) is not None:
        ready.append(claimed.id)
    assert ready == [stored["pending"], download.id]


def test_template_and_material_are_kept(conn: sqlite3.Connection) -> None:
    lines = [{"type": "A"}, {"type": "B", "material_id": "own"}]
    sub = submit(conn, lines, template="download_and_transcode", material_id="m-9")
    run = runs.get(conn, sub.run_id)
    assert (run.template, run.material_id) == ("download_and_transcode", "m-9")
    first, second = (tasks.get(conn, t.id) for t in sub.tasks)
    assert first.material_id == "m-9"
    assert second.material_id == "own"


def test_single_task_gets_its_own_run(conn: sqlite3.Connection) -> None:
    first = submit(conn, [{"type": "A"}])
    second = submit(conn, [{"type": "A"}])
    assert first.run_id != second.run_id
    for sub in (first, second):
        run = runs.get(conn, sub.run_id)
        assert run.template == "adhoc"
        assert run.total_tasks == 1
        assert [t.id for t in task_reads.list_tasks(conn, run_id=sub.run_id)] == [sub.tasks[0].id]


def test_dependency_on_a_stored_pending_task_waits_for_it(conn: sqlite3.Connection) -> None:
    (upstream,) = submit(conn, [{"type": "A"}]).tasks
    (downstream,) = submit(conn, [{"type": "B", "depends_on": [upstream.id], "priority": 9}]).tasks
    assert store_steps.claim_next(conn, T0).id == upstream.id
    assert store_steps.claim_next(conn, T0) is None
    tasks.complete(conn, upstream.id, {}, now=T0)
    assert store_steps.claim_next(conn, T0).id == downstream.id


def test_a_dependency_id_in_capitals_names_the_same_task(conn: sqlite3.Connection) -> None:
    # Ids are stored as lower-case UUIDs, and an id given in capitals is stored lower-cased.
    (upstream,) = submit(conn, [{"type": "A"}]).tasks
    (downstream,) = submit(conn, [{"type": "B", "depends_on": [upstream.id.upper()]}]).tasks
    assert tasks.get(conn, downstream.id).depends_on == (upstream.id,)
    line_id = "0F0E0D0C-0B0A-4908-8706-050403020100"
    first, second = submit(conn, [{"type": "A", "id": line_id}, {"type": "B", "depends_on": [line_id]}]).tasks
    assert tasks.get(conn, second.id).depends_on == (first.id,) == (line_id.lower(),)


def test_a_dependency_named_by_a_prefix_is_stored_by_its_whole_id(conn: sqlite3.Connection) -> None:
    # SPEC §14: wherever a task id is taken, a unique prefix of 4+ characters will do.
    twins = [f"abcd1234-{n}{n}{n}{n}-4000-8000-000000000000" for n in (1, 2)]
    submit(conn, [{"type": "A", "id": twin} for twin in twins])
    (downstream,) = submit(conn, [{"type": "B", "depends_on": ["abcd1234-2"]}]).tasks
    assert tasks.get(conn, downstream.id).depends_on == (twins[1],)
    (single,) = submit(conn, [{"type": "A"}]).tasks
    (again,) = submit(conn, [{"type": "B", "depends_on": [single.id[:6], single.id]}]).tasks
    assert tasks.get(conn, again.id).depends_on == (single.id,)  # one dependency, however named
    before = row_counts(conn)
    with pytest.raises(SubmissionRefused) as ambiguous:
        submit(conn, [{"type": "B", "depends_on": ["abcd1234"]}])
    assert ambiguous.value.message.startswith("dependency id abcd1234 is ambiguous: it matches task ")
    with pytest.raises(SubmissionRefused, match="^unknown dependency abc: no task or earlier line"):
        submit(conn, [{"type": "B", "depends_on": ["abc"]}])
    assert row_counts(conn) == before


def test_repeated_dependency_is_stored_once(conn: sqlite3.Connection) -> None:
    a, b = submit(conn, [{"type": "A", "key": "a"}, {"type": "B", "depends_on": ["a", "a"]}]).tasks
    assert tasks.get(conn, b.id).depends_on == (a.id,)
    assert store_steps.claim_next(conn, T0).id == a.id
    tasks.complete(conn, a.id, {}, now=T0)
    assert store_steps.claim_next(conn, T0).id == b.id


def test_same_dependency_by_key_and_by_id_is_one_dependency(conn: sqlite3.Connection) -> None:
    # Two references to one task are one dependency: counted twice, it would never be met.
    explicit = str(uuid.uuid4())
    lines = [{"type": "A", "key": "a", "id": explicit}, {"type": "B", "depends_on": ["a", explicit]}]
    a, b = submit(conn, lines).tasks
    assert store_steps.claim_next(conn, T0).id == a.id
    tasks.complete(conn, a.id, {}, now=T0)
    claimed = store_steps.claim_next(conn, T0)
    assert claimed is not None and claimed.id == b.id
    assert tasks.get(conn, b.id).depends_on == (a.id,)


@sqlite_only  # SQLite's query plan and statement trace
def test_one_task_submission_is_one_statement_per_row_it_writes(conn: sqlite3.Connection) -> None:
    """The run is inserted with its counters and status already right (all its tasks pending), so
    nothing reads it back or updates it: the run, the task and its one dependency edge."""
    upstream = submit(conn, [{"type": "PROBE"}]).tasks[0].id
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        sub = submit(conn, [{"type": "TRANSCODE", "depends_on": [upstream]}], now=T0 + 1)
    finally:
        conn.set_trace_callback(None)

    writes = [" ".join(s.split()[:3]) for s in statements if s.split()[0] in ("INSERT", "UPDATE", "DELETE")]
    assert writes == ["INSERT INTO workflow_run", "INSERT INTO task", "INSERT OR IGNORE"]
    assert not any(s.startswith("SELECT * FROM workflow_run") for s in statements)
    run = runs.get(conn, sub.run_id)
    assert (run.status, run.total_tasks, run.counts.pending) == (RunStatus.PENDING, 1, 1)
    assert run.counts == runs.counts_from_tasks(conn, sub.run_id)
