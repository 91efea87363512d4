"""The example config's download-then-transcode template, end to end with the real daemon,
a local HTTP server and the real ffmpeg."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon import cli
from tests.conftest import wait_for
from tests.daemon_harness import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("ffmpeg") is None and os.environ.get("CI") != "true",
    reason="ffmpeg is not installed (apt-get install ffmpeg); with CI=true this runs regardless",
)


@pytest.fixture
def served(tmp_path: Path):
    """A short clip made by ffmpeg, served over HTTP on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
         "testsrc=duration=2:size=160x120:rate=25", "-f", "lavfi", "-i", "sine=duration=2",
         "-shortest", str(root / "clip.mkv")],
        check=True, timeout=60,
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/clip.mkv"
    server.shutdown()
    server.server_close()


def test_the_example_pipeline_downloads_then_transcodes(daemons, served: str, tmp_path: Path) -> None:
    d = daemons()
    example = (REPO / "config.example.toml").read_text()
    d.config.write_text(d.config.read_text() + example[example.index("[templates."):])
    d.start()
    media = tmp_path / "media"
    media.mkdir()
    result = CliRunner().invoke(cli.main, [
        "run", "download_and_transcode", "--set", f"url={served}", "--set", "name=clip",
        "--set", f"dir={media}", "--material", "clip-1", "--config", str(d.config),
    ])
    assert result.exit_code == 0, result.output
    run = d.data("show", id=result.stdout.strip())["object"]
    download_id, transcode_id = (t["id"] for t in run["tasks"])
    transcode = d.wait_task(transcode_id, "completed", "failed", timeout=90)
    assert transcode["status"] == "completed", transcode["error"]
    download = d.task(download_id)
    assert download["result"]["output"] == str(media / "clip.source")
    assert download["idempotency_key"] == "clip:DOWNLOAD"
    assert transcode["result"]["output"] == str(media / "clip.mp4")
    assert transcode["result"]["duration"] > 1.5
    codec = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name",
         "-of", "csv=p=0", str(media / "clip.mp4")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert codec == "h264"
    assert d.data("show", id=run["id"])["object"]["status"] == "completed"


def test_the_example_pipeline_started_twice_at_once_downloads_and_transcodes_once(
    daemons, served: str, tmp_path: Path
) -> None:
    d = daemons(max_workers=1)
    example = (REPO / "config.example.toml").read_text()
    d.config.write_text(d.config.read_text() + example[example.index("[templates."):])
    d.start()
    ready = tmp_path / "ready"
    gate = d.submit("HANG", payload={"ready_file": str(ready)})
    wait_for(ready.exists)  # the only worker is busy: both runs wait, their tasks all active
    media = tmp_path / "media"
    params = {"url": served, "name": "clip", "dir": str(media)}
    first = d.data("run", template="download_and_transcode", params=params)
    second = d.data("run", template="download_and_transcode", params=params)
    # Both tasks of the second are the first's (idempotency keys): no second ffmpeg on clip.mp4.
    assert second["run_id"] is None
    assert [(t["id"], t["created"]) for t in second["tasks"]] == [(t["id"], False) for t in first["tasks"]]
    d.data("cancel", ids=[gate])
    transcode = d.wait_task(first["tasks"][1]["id"], "completed", "failed", timeout=90)
    assert transcode["status"] == "completed", transcode["error"]
    assert transcode["idempotency_key"] == "clip:TRANSCODE_MP4"
