"""The HTTP server of a supervisor sharing a PostgreSQL queue with others (SPEC §16, §17): what
another supervisor does reaches this one's page live, though this one's loop commits nothing; an
outage of the server is ridden out by the page's reads, its live feed and /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_cluster import Cluster
from tests.postgres_daemons import on_postgres, url  # noqa: F401 (fixtures)
from tests.web_harness import QUIET_LOOP, HttpDaemon, metric, sse_events



def test_progress_of_a_task_another_supervisor_runs_reaches_this_page_live(
    on_postgres: Callable[..., Daemon], url: str, tmp_path: Path
) -> None:
    web = HttpDaemon(tmp_path / "web", database=url, name="web", **QUIET_LOOP)
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


def test_an_outage_of_the_server_is_ridden_out_by_the_page_and_metrics(
    postgres_cluster: Cluster, url: str, tmp_path: Path
) -> None:
    web = HttpDaemon(tmp_path / "web", database=url, name="web")
    try:
        web.start()
        assert web.get("/api/v1/page/tasks").data["total"] == 0
        assert metric(web.get("/metrics").body.decode(), "fredica_database_fault_active") == 0
        stream = sse_events(web, "/api/v1/events")
        assert next(stream)[0] == "hello"
        postgres_cluster.stop_server()
        try:
            # Scraped while the loop rides the fault out: what it knows in memory, the fault first.
            wait_for(lambda: metric(web.get("/metrics").body.decode(), "fredica_database_fault_active") == 1, 20)
            scraped = web.get("/metrics")
            assert scraped.status == 200 and "fredica_tasks{" not in scraped.body.decode()
            assert metric(scraped.body.decode(), "fredica_workers", queue="default") == 2
            refused = web.get("/api/v1/page/tasks")
            assert (refused.status, refused.kind) == (503, "DatabaseFault"), refused.json
            assert refused.json["error"]["message"] == "the database is unavailable (connection lost): nothing was changed"
            assert web.get("/api/v1/status").status == 503
        finally:
            postgres_cluster.start_server()
        wait_for(lambda: metric(web.get("/metrics").body.decode(), "fredica_database_fault_active") == 0, 20)
        # Restarted with no read in between: the next reads get a new session, not an error.
        for _ in range(3):
            assert web.get("/api/v1/page/tasks").status == 200 and web.get("/metrics").status == 200
        postgres_cluster.restart()
        for _ in range(3):
            assert web.get("/api/v1/page/tasks").data["total"] == 0
            assert "fredica_tasks" in web.get("/metrics").body.decode()
        task_id = wait_for(lambda: (r := web.post("submit", tasks=[{"type": "ECHO"}])).status == 200
                           and r.json["data"]["tasks"][0]["id"], 20)
        # The stream opened before both outages goes on: the new row comes (within a deadline:
        # the feed's keepalives would otherwise keep a lost row's wait open until CI's own limit).
        for event, data in stream:
            if task_id in [t["id"] for t in data.get("tasks", [])]:
                break
        else:
            raise AssertionError("the stream ended before the new task came through it")
        stream.close()
        assert web.process is not None and web.process.poll() is None
    finally:
        web.kill_if_running()
