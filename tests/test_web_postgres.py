"""The HTTP server of a supervisor sharing a PostgreSQL queue with others (SPEC §16, §17): what
another supervisor does reaches this one's page live, though this one's loop commits nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.daemon_harness import Daemon
from tests.postgres_daemons import on_postgres, url  # noqa: F401 (fixtures)
from tests.web_harness import HttpDaemon, sse_events

# Every timer of the page's host far away: its loop wakes only for the others' submits and ends
# (NOTIFY), so its page can learn of the others' progress only from the database.
QUIET = {"idle_poll_interval": 60, "poll_interval": 60, "heartbeat_interval": 30, "lease_timeout": 90}


def test_progress_of_a_task_another_supervisor_runs_reaches_this_page_live(
    on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    web = HttpDaemon(tmp_path / "web", database=url, name="web", **QUIET)
    # A queue only the other supervisor serves: the task can only run there.
    other = on_postgres("other", extra_toml="[queues.remote]\nworkers = 1\n")
    try:
        web.start()
        other.start()
        stream = sse_events(web, "/api/v1/events")
        assert next(stream)[0] == "hello"
        task_id = other.submit("COUNT", queue="remote", payload={
            "n": 40, "step": 0.05, "count_file": str(tmp_path / "count"), "state_file": str(tmp_path / "state")})
        progress: list[int] = []
        supervisors = set()
        for event, data in stream:
            assert event == "tasks"
            mine = [t for t in data.get("tasks", []) if t["id"] == task_id]
            progress += [t["progress"] for t in mine if t["status"] == "running"]
            supervisors |= {t["supervisor"] for t in mine if t["supervisor"]}
            if any(t["status"] == "completed" for t in mine):
                break
        stream.close()
        assert supervisors == {"other"}
        assert len(set(progress)) >= 3 and progress == sorted(progress), progress
    finally:
        web.kill_if_running()
        other.kill_if_running()
