"""Review of a9bb407 (SPEC §16): what the owner's look at its attempts' rows does while an attempt
cancelled on another host is still stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_daemons import hang, ok, on_postgres, url  # noqa: F401 (fixtures)

SLOW = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}


def test_an_attempt_cancelled_elsewhere_is_told_to_stop_once_while_it_stops(
    on_postgres: Callable[..., Daemon], tmp_path: Path
) -> None:
    # HANG ignores the cancel: it stops only at SIGTERM, cancel_grace (3 s) later; alpha reads
    # its rows every 0.9 s meanwhile.
    alpha = on_postgres("alpha", notify=False, cancel_grace=3, **SLOW).start()
    task_id = alpha.submit("HANG", payload=hang(tmp_path, "h"))
    wait_for((tmp_path / "h.ready").exists, timeout=20)
    beta = on_postgres("beta", notify=False, **SLOW).start()
    ok(beta, "cancel", task_id)
    wait_for(lambda: alpha.data("status")["busy_workers"] == 0, timeout=30)
    told = [e for e in alpha.log_events() if e["event"] == "attempt_no_longer_current" and e.get("task_id") == task_id]
    assert len(told) == 1, [e["timestamp"] for e in told]
