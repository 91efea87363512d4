"""Round trips on PostgreSQL (daemon/store/postgres/connection.py): the statements whose answer
nobody reads (BEGIN, SAVEPOINT, RELEASE, a NOTIFY, a run's status) go with the next statement that
is sent, in one pipeline, and what a caller sees is what it saw when each went alone: the same
rows, the same errors from the same calls, the same savepoints undone.

A round trip is most of what a statement costs on these machines, so these tests count them: a
pipeline is one, a statement sent alone is one."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Iterator

import pytest

from daemon import pipes
from daemon.store import db, tasks
from daemon.store.postgres import connection as postgres, wakeups
from daemon.submission import TaskSpec
from tests.conformance import conn, postgres_only  # noqa: F401 (conn: on the `database` of each test)

T0 = 5_000.0


class RoundTrips:
    """Counts what a connection sends to its server: each pipeline once, each statement sent alone
    once; and every statement, in the order sent."""

    def __init__(self, conn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.sent: list[str] = []
        raw = conn.raw
        real_execute, real_pipeline = raw.execute, raw.pipeline
        depth = [0]

        def execute(sql: str, *args: Any, **kwargs: Any) -> Any:
            self.sent.append(" ".join(str(sql).split()))
            self.count += depth[0] == 0
            return real_execute(sql, *args, **kwargs)

        @contextlib.contextmanager
        def pipeline() -> Iterator[Any]:
            self.count += depth[0] == 0
            depth[0] += 1
            try:
                with real_pipeline() as made:
                    yield made
            finally:
                depth[0] -= 1

        monkeypatch.setattr(raw, "execute", execute)
        monkeypatch.setattr(raw, "pipeline", pipeline)

    def reset(self) -> None:
        self.count = 0
        self.sent.clear()


@pytest.fixture
def trips(conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch) -> RoundTrips:
    conn.execute("CREATE TABLE IF NOT EXISTS scratch (a INTEGER PRIMARY KEY, b TEXT)")
    conn.execute("DELETE FROM scratch")  # the module shares one database
    return RoundTrips(conn, monkeypatch)


def scratch(database: str) -> dict[int, str]:
    """The scratch table as another session sees it: what was committed."""
    with contextlib.closing(postgres.connect(database)) as other:
        return {row[0]: row[1] for row in other.execute("SELECT a, b FROM scratch ORDER BY a").fetchall()}


@postgres_only
def test_bookkeeping_goes_with_the_next_statement(conn: sqlite3.Connection, trips: RoundTrips, database: str) -> None:
    with db.write(conn):
        with db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (1, 'x')")  # with BEGIN and SAVEPOINT
        conn.execute("UPDATE scratch SET b = 'y' WHERE a = 1")  # with RELEASE
    assert trips.count == 3  # and the COMMIT; six alone
    assert trips.sent[:3] == ["BEGIN", "SAVEPOINT undo_on_error", "INSERT INTO scratch VALUES (1, 'x')"]
    assert scratch(database) == {1: "y"}


@postgres_only
def test_a_transaction_that_sent_nothing_ends_without_a_word(conn: sqlite3.Connection, trips: RoundTrips) -> None:
    with db.write(conn):
        assert conn.in_transaction
        with db.savepoint(conn):
            pass
    assert not conn.in_transaction
    with pytest.raises(RuntimeError), db.write(conn):
        raise RuntimeError("the request was refused before it wrote")
    assert not conn.in_transaction
    assert trips.count == 0
    assert conn.execute("SELECT count(*) FROM scratch").fetchone()[0] == 0  # the session is as it was


@postgres_only
def test_an_error_is_raised_by_the_statement_that_carried_the_held_ones(
    conn: sqlite3.Connection, trips: RoundTrips, database: str
) -> None:
    conn.execute("INSERT INTO scratch VALUES (1, 'first')")
    with db.write(conn):
        conn.execute("INSERT INTO scratch VALUES (2, 'kept')")
        with pytest.raises(sqlite3.IntegrityError), db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (1, 'again')")  # sent with its SAVEPOINT
        # Its savepoint was rolled back to, and the transaction goes on.
        conn.execute("INSERT INTO scratch VALUES (3, 'after')")
    assert scratch(database) == {1: "first", 2: "kept", 3: "after"}


@postgres_only
def test_a_savepoint_nothing_followed_is_rolled_back_to_without_a_word(
    conn: sqlite3.Connection, trips: RoundTrips, database: str
) -> None:
    with db.write(conn):
        conn.execute("INSERT INTO scratch VALUES (1, 'x')")
        trips.reset()
        with pytest.raises(RuntimeError), db.savepoint(conn):
            raise RuntimeError("refused before it wrote")
        assert trips.count == 0 and trips.sent == []
        with pytest.raises(RuntimeError), db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (2, 'undone')")
            raise RuntimeError("refused after it wrote")
        assert "ROLLBACK TO undo_on_error" in trips.sent  # this one had something to undo
    assert scratch(database) == {1: "x"}


@postgres_only
def test_a_notify_alone_in_its_transaction_is_sent_with_the_commit(
    conn: sqlite3.Connection, trips: RoundTrips, database: str
) -> None:
    with wakeups.Listener(database) as listener:
        assert listener.healthy
        with db.write(conn):
            wakeups.notify(conn)
        assert trips.count == 1  # BEGIN, the NOTIFY and the COMMIT together
        assert pipes.ready([listener], 10.0) == [listener], "the wake-up was dropped with the empty transaction"
        assert listener.drain() == 1


@postgres_only
def test_a_tasks_submit_start_and_ending_in_round_trips(conn: sqlite3.Connection, trips: RoundTrips) -> None:
    """What one task costs the supervisor on PostgreSQL, each step a transaction of its own as in
    a daemon that runs one task at a time (W2): counted, so that a change that adds round trips
    to the hot path is seen: 5, 9 and 8 before statements were held back."""
    with db.write(conn):
        [submitted_task] = tasks.submit(conn, [TaskSpec(type="ECHO")], now=T0).tasks
    task_id = submitted_task.id
    submitted = trips.count
    with db.write(conn):
        [claimed] = tasks.claim_ready(conn, T0, 2, promote_delayed=False, supervisor="alpha")
        with db.savepoint(conn):
            started = tasks.start(conn, task_id, now=T0, executor_pid=1, known=claimed)
    begun = trips.count - submitted
    with db.write(conn):
        with db.savepoint(conn):
            tasks.complete(conn, task_id, {"ok": True}, now=T0 + 1, known=started)
    ended = trips.count - submitted - begun
    assert (submitted, begun, ended) == (2, 5, 3)
    assert tasks.get(conn, task_id).status.value == "completed"


@postgres_only
@pytest.mark.parametrize("held, undone_by", [
    ("SAVEPOINT savepointx", "x"),  # once read as the savepoint "x" (the keyword taken from its name)
    ('SAVEPOINT "B"', '"A"'),  # once read as "" like every quoted name
])
def test_a_rollback_to_another_savepoint_is_never_taken_for_a_no_op(
    conn: sqlite3.Connection, trips: RoundTrips, database: str, held: str, undone_by: str
) -> None:
    with db.write(conn):
        conn.execute(f"SAVEPOINT {undone_by}")
        conn.execute("INSERT INTO scratch VALUES (1, 'undone')")
        conn.execute(held)  # held back: nothing follows it
        conn.execute(f"ROLLBACK TO {undone_by}")  # not "right after its SAVEPOINT": sent
        conn.execute(f"RELEASE {undone_by}")
    assert scratch(database) == {}


def test_the_savepoint_a_statement_names_is_read_as_the_server_reads_it() -> None:
    assert postgres._kind("SAVEPOINT undo_on_error") == (postgres.SAVEPOINT, "undo_on_error")
    assert postgres._kind("RELEASE SAVEPOINT Undo_On_Error") == (postgres.RELEASE, "undo_on_error")
    assert postgres._kind("ROLLBACK TO undo_on_error") == (postgres.ROLLBACK_TO, "undo_on_error")
    assert postgres._kind("ROLLBACK TO savepoint") == (postgres.ROLLBACK_TO, "savepoint")
    assert postgres._kind("SAVEPOINT savepoint1") == (postgres.SAVEPOINT, "savepoint1")
    assert postgres._kind('RELEASE "A"') == (postgres.RELEASE, "A")
    assert postgres._kind("ROLLBACK TRANSACTION") == (postgres.ROLLBACK, "")


@postgres_only
def test_a_held_statements_failure_rolls_the_whole_transaction_back(
    conn: sqlite3.Connection, trips: RoundTrips, database: str
) -> None:
    """Found in review: the failure of a statement held back by a block that has ended came out of
    the next block's first statement, whose savepoint then never existed; its ROLLBACK TO undid
    the earlier block instead, and the transaction committed without it, with no error to it."""
    with pytest.raises(sqlite3.Error, match="division by zero.*can only be rolled back"), db.write(conn):
        with db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (1, 'A')")
            conn.execute_later("SELECT 1/0")  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.Error), db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (2, 'B')")
        conn.execute("INSERT INTO scratch VALUES (3, 'C')")  # refused too: the transaction is doomed
    assert scratch(database) == {}
    assert not conn.in_transaction
    with db.write(conn):  # the connection goes on
        conn.execute("INSERT INTO scratch VALUES (4, 'D')")
    assert scratch(database) == {4: "D"}


@postgres_only
def test_the_carriers_own_failure_is_still_its_savepoints_to_undo(conn: sqlite3.Connection, database: str) -> None:
    with db.write(conn):
        with db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (1, 'A')")
            conn.execute_later("SELECT 1")  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.IntegrityError), db.savepoint(conn):
            conn.execute("INSERT INTO scratch VALUES (1, 'again')")  # carries the held ones, fails itself
        conn.execute("INSERT INTO scratch VALUES (3, 'C')")
    assert scratch(database) == {1: "A", 3: "C"}


@postgres_only
def test_a_commit_that_rolled_back_is_an_error(conn: sqlite3.Connection, database: str) -> None:
    """PostgreSQL answers the COMMIT of a transaction an error aborted with a ROLLBACK and no error
    (seen by the reviewer): a caller that swallowed that error must not think it committed."""
    with pytest.raises(sqlite3.OperationalError, match="rolled back, not committed"), db.write(conn):
        conn.execute("INSERT INTO scratch VALUES (1, 'A')")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO scratch VALUES (1, 'again')")  # no savepoint: the transaction is aborted
    assert not conn.in_transaction
    assert scratch(database) == {}
