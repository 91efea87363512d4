"""Connections made on a thread of their own (`daemon.store.postgres.connecting`): one connect
at a time, looks that never wait for it past the first short one, and every way it ends
(made, failed, abandoned) leaving the connector ready for the next. Driven by Events: the
"connect" here waits for the test."""

from __future__ import annotations

import threading

import pytest

from daemon.store.postgres.connecting import Connector
from tests.conftest import wait_for


class Scripted:
    """A connect that waits for `go`, then makes a connection (a number) or raises `fails`."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.fails: BaseException | None = None
        self.opened = 0
        self.closed: list[int] = []

    def open(self) -> int:
        assert self.go.wait(30), "a look waited for the connect"
        self.opened += 1
        if self.fails is not None:
            raise self.fails
        return self.opened

    def connector(self) -> Connector[int]:
        return Connector(self.open, self.closed.append, name="test-connect")


def done(connector: Connector[int]) -> int:
    """Look until the connect has ended: its connection (or its error, raised)."""
    made: list[int] = []

    def ended() -> bool:
        found = connector.look()
        if found is not None:
            made.append(found)
        return bool(made)

    wait_for(ended, 30)
    return made[0]


def test_looks_return_while_the_one_connect_is_under_way_then_hand_it_over_once() -> None:
    script = Scripted()
    connector = script.connector()
    assert [connector.look() for _ in range(3)] == [None, None, None] and connector.under_way
    script.go.set()
    assert done(connector) == 1 and not connector.under_way and script.opened == 1
    assert script.closed == []  # the caller's now


@pytest.mark.parametrize("error", [OSError("refused"), RuntimeError("a bug of ours")])
def test_a_failed_connect_is_raised_once_and_the_next_look_starts_another(error: BaseException) -> None:
    script = Scripted()
    connector = script.connector()
    script.fails = error
    assert connector.look() is None  # it waits for `go`: under way
    script.go.set()
    with pytest.raises(type(error)):
        done(connector)
    assert not connector.under_way  # any error, ours too, ends the attempt: none is stuck
    script.fails = None
    assert done(connector) == 2 and script.opened == 2


def test_a_connection_that_comes_after_abandon_is_closed_not_handed_over() -> None:
    script = Scripted()
    connector = script.connector()
    assert connector.look() is None
    connector.abandon()
    assert not connector.under_way
    script.go.set()
    wait_for(lambda: script.closed == [1], 30)
