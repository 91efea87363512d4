"""The built-in TRANSCODE_MP4 executor with the real ffmpeg: output, progress, pause, cancel."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from daemon import models
from daemon.models import TaskStatus
from daemon.engine import executor_processes
from executors import transcode
from executors.base import ExecuteResult, TaskContext
from tests import media
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("ffmpeg") is None and os.environ.get("CI") != "true",
    reason="ffmpeg is not installed (apt-get install ffmpeg); with CI=true these tests run regardless",
)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-second 160x120 clip with sound, in a codec the transcode has to change (MPEG-4 part 2)."""
    path = tmp_path_factory.mktemp("media") / "clip.mkv"
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error",
         "-f", "lavfi", "-i", "testsrc=duration=3:size=160x120:rate=25",
         "-f", "lavfi", "-i", "sine=duration=3", "-shortest", "-c:v", "mpeg4", "-c:a", "aac", str(path)],
        check=True, timeout=60,
    )
    return path


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[media.Launcher]:
    launcher = media.Launcher(tmp_path)
    yield launcher
    launcher.close()


def codec_of(path: Path) -> str:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout
    return str(json.loads(out)["streams"][0]["codec_name"])


def ffmpeg_pid(child_pid: int) -> int:
    """The pid of the ffmpeg the executor process started."""
    def find() -> int | None:
        try:
            kids = psutil.Process(child_pid).children()
        except psutil.NoSuchProcess:
            return None
        return next((p.pid for p in kids if p.name() == "ffmpeg"), None)

    pid = wait_for(find)
    assert pid is not None
    return pid


def test_transcode_to_mp4_with_rising_progress(launcher: media.Launcher, clip: Path, tmp_path: Path) -> None:
    output = tmp_path / "out" / "clip.mp4"  # the directory is created
    child = launcher.launch("TRANSCODE_MP4", {"input": str(clip), "output": str(output)})
    result = launcher.finish(child)
    assert result["error"] is None, result
    assert result["result"]["output"] == str(output)
    assert result["result"]["duration"] == pytest.approx(3.0, abs=0.2)
    assert codec_of(output) == "h264"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["clip.mp4"]  # no partial file left
    percents = media.progress_of(launcher.messages(child))
    assert percents and percents == sorted(percents) and percents[-1] == 100
    log = child.log_path.read_text()
    assert "-progress pipe:1" in log and "Output #0, mp4" in log  # the command and ffmpeg's own lines


def test_cancel_mid_way_leaves_no_partial_output(launcher: media.Launcher, clip: Path, tmp_path: Path) -> None:
    output = tmp_path / "clip.mp4"
    # -re reads the input in real time: three seconds of work, plenty to cancel in.
    child = launcher.launch("TRANSCODE_MP4", {"input": str(clip), "output": str(output), "input_args": ["-re"]})
    launcher.wait_message(child, lambda m: m["type"] == "progress")
    ffmpeg = ffmpeg_pid(child.pid)
    assert [p.name for p in tmp_path.glob(".clip.mp4.*.part")] == [f".clip.mp4.{child.task_id}.part"]
    child.request_cancel()
    assert launcher.finish(child)["error_type"] == models.CANCELLED
    assert media.gone(ffmpeg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


def test_pause_stops_ffmpeg_and_resume_completes(launcher: media.Launcher, clip: Path, tmp_path: Path) -> None:
    output = tmp_path / "clip.mp4"
    child = launcher.launch("TRANSCODE_MP4", {"input": str(clip), "output": str(output), "input_args": ["-re"]})
    launcher.wait_message(child, lambda m: m["type"] == "progress")
    ffmpeg = ffmpeg_pid(child.pid)
    child.pause()
    wait_for(lambda: media.is_stopped(ffmpeg))
    child.resume()
    wait_for(lambda: not media.is_stopped(ffmpeg))
    result = launcher.finish(child)
    assert result["error"] is None and output.exists() and codec_of(output) == "h264"


def test_an_ffmpeg_failure_reports_its_last_lines(clip: Path, tmp_path: Path) -> None:
    output = tmp_path / "clip.mp4"
    result, _ = media.run_inline(
        transcode.TranscodeExecutor(),
        {"input": str(clip), "output": str(output), "args": ["-c:v", "fredica_no_such_codec"]},
    )
    assert result.error_type == "FFMPEG"
    error = result.error or ""
    assert error.startswith("ffmpeg failed (exit code") and "fredica_no_such_codec" in error
    assert not output.exists() and not list(tmp_path.glob("*.part"))


def test_an_input_named_like_a_partial_file_is_never_touched(clip: Path, tmp_path: Path) -> None:
    # Partial files were once named <stem>.tmp<suffix>: ffmpeg then refused to write over its own
    # input, and the clean-up after its failure deleted the input.
    source = tmp_path / "clip.tmp.mp4"
    shutil.copyfile(clip, source)
    output = tmp_path / "clip.mp4"
    result, _ = media.run_inline(transcode.TranscodeExecutor(), {"input": str(source), "output": str(output)})
    assert result.error is None, result
    assert source.read_bytes() == clip.read_bytes() and codec_of(output) == "h264"


def test_an_input_at_the_partial_files_path_is_refused_and_never_removed(clip: Path, tmp_path: Path) -> None:
    # A client may choose its task's id, and so name its input as the output's partial file.
    task = media.make_task("TRANSCODE_MP4", {}, id="chosen")
    source = tmp_path / ".clip.mp4.chosen.part"
    shutil.copyfile(clip, source)
    task = dataclasses.replace(task, payload={"input": str(source), "output": str(tmp_path / "clip.mp4")})
    executor = transcode.TranscodeExecutor()
    result = executor.execute(task, TaskContext(task, media.Recorder(), threading.Event(), threading.Event()))
    assert result.error_type == models.PAYLOAD_ERROR and "partial file" in (result.error or "")
    executor.on_task_failed(task, result)  # the failure's hook: the input is not its to remove
    assert source.read_bytes() == clip.read_bytes()


def test_an_output_name_too_long_for_its_partial_file_is_a_payload_error(clip: Path, tmp_path: Path) -> None:
    output = tmp_path / ("v" * 230 + ".mp4")
    result, _ = media.run_inline(transcode.TranscodeExecutor(), {"input": str(clip), "output": str(output)})
    assert result.error_type == models.PAYLOAD_ERROR and "too long" in (result.error or "")


def test_a_failed_tasks_partial_file_is_removed(clip: Path, tmp_path: Path) -> None:
    # What an attempt SIGKILLed mid-way leaves: the executor's hook removes it once the task has failed.
    output = tmp_path / "clip.mp4"
    task = media.make_task("TRANSCODE_MP4", {"input": str(clip), "output": str(output)})
    partial = transcode.TranscodeSpec.from_payload(task.payload).partial(task.id)
    partial.write_bytes(b"half an mp4")
    neighbour = tmp_path / ".clip.mp4.another-task.part"  # another task's: left alone
    neighbour.write_bytes(b"")
    transcode.TranscodeExecutor().on_task_failed(task, ExecuteResult(error="killed", error_type=models.CRASHED))
    assert not partial.exists() and neighbour.exists() and clip.exists()
    # A template's task, stored with its input still naming the download's result.
    templated = dataclasses.replace(task, payload={**task.payload, "input": "{@0.output}"}, payload_refs=True)
    partial.write_bytes(b"half an mp4")
    transcode.TranscodeExecutor().on_task_failed(templated, ExecuteResult(error="killed", error_type=models.CRASHED))
    assert not partial.exists()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"input": "{tmp}/missing.mkv", "output": "{tmp}/out.mp4"}, "input file not found"),
        ({"output": "{tmp}/out.mp4"}, "input (an absolute file path) is required"),
        ({"input": "{clip}", "output": "relative.mp4"}, "output must be an absolute path"),
        ({"input": "{clip}", "output": "{clip}"}, "input and output are the same file"),
        ({"input": "{clip}", "output": "{tmp}/out.mp4", "args": "-c:v libx264"}, "args must be a list of strings"),
        ({"input": "{clip}", "output": "{tmp}"}, "output is a directory"),
        ({"input": "{tmp}/in\0.mkv", "output": "{tmp}/out.mp4"}, "input must not contain a NUL byte"),
        ({"input": "{clip}", "output": "{tmp}/out\0.mp4"}, "output must not contain a NUL byte"),
        ({"input": "{clip}", "output": "~fredica-no-such-user/out.mp4"}, "output: cannot expand the ~"),
        ({"input": "{clip}", "output": "{tmp}/" + "a" * 300 + "/out.mp4"}, "File name too long"),
        ({"input": "{clip}", "output": "{tmp}/loop"}, "output is a symlink loop"),
    ],
)
def test_bad_payloads_are_payload_errors(payload: dict[str, str], message: str, clip: Path, tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    filled = {k: v.replace("{tmp}", str(tmp_path)).replace("{clip}", str(clip)) if isinstance(v, str) else v
              for k, v in payload.items()}
    result, _ = media.run_inline(transcode.TranscodeExecutor(), filled)
    assert result.error_type == models.PAYLOAD_ERROR and message in (result.error or ""), result
    assert not transcode.TranscodeExecutor().can_skip(media.make_task("TRANSCODE_MP4", filled))  # does not raise


def test_missing_ffmpeg_is_missing_tool(clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result, _ = media.run_inline(
        transcode.TranscodeExecutor(), {"input": str(clip), "output": str(tmp_path / "out.mp4")}
    )
    assert result.error_type == "MISSING_TOOL" and "ffmpeg is not installed" in (result.error or "")


def test_can_skip_only_when_the_output_is_newer(clip: Path, tmp_path: Path) -> None:
    output = tmp_path / "clip.mp4"
    task = media.make_task("TRANSCODE_MP4", {"input": str(clip), "output": str(output)})
    executor = transcode.TranscodeExecutor()
    assert not executor.can_skip(task)
    output.write_bytes(b"pretend")
    stamp = clip.stat().st_mtime
    os.utime(output, (stamp + 10, stamp + 10))
    assert executor.can_skip(task)
    os.utime(output, (stamp - 10, stamp - 10))
    assert not executor.can_skip(task)
    # What the tasks that depend on a skipped transcode read, e.g. "{transcode.output}".
    assert executor.skipped_result(task) == {"output": str(output)}
    assert not executor.can_skip(media.make_task("TRANSCODE_MP4", {"input": 3}))


def test_progress_lines_become_percentages() -> None:
    cancel, resume = threading.Event(), threading.Event()
    sink = media.Recorder()
    ctx = TaskContext(media.make_task("TRANSCODE_MP4"), sink, cancel, resume)  # type: ignore[arg-type]
    progress = transcode.FfmpegProgress(ctx, duration=10.0)
    for line in ["frame=1", "out_time_us=N/A", "progress=continue", "out_time_ms=2500000", "speed=2.1x",
                 "progress=continue", "out_time=00:00:07.500000", "progress=continue", "progress=end"]:
        progress.feed(line)
    assert [(m["percent"], m["text"]) for m in sink.messages] == [
        (0, "00:00:00 of 00:00:10"),
        (25, "00:00:02 of 00:00:10 at 2.1x"),
        (75, "00:00:07 of 00:00:10 at 2.1x"),
        (100, "00:00:10 encoded, finishing"),
    ]
    assert transcode.parse_clock("01:02:03.5") == 3723.5 and transcode.parse_clock("N/A") is None


def test_end_to_end_through_the_supervisor(clip: Path, tmp_path: Path) -> None:
    sup = media.start_supervisor(tmp_path)
    try:
        payload = {"input": str(clip), "output": str(tmp_path / "clip.mp4")}
        task = media.wait_ended(sup, media.submit(sup, "TRANSCODE_MP4", payload))
        assert task.status is TaskStatus.COMPLETED and task.progress == 100
        assert task.result["output"] == payload["output"] and task.result["duration"] > 2.5
        again = media.wait_ended(sup, media.submit(sup, "TRANSCODE_MP4", payload))
        assert again.status is TaskStatus.COMPLETED
        assert again.result == {"skipped": True, "output": payload["output"]}  # what dependents read
    finally:
        sup.stop(grace=0, timeout=20)


def test_a_cancelled_ffmpeg_saying_end_is_not_reported_as_finishing() -> None:
    # ffmpeg ends its progress output with "progress=end" when it gets SIGTERM too.
    cancel, resume = threading.Event(), threading.Event()
    sink = media.Recorder()
    ctx = TaskContext(media.make_task("TRANSCODE_MP4"), sink, cancel, resume)  # type: ignore[arg-type]
    progress = transcode.FfmpegProgress(ctx, duration=10.0)
    for line in ["out_time_ms=2500000", "progress=continue"]:
        progress.feed(line)
    cancel.set()
    for line in ["out_time_ms=2600000", "progress=end"]:
        progress.feed(line)
    assert [(m["percent"], m["text"]) for m in sink.messages] == [(25, "00:00:02 of 00:00:10")]


@pytest.mark.parametrize("stop", ["cancel", "timeout"])
def test_a_stopped_transcode_never_shows_100_or_finishing(daemons: Any, clip: Path, tmp_path: Path, stop: str) -> None:
    d = daemons().start()
    # -re reads the input in real time: three seconds of work, stopped after about two (a second
    # was too short for ffmpeg to start on a loaded machine, which then said nothing of a signal).
    payload = {"input": str(clip), "output": str(tmp_path / "clip.mp4"), "input_args": ["-re"]}
    task_id = d.submit("TRANSCODE_MP4", payload=payload, **({"timeout": 2.0} if stop == "timeout" else {}))
    if stop == "cancel":
        wait_for(lambda: d.task(task_id)["progress"] > 0)
        d.data("cancel", ids=[task_id])
    task = d.wait_task(task_id, "cancelled", "failed")
    assert task["error_type"] == {"cancel": models.CANCELLED, "timeout": "TIMEOUT"}[stop]
    assert task["progress"] < 100 and "finishing" not in (task["status_text"] or ""), task
    log_text = (d.log_dir / "tasks" / f"{task_id}.log").read_text()
    assert "received signal 15" in log_text  # ffmpeg was stopped by SIGTERM, and said "end"


def test_ffmpeg_killed_after_saying_end_takes_its_finishing_back(
    launcher: media.Launcher, clip: Path, tmp_path: Path
) -> None:
    # SIGTERM from elsewhere (not a cancel): ffmpeg says "end", then fails.
    output = tmp_path / "clip.mp4"
    child = launcher.launch("TRANSCODE_MP4", {"input": str(clip), "output": str(output), "input_args": ["-re"]})
    launcher.wait_message(child, lambda m: m["type"] == "progress")
    os.kill(ffmpeg_pid(child.pid), signal.SIGTERM)
    assert launcher.finish(child)["error_type"] == transcode.FFMPEG
    reports = [m for m in launcher.messages(child) if m["type"] == "progress"]
    assert reports[-1]["percent"] < 100 and "finishing" not in (reports[-1]["text"] or ""), reports[-3:]


def ffmpegs_of(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children() if p.name() == "ffmpeg"]
    except psutil.NoSuchProcess:
        return []


def one_transcode_waiting_for_another(
    launcher: media.Launcher, clip: Path, tmp_path: Path
) -> tuple[Path, executor_processes.ExecutorProcess, executor_processes.ExecutorProcess]:
    """Two transcodes to one output: the first running ffmpeg, the second paused, waiting for it."""
    output = tmp_path / "clip.mp4"
    payload = {"input": str(clip), "output": str(output)}
    # The first reads its input in real time (3 s), so that it is still writing when the second
    # comes; the second, once it has the output, need not.
    first = launcher.launch("TRANSCODE_MP4", {**payload, "input_args": ["-re"]})
    launcher.wait_message(first, lambda m: m["type"] == "progress")
    ffmpeg_pid(first.pid)
    second = launcher.launch("TRANSCODE_MP4", payload)
    pause = launcher.wait_message(second, lambda m: m["type"] == "pause_request")
    assert pause["reason"] == f"waiting for {output}"
    return output, first, second


def test_a_second_transcode_to_one_output_waits_for_the_first(
    launcher: media.Launcher, clip: Path, tmp_path: Path
) -> None:
    output, first, second = one_transcode_waiting_for_another(launcher, clip, tmp_path)
    assert ffmpegs_of(second.pid) == []  # one ffmpeg writes the output, not two
    assert launcher.finish(first)["error"] is None
    launcher.wait_message(second, lambda m: m["type"] == "resume_request")
    result = launcher.finish(second)
    assert result["error"] is None and codec_of(output) == "h264"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "logs"]  # no lock file left


def test_a_transcode_whose_process_was_killed_leaves_no_stale_lock(
    launcher: media.Launcher, clip: Path, tmp_path: Path
) -> None:
    output, first, second = one_transcode_waiting_for_another(launcher, clip, tmp_path)
    first.kill_attempt()  # SIGKILL: the lock goes with its process
    launcher.wait_message(second, lambda m: m["type"] == "resume_request")
    assert launcher.finish(second)["error"] is None and codec_of(output) == "h264"
