"""Process start times that a step of the wall clock does not move (daemon.processes)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from daemon import processes
from daemon.store import db


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture(autouse=True)
def keep_the_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests move this process's anchored boot time: the tests after them must not see it.
    monkeypatch.setattr(processes, "_boot_time", processes._boot_time)


def test_a_process_is_still_recognised_after_the_clock_steps(tmp_path: Path, sleeper, monkeypatch) -> None:
    conn = db.open_database(tmp_path / "fredica.db")
    processes.anchor_to(conn)
    recorded = processes.start_time(sleeper.pid)
    assert recorded == pytest.approx(psutil.Process(sleeper.pid).create_time(), abs=0.011)
    real = psutil.boot_time()
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real + 7.0)  # type: ignore[attr-defined]
    # psutil's own create_time has moved with the clock; ours has not.
    assert psutil.Process(sleeper.pid).create_time() == pytest.approx(recorded + 7.0, abs=0.011)
    assert processes.start_time(sleeper.pid) == recorded
    found = processes.find_leftover(sleeper.pid, recorded)
    assert found is not None and found.pid == sleeper.pid
    # A daemon started after the step counts from the boot time its database kept for this boot.
    assert processes.anchor_to(db.open_database(tmp_path / "fredica.db")) == pytest.approx(real)
    assert processes.find_leftover(sleeper.pid, recorded) is not None
    assert processes.find_leftover(sleeper.pid, recorded - 1.0) is None  # not a pid reused later


def test_each_boot_has_a_boot_time_of_its_own(tmp_path: Path, monkeypatch) -> None:
    conn = db.open_database(tmp_path / "fredica.db")
    first = processes.anchor_to(conn)
    monkeypatch.setattr(processes, "boot_id", lambda: "another-boot")
    real = psutil.boot_time()
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real + 3600.0)  # type: ignore[attr-defined]
    assert processes.anchor_to(conn) == pytest.approx(first + 3600.0)
    assert conn.execute("SELECT count(*) FROM boot").fetchone()[0] == 2
