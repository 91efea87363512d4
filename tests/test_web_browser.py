"""The web page (SPEC §17), on SQLite and on PostgreSQL, in a real headless Chromium (Debian's `chromium`), driven by Playwright
pointed at that binary (its own browser download is never used).

Without Chromium or Playwright these tests skip with a message on a developer's machine; under
CI=true they fail instead (.ci/run installs both).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon import protocol
from tests.conftest import wait_for
from tests.daemon_harness import Daemon
from tests.postgres_cluster import url  # noqa: F401 (web_database's PostgreSQL half)
from tests.web_harness import QUIET_LOOP, HttpDaemon, web_database  # noqa: F401 (fixtures)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing() -> list[str]:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[test]')")
    if not os.path.exists(CHROMIUM):
        missing.append("chromium (apt-get install chromium)")
    return missing


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing:
        message = "browser tests need " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: they may not skip)")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def pipeline(d: HttpDaemon, steps: int = 2000) -> dict[str, Any]:
    """A two-task pipeline, submitted through the API: a slow pausable count, then an echo."""
    tasks = [
        {"key": "count", "type": "COUNT", "payload": {"n": steps, "step": 0.05, "count_file": str(d.count_file),
                                                      "state_file": str(d.state_file)}},
        {"type": "ECHO", "depends_on": ["count"], "payload": {"after": "count"}},
    ]
    return d.api("submit", tasks=tasks)


def row(page: Any, task_id: str) -> Any:
    return page.locator(f'#tasks tr[data-id="{task_id}"]')


def progress_of(page: Any, task_id: str) -> int:
    value = row(page, task_id).get_attribute("data-progress", timeout=10_000)
    return int(float(value or 0))


def shown_status(page: Any, task_id: str) -> str | None:
    return row(page, task_id).get_attribute("data-status", timeout=10_000)


def test_the_page_drives_the_daemon(tmp_path: Path, browser: Any, web_database: str | None) -> None:
    # On PostgreSQL too (SPEC §16): the same page, the same live progress, the same restart log.
    d = HttpDaemon(tmp_path / "d", database=web_database, max_workers=3)
    try:
        d.start()
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(d.base_url + "/")
        # The token is asked for once and kept in the tab's session storage.
        page.fill("#token", d.token)
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#live.on", timeout=10_000)

        submitted = pipeline(d)
        count_id, echo_id = (t["id"] for t in submitted["tasks"])
        page.wait_for_selector(f'#tasks tr[data-id="{count_id}"]', timeout=10_000)
        assert row(page, count_id).locator("td").first.inner_text() == count_id[:8]  # short ids, as the CLI
        assert shown_status(page, echo_id) == "waiting"
        # Buttons for the acting operations this daemon has, and none for those it lacks.
        for op in ("pause", "resume", "cancel", "retry", "hold", "release"):
            expected = 1 if op in protocol.OPERATIONS else 0
            assert row(page, count_id).locator(f'button[data-op="{op}"]').count() == expected, op

        # The progress bar moves, live.
        first = wait_for(lambda: progress_of(page, count_id) > 0 and progress_of(page, count_id), 20)
        wait_for(lambda: progress_of(page, count_id) >= first + 2, 20)
        width = row(page, count_id).locator(".bar > span").evaluate("e => parseFloat(e.style.width)")
        assert width > 0

        # Pause and resume with the page's buttons.
        pause = row(page, count_id).locator('button[data-op="pause"]')
        resume = row(page, count_id).locator('button[data-op="resume"]')
        assert pause.is_enabled() and resume.is_disabled()
        pause.click()
        wait_for(lambda: shown_status(page, count_id) == "paused", 10)
        assert d.api("show", id=count_id)["object"]["is_paused"] is True
        wait_for(lambda: d.state_file.exists() and d.state_file.read_text() == "paused", 10)
        assert resume.is_enabled() and pause.is_disabled()
        resume.click()
        wait_for(lambda: shown_status(page, count_id) == "running", 10)
        at_resume = progress_of(page, count_id)
        wait_for(lambda: progress_of(page, count_id) > at_resume, 20)
        assert d.api("show", id=count_id)["object"]["is_paused"] is False

        # A task whose executor cannot pause: its pause button is greyed out.
        ready = tmp_path / "hang-ready"
        hang_id = d.api("submit", tasks=[{"type": "HANG", "payload": {"ready_file": str(ready)}}])["tasks"][0]["id"]
        wait_for(lambda: d.api("show", id=hang_id)["object"]["status"] == "running", 20)
        wait_for(lambda: shown_status(page, hang_id) == "running", 10)
        assert row(page, hang_id).locator('button[data-op="pause"]').is_disabled()
        assert row(page, hang_id).locator('button[data-op="cancel"]').is_enabled()

        # Cancel the pipeline's run from the runs list: both of its tasks end cancelled.
        page.locator(f'#runs tr[data-run="{submitted["run_id"]}"] button[data-op="cancel"]').click()
        wait_for(lambda: d.api("show", id=submitted["run_id"])["object"]["status"] == "cancelled", 20)
        wait_for(lambda: shown_status(page, count_id) == "cancelled" and shown_status(page, echo_id) == "cancelled", 10)
        if "retry" in protocol.OPERATIONS:
            assert row(page, count_id).locator('button[data-op="retry"]').is_enabled()
            assert row(page, hang_id).locator('button[data-op="retry"]').is_disabled()

        # kill -9 with the HANG task running; after the restart its restart-log entry is recreated.
        wait_for(ready.exists, 10)
        d.kill9()
        d.close_http()
        d.start()
        page.wait_for_selector("#restarts tr[data-entry]", timeout=20_000)  # the page reconnects by itself
        entries = d.api("restarts")
        assert [e["task_id"] for e in entries] == [hang_id]
        page.locator(f'#restarts tr[data-entry="{entries[0]["id"]}"] button[data-op="restarts_recreate"]').click()
        page.wait_for_selector("#restarts tr[data-entry]", state="detached", timeout=10_000)
        assert d.api("restarts") == []
        new_run = d.api("restarts", all=True)[0]["new_workflow_run_id"]
        new_task = d.api("show", id=new_run)["object"]["tasks"][0]
        assert new_task["type"] == "HANG"
        page.wait_for_selector(f'#tasks tr[data-id="{new_task["id"]}"]', timeout=10_000)

        # Its log, followed live.
        row(page, count_id).locator('button[data-op="log"]').click()
        wait_for(lambda: "ended" in page.locator("#log").inner_text(), 10)

        shot = tmp_path / "page.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        assert errors == []
        d.api("cancel", ids=[new_task["id"]])
    finally:
        d.kill_if_running()


def log_in(page: Any, d: HttpDaemon) -> None:
    page.goto(d.base_url + "/")
    page.fill("#token", d.token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#live.on", timeout=10_000)


def test_the_page_shows_a_task_another_supervisor_runs_live_and_cancels_it(
    tmp_path: Path, browser: Any, url: str
) -> None:
    # Two supervisors of one PostgreSQL queue (SPEC §16): the task runs on the other, in a queue
    # only it serves; this one's page follows its progress and its cancel stops it there.
    web = HttpDaemon(tmp_path / "web", database=url, name="web", **QUIET_LOOP)
    other = Daemon(tmp_path / "other", database=url, name="other", extra_toml="[queues.remote]\nworkers = 1\n")
    try:
        web.start()
        other.start()
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        log_in(page, web)
        task_id = other.submit("COUNT", queue="remote", payload={
            "n": 2000, "step": 0.05, "count_file": str(tmp_path / "count"), "state_file": str(tmp_path / "state")})
        page.wait_for_selector(f'#tasks tr[data-id="{task_id}"]', timeout=10_000)
        first = wait_for(lambda: progress_of(page, task_id) > 0 and progress_of(page, task_id), 20)
        wait_for(lambda: progress_of(page, task_id) >= first + 2, 20)
        assert shown_status(page, task_id) == "running" and web.task(task_id)["supervisor"] == "other"
        row(page, task_id).locator('button[data-op="cancel"]').click()
        wait_for(lambda: shown_status(page, task_id) == "cancelled", 20)
        assert other.task(task_id)["error_type"] == "CANCELLED"
        assert errors == []
    finally:
        web.kill_if_running()
        other.kill_if_running()


def test_a_wrong_token_is_asked_for_again(tmp_path: Path, browser: Any) -> None:
    d = HttpDaemon(tmp_path / "d")
    try:
        d.start()
        page = browser.new_page()
        page.goto(d.base_url + "/")
        page.fill("#token", "not-the-token")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#login-error:text('refused')", timeout=10_000)
        assert page.evaluate("sessionStorage.getItem('fredica-token')") is None
        assert page.context.cookies() == []
        page.fill("#token", d.token)
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#live.on", timeout=10_000)
        assert page.evaluate("sessionStorage.getItem('fredica-token')") == d.token
        assert page.context.cookies() == []
    finally:
        d.kill_if_running()
