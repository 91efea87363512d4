"""LISTEN/NOTIFY wake-ups between supervisors (SPEC §16) on the real PostgreSQL server: what a
committed transaction sends reaches a loop waiting on the listener's descriptor, what a rolled-back
one queued does not, one transaction sends one however many tasks it moves, and a listener whose
backend is killed is noticed, reconnects after its backoff and hears again."""

from __future__ import annotations

import sqlite3
from typing import Any, Iterator

import pytest

from daemon import pipes
from daemon.store import db, tasks
from daemon.store.postgres import wakeups
from daemon.submission import TaskSpec
from tests.conformance import conn, postgres_only, sqlite_only  # noqa: F401 (conn: on the `database` of each test)
from tests.conftest import wait_for
from tests.postgres_cluster import Cluster, HeldConnect

T0 = 5_000.0
WAIT = 10.0  # the longest a wake-up may take to arrive; a wait returns as soon as it has


@pytest.fixture
def listener(database: str) -> Iterator[wakeups.Listener]:
    with wakeups.Listener(database) as made:
        assert made.healthy
        yield made


class NotifyCount:
    """Counts the NOTIFYs a connection sends to the server (what each costs at commit)."""

    def __init__(self, conn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent = 0
        raw_execute = conn.raw.execute

        def execute(sql: str, *args: Any, **kwargs: Any) -> Any:
            self.sent += "pg_notify" in sql
            return raw_execute(sql, *args, **kwargs)

        monkeypatch.setattr(conn.raw, "execute", execute)


@pytest.fixture
def count(conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch) -> NotifyCount:
    return NotifyCount(conn, monkeypatch)


def woken(listener: wakeups.Listener) -> int:
    """Wait, as the supervisor's loop does, until the listener's descriptor is readable; then
    how many wake-ups it took."""
    assert pipes.ready([listener], WAIT) == [listener], "no wake-up arrived"
    return listener.drain()


def sentinel(conn: sqlite3.Connection, listener: wakeups.Listener) -> int:
    """A committed wake-up of its own, then all that arrived up to it: what was sent before it
    came first, on the same connection, so it has arrived too."""
    with db.write(conn):
        wakeups.notify(conn)
    return wait_for(lambda: listener.drain(), WAIT)


@postgres_only
def test_a_committed_notify_wakes_a_waiting_loop(conn: sqlite3.Connection, listener: wakeups.Listener) -> None:
    assert listener.drain() == 0
    with db.write(conn):
        tasks.submit(conn, [TaskSpec(type="ECHO")], now=T0)
        wakeups.notify(conn)
    assert woken(listener) == 1
    assert listener.drain() == 0  # taken


@postgres_only
def test_a_rolled_back_notify_sends_nothing(conn: sqlite3.Connection, listener: wakeups.Listener) -> None:
    with pytest.raises(RuntimeError):
        with db.write(conn):
            wakeups.notify(conn)
            raise RuntimeError("the submission failed")
    assert not conn.wakeup_queued  # type: ignore[attr-defined]
    assert sentinel(conn, listener) == 1  # the sentinel alone


@postgres_only
def test_one_notify_per_transaction_however_many_tasks(
    conn: sqlite3.Connection, listener: wakeups.Listener, count: NotifyCount
) -> None:
    with db.write(conn):
        for i in range(1000):
            tasks.submit(conn, [TaskSpec(type="ECHO", payload={"i": i})], now=T0)
            wakeups.notify(conn)
    assert count.sent == 1
    assert woken(listener) == 1
    # The next transaction sends its own.
    with db.write(conn):
        wakeups.notify(conn)
        wakeups.notify(conn)
    assert count.sent == 2
    assert woken(listener) == 1


@postgres_only
def test_a_notify_undone_with_its_savepoint_is_queued_again(
    conn: sqlite3.Connection, listener: wakeups.Listener, count: NotifyCount
) -> None:
    with db.write(conn):
        with pytest.raises(RuntimeError), db.savepoint(conn):
            wakeups.notify(conn)
            raise RuntimeError("one task's step failed")  # the tick goes on without it
        wakeups.notify(conn)  # another task of the same tick finished
    assert count.sent == 2
    assert woken(listener) == 1


@postgres_only
def test_outside_a_transaction_each_notify_is_sent_at_once(conn: sqlite3.Connection, listener: wakeups.Listener) -> None:
    wakeups.notify(conn)
    assert woken(listener) == 1
    wakeups.notify(conn)
    assert woken(listener) == 1


@postgres_only
def test_notify_off_sends_nothing(conn: sqlite3.Connection, listener: wakeups.Listener) -> None:
    conn.notify_wakeups = False  # type: ignore[attr-defined]  # [daemon] notify = false
    with db.write(conn):
        wakeups.notify(conn)
    conn.notify_wakeups = True  # type: ignore[attr-defined]
    assert sentinel(conn, listener) == 1


@sqlite_only
def test_notify_on_sqlite_does_nothing(conn: sqlite3.Connection) -> None:
    with db.write(conn):
        wakeups.notify(conn)  # no statement that SQLite would refuse
    assert not hasattr(conn, "wakeup_queued")


def until_noticed(listener: wakeups.Listener) -> None:
    """Wait as the loop does until the listener has noticed its connection is gone: it wakes on
    the server's goodbye, then on the end of the connection."""

    def noticed() -> bool:
        if pipes.ready([listener], WAIT):
            listener.drain()
        return not listener.healthy

    wait_for(noticed, WAIT)


@postgres_only
def test_a_killed_listener_is_noticed_and_reconnects(
    postgres_cluster: Cluster, conn: sqlite3.Connection, database: str
) -> None:
    clock = [100.0]
    with wakeups.Listener(database, clock=lambda: clock[0], reconnect_first=1.0, reconnect_max=4.0) as listener:
        killed = listener.backend_pid
        postgres_cluster.admin(f"SELECT pg_terminate_backend({killed})")

        until_noticed(listener)
        assert listener.last_error and "closed" in listener.last_error
        with pytest.raises(ValueError):
            listener.fileno()  # the loop polls instead of waiting on it

        assert listener.drain() == 0  # before the backoff has passed: no attempt
        assert not listener.healthy
        clock[0] += 1.0
        assert listener.drain() == 1  # reconnected: one wake-up for what it may have missed
        assert listener.healthy and listener.backend_pid != killed

        with db.write(conn):
            wakeups.notify(conn)
        assert woken(listener) == 1


@postgres_only
def test_a_listener_that_cannot_connect_backs_off(postgres_cluster: Cluster, database: str) -> None:
    url = database
    clock = [0.0]
    name = url.split("?")[0].rsplit("/", 1)[1]
    postgres_cluster.admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    try:
        listener = wakeups.Listener(url, clock=lambda: clock[0], reconnect_first=1.0, reconnect_max=4.0)
        assert not listener.healthy and "not currently accepting connections" in (listener.last_error or "")
        due = []
        for now in (0.5, 1.0, 2.0, 3.0, 4.5, 7.0, 10.0, 11.0):
            clock[0] = now
            assert listener.drain() == 0
            due.append(listener.next_attempt_at)
        # 1 s after the first failure, then 2 s, then 4 s (the cap), and 4 s again.
        assert due == [1.0, 3.0, 3.0, 7.0, 7.0, 11.0, 11.0, 15.0]
    finally:
        postgres_cluster.admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    clock[0] = 14.0
    assert listener.drain() == 0 and not listener.healthy  # not due yet
    clock[0] = 15.0
    assert listener.drain() == 1 and listener.healthy and listener.next_attempt_at is None
    listener.close()


@postgres_only
def test_a_listener_whose_server_does_not_answer_never_holds_up_the_loop(
    postgres_cluster: Cluster, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    clock = [100.0]
    with wakeups.Listener(database, clock=lambda: clock[0], reconnect_first=1.0, reconnect_max=4.0) as listener:
        postgres_cluster.admin(f"SELECT pg_terminate_backend({listener.backend_pid})")
        held = HeldConnect(psycopg.connect)
        monkeypatch.setattr(psycopg, "connect", held)  # after the admin's own connect
        until_noticed(listener)
        clock[0] += 1.0  # the backoff has passed: the reconnect starts, and each look returns
        for _ in range(3):
            assert listener.drain() == 0 and not listener.healthy
            assert listener.next_attempt_at == clock[0] + wakeups.CONNECTING_LOOK  # under way: no backoff
            clock[0] += wakeups.CONNECTING_LOOK
        held.answer.set()

        def reconnected() -> int:
            clock[0] += wakeups.CONNECTING_LOOK  # the loop's next look
            return listener.drain()

        assert wait_for(reconnected, WAIT) == 1 and listener.healthy
        assert held.calls == 1  # one connect, however many looks
        conn = db.open_database(database)
        try:
            with db.write(conn):
                wakeups.notify(conn)
            assert woken(listener) == 1
        finally:
            conn.close()


@postgres_only
def test_a_supervisors_own_wake_ups_do_not_wake_its_own_loop(conn: sqlite3.Connection, database: str) -> None:
    with wakeups.Listener(database, own_name="alpha") as own:
        conn.notify_sender = "alpha"  # type: ignore[attr-defined]  # its loop's connection
        with db.write(conn):
            wakeups.notify(conn)
        assert pipes.ready([own], WAIT) == [own]  # arrived: what drain reads now holds it
        assert own.drain() == 0  # its own: not counted
        conn.notify_sender = "beta"  # type: ignore[attr-defined]  # another supervisor's commit
        with db.write(conn):
            wakeups.notify(conn)
        assert woken(own) == 1
