"""`[daemon] keep_finished` (SPEC §14): the loop's hourly pass over finished runs, stepped with
`Supervisor.tick(now)` on fake executor processes (tests/test_supervisor_stepped.py), so that an
hour passes without anyone waiting for it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from daemon import config
from daemon.errors import ConfigError
from daemon.store import tasks
from tests.test_supervisor_stepped import Stepped, fail_once, stepped  # noqa: F401 (the fixture)

DAY = 86400.0
HOUR = 3600.0


def cancelled_task(s: Stepped, now: float) -> str:
    """A one-task run that ends (cancelled) at `now`, with a log file and a rotated one."""
    s.now = now
    task_id = s.submit("ECHO")
    s.request(now, lambda: s.sup.cancel(task_id))
    log = s.sup.settings.task_log(task_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("output\n")
    Path(f"{log}.1").write_text("older output\n")
    return task_id


def test_runs_older_than_keep_finished_go_at_the_next_hourly_pass_with_their_logs(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(keep_finished=DAY)
    s.at(0.0)  # the first pass, at start: nothing to remove
    old = cancelled_task(s, 10.0)
    log = s.sup.settings.task_log(old)

    s.at(DAY + 5.0)  # a pass: the run ended 5 s short of a day ago
    assert tasks.find(s.sup.conn, old) is not None
    assert s.at(DAY + 20.0) <= HOUR - 15.0  # a day old now, but no pass is due: the loop wakes for the next
    assert tasks.find(s.sup.conn, old) is not None and log.exists()

    s.at(DAY + 5.0 + HOUR)  # an hour after the last pass
    assert tasks.find(s.sup.conn, old) is None
    assert not log.exists() and not Path(f"{log}.1").exists()


def test_a_long_pass_takes_one_chunk_per_tick_and_the_loop_does_not_sleep_between(
    stepped: Callable[..., Stepped],
) -> None:
    s = stepped(keep_finished=60.0)
    s.sup.keep_finished.limit = 2
    made = [cancelled_task(s, 1.0) for _ in range(5)]
    left = []
    sleeps = []
    for step in range(3):
        sleeps.append(s.at(2 * HOUR + step))  # the first pass ran at 1.0, before they ended
        left.append(sum(tasks.find(s.sup.conn, task_id) is not None for task_id in made))
    assert left == [3, 1, 0]
    assert sleeps[:2] == [0.0, 0.0] and sleeps[2] > 0


def test_keep_finished_0_keeps_everything(stepped: Callable[..., Stepped]) -> None:
    s = stepped(keep_finished=0.0)
    kept = cancelled_task(s, 1.0)
    s.at(1.0)
    s.at(365 * DAY)
    assert tasks.find(s.sup.conn, kept) is not None


def test_keep_finished_is_read_as_a_duration_and_a_bad_one_refused_at_load() -> None:
    assert config.from_mapping({"daemon": {"keep_finished": "12h"}}).keep_finished == 12 * HOUR
    assert config.from_mapping({"daemon": {"keep_finished": "0"}}).keep_finished == 0
    assert config.from_mapping({}).keep_finished == 30 * DAY
    with pytest.raises(ConfigError, match=r"^\[daemon\] keep_finished must be a duration like .*not '30 days'$"):
        config.from_mapping({"daemon": {"keep_finished": "30 days"}})


def test_a_chunk_rolled_back_with_its_tick_leaves_rows_and_logs_and_is_taken_again(
    stepped: Callable[..., Stepped], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stepped(keep_finished=60.0)
    s.at(0.0)
    old = cancelled_task(s, 1.0)
    log = s.sup.settings.task_log(old)
    # After the chunk, in the same transaction, the tick's last read meets a full disk.
    fail_once(monkeypatch, "next_ready_at")
    s.sup._delayed_possible = True

    s.at(HOUR)
    assert s.sup.fault is not None
    assert tasks.find(s.sup.conn, old) is not None and log.exists()  # rolled back: its log stays

    s.at(HOUR + 60.0)  # past the fault's retry: the same pass, again
    assert s.sup.fault is None
    assert tasks.find(s.sup.conn, old) is None and not log.exists()
