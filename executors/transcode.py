"""The built-in TRANSCODE_MP4 executor: ffmpeg to an MP4 file, with progress, pausable.

Payload: `{"input": "/abs/in.mkv", "output": "/abs/out.mp4"}`, optional `"args"` (list of ffmpeg
output options, replacing the defaults `DEFAULT_ARGS`: H.264 veryfast, yuv420p so every player can
show it, AAC, faststart for streaming) and `"input_args"` (input options placed before `-i`, e.g.
`["-ss", "10"]` or `["-re"]`). Result: `{"output": path, "duration": seconds}` (the output's duration
as ffprobe reads it, else the input's; None if neither is known).

ffmpeg writes to `<dir>/.<name>.<task id>.part` (as MP4), which is renamed to the output only after
ffmpeg succeeded, so a half-written file never has the final name; the task id in it means no other
file (the input, another task's output) can be that file. The output is locked while ffmpeg writes
it (`executors.output_lock`): a second task for it pauses itself, "waiting for <output>", until the
first is done. A task that fails for good or is cancelled leaves no partial file, even if its
process was killed. Progress comes
from `-progress pipe:1` (out_time against the input's duration from ffprobe). Pause stops ffmpeg's
process group (SIGSTOP), resume continues it; cancel ends it and removes the partial file.

Errors: `PAYLOAD_ERROR` (malformed payload, missing input; never retried), `MISSING_TOOL` (ffmpeg not
installed), `FFMPEG` (non-zero exit, with ffmpeg's last lines), `IO_ERROR`, `CANCELLED`.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from executors import _process, output_lock
from executors.base import ExecuteResult, TaskExecutor, check_keys

if TYPE_CHECKING:
    from daemon.models import Task
    from executors.base import TaskContext

DEFAULT_ARGS = (
    "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
    "-c:a", "aac", "-movflags", "+faststart",
)
LAST_LINES = 20
PROBE_TIMEOUT = 60.0
MISSING_TOOL = "MISSING_TOOL"
FFMPEG = "FFMPEG"
_CLOCK = re.compile(r"(-?)(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)$")


@dataclasses.dataclass(frozen=True)
class TranscodeSpec:
    """A validated TRANSCODE_MP4 payload."""

    input: Path
    output: Path
    args: tuple[str, ...]
    input_args: tuple[str, ...]

    def partial(self, task_id: str) -> Path:
        """Where ffmpeg writes for task `task_id` until it has succeeded (next to the output, so
        that the rename is atomic); PayloadError if that cannot be a file of its own: a name too
        long, or the input itself (a task id chosen to make it so), which is never written or
        removed."""
        partial = self.output.with_name(f".{self.output.name}.{task_id}.part")
        if len(os.fsencode(partial.name)) > 255:
            raise _process.PayloadError(f"the output's name is too long for its partial file: {self.output.name}")
        try:
            clash = partial.resolve() == self.input.resolve()
        except (OSError, RuntimeError) as exc:  # e.g. a symlink loop by that name
            raise _process.PayloadError(f"the output's partial file {partial} is not usable: {exc}") from None
        if clash:
            raise _process.PayloadError(f"the input has the name of the output's partial file: {partial}")
        return partial

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], *, check_input: bool = True) -> TranscodeSpec:
        """Check the payload (and that the input is a file); PayloadError says what is wrong."""
        source = _process.absolute_path(payload.get("input"), "input")
        target = _process.absolute_path(payload.get("output"), "output")
        try:
            target_is_dir = stat.S_ISDIR(os.stat(target).st_mode)
        except OSError as exc:
            # Said here rather than left to resolve(), which raises on a loop only before Python 3.13.
            if exc.errno == errno.ELOOP:
                raise _process.PayloadError(f"output is a symlink loop: {target}") from None
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # e.g. a name too long
                raise _process.PayloadError(f"input and output must be usable paths: {exc}") from None
            target_is_dir = False  # not there yet, as usual
        try:
            if check_input and not source.is_file():
                raise _process.PayloadError(f"input file not found: {source}")
            if target_is_dir:
                raise _process.PayloadError(f"output is a directory: {target}")
            same = source.resolve() == target.resolve()
        except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop (RuntimeError)...
            raise _process.PayloadError(f"input and output must be usable paths: {exc}") from None
        if same:
            raise _process.PayloadError("input and output are the same file")
        return cls(
            source, target,
            _options(payload, "args", DEFAULT_ARGS),
            _options(payload, "input_args", ()),
        )


def _options(payload: Mapping[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = payload.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise _process.PayloadError(f"{key} must be a list of strings")
    return tuple(value)


def probe_duration(ffprobe: str | None, path: Path) -> float | None:
    """The media's duration in seconds according to ffprobe, or None if it cannot tell."""
    if ffprobe is None:
        return None
    try:
        done = subprocess.run(
            [ffprobe, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False,
        )
        value = float(done.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None  # "N/A", no format, unreadable: progress then shows time only
    return value if math.isfinite(value) and value > 0 else None


def clock(seconds: float) -> str:
    """HH:MM:SS."""
    whole = int(max(seconds, 0.0))
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def parse_clock(text: str) -> float | None:
    """Seconds in an ffmpeg "HH:MM:SS.micro" time, or None."""
    match = _CLOCK.match(text.strip())
    if match is None:
        return None
    sign, hours, minutes, seconds = match.groups()
    value = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return -value if sign else value


class FfmpegProgress:
    """Turns ffmpeg's `-progress` key=value blocks into progress reports.

    ffmpeg ends its last block with "progress=end" when it gets SIGTERM as well as when it has
    encoded everything, so "end" alone does not mean the file is being finished: a cancelled
    task (a cancel, a timeout or a shutdown all set the cancel Event before ffmpeg is signalled)
    never reports it, and `stopped` takes it back once ffmpeg has failed after all.
    """

    def __init__(self, ctx: TaskContext, duration: float | None) -> None:
        self.ctx = ctx
        self.duration = duration
        self.out_time: float | None = None
        self.speed: str | None = None
        self.ended = False
        self._last: tuple[float, str | None] = (0, None)  # the last report before any "end"
        self._finishing_reported = False

    def feed(self, line: str) -> None:
        """One line of ffmpeg's progress output."""
        key, _, value = line.strip().partition("=")
        value = value.strip()
        if key == "out_time_us" or key == "out_time_ms":
            # Both are microseconds: "out_time_ms" is a long-standing misnomer in ffmpeg.
            if value.lstrip("-").isdigit():
                self.out_time = int(value) / 1_000_000
        elif key == "out_time" and self.out_time is None:
            self.out_time = parse_clock(value)
        elif key == "speed":
            self.speed = value if value not in ("", "N/A") else None
        elif key == "progress":
            self.ended = value == "end"
            self._report()
            self.out_time = None  # each block brings its own

    def stopped(self) -> None:
        """ffmpeg did not succeed (it failed, or the task was cancelled): the progress goes back
        to what it was before a "finishing" report, if one was made."""
        if self._finishing_reported:
            self._finishing_reported = False
            self.ctx.progress(*self._last)

    def _report(self) -> None:
        done = max(self.out_time or 0.0, 0.0)
        speed = f" at {self.speed}" if self.speed else ""
        if self.ended:
            if not self.ctx.cancelled:  # else ffmpeg says "end" because it was told to stop
                self._finishing_reported = True
                self.ctx.progress(100, f"{clock(self.duration or done)} encoded, finishing")
            return
        if self.duration:
            # 99 at most until ffmpeg says it has ended: the last seconds and the trailer remain.
            self._last = (min(99.0, 100.0 * done / self.duration), f"{clock(done)} of {clock(self.duration)}{speed}")
        else:
            self._last = (0, f"{clock(done)} encoded{speed}")
        self.ctx.progress(*self._last)


class TranscodeExecutor(TaskExecutor):
    """Transcodes a media file to MP4 with ffmpeg; pausable, cancellable, with progress."""

    task_type = "TRANSCODE_MP4"
    pausable = True
    kill_grace = 5.0  # ffmpeg finishes the file on SIGTERM; we delete it anyway, so not long
    payload_keys = ("input", "output", "args", "input_args")

    @classmethod
    def validate(cls, payload: Mapping[str, Any]) -> None:
        """The payload's keys and values; the input is looked for only at run time (an upstream task may make it)."""
        check_keys(payload, cls.payload_keys)
        TranscodeSpec.from_payload(payload, check_input=False)

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        """Run ffmpeg into a temporary file, then rename it to the output."""
        try:
            spec = TranscodeSpec.from_payload(task.payload)
            partial = spec.partial(task.id)
        except _process.PayloadError as exc:
            return _process.payload_error(exc)
        ffmpeg, ffprobe = shutil.which("ffmpeg"), shutil.which("ffprobe")
        if ffmpeg is None:
            return ExecuteResult(
                error="ffmpeg is not installed (not found on PATH); install it, e.g. apt-get install ffmpeg",
                error_type=MISSING_TOOL,
            )
        if ffprobe is None:
            ctx.log.warning("ffprobe not found: progress shows the encoded time only")
        duration = probe_duration(ffprobe, spec.input)
        return output_lock.run_locked(
            spec.output, ctx, lambda: self._transcode(spec, partial, ffmpeg, ffprobe, duration, ctx)
        )

    def _transcode(
        self, spec: TranscodeSpec, partial: Path, ffmpeg: str, ffprobe: str | None, duration: float | None,
        ctx: TaskContext,
    ) -> ExecuteResult:
        argv = [
            ffmpeg, "-hide_banner", "-nostdin", "-y", *spec.input_args, "-i", str(spec.input),
            *spec.args, "-progress", "pipe:1", "-nostats", "-f", "mp4", str(partial),
        ]
        ctx.log.info("running %s", subprocess.list2cmdline(argv))
        progress = FfmpegProgress(ctx, duration)
        last_lines: collections.deque[str] = collections.deque(maxlen=LAST_LINES)

        def on_stderr(line: str) -> None:
            print(line, file=sys.stdout)  # ffmpeg's messages go to the task's log
            last_lines.append(line)

        try:
            outcome = _process.run(
                ctx, argv, on_stdout=progress.feed, on_stderr=on_stderr, kill_grace=self.kill_grace
            )
        except _process.CommandNotStarted as exc:
            return ExecuteResult(error=f"ffmpeg cannot be run: {exc}", error_type=MISSING_TOOL)
        finally:
            sys.stdout.flush()
        if outcome.cancelled or outcome.returncode != 0:
            progress.stopped()
            partial.unlink(missing_ok=True)
            if outcome.cancelled:
                return _process.cancelled_result()
            tail = "\n".join(last_lines)
            return ExecuteResult(
                error=f"ffmpeg failed ({_process.describe_returncode(outcome.returncode)}): {tail}",
                error_type=FFMPEG,
            )
        try:
            os.replace(partial, spec.output)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            return ExecuteResult(error=f"cannot rename to {spec.output}: {exc}", error_type="IO_ERROR")
        final = probe_duration(ffprobe, spec.output) or duration
        return ExecuteResult(result={"output": str(spec.output), "duration": final})

    def can_skip(self, task: Task) -> bool:
        """True when the output exists and is newer than the input."""
        try:
            spec = TranscodeSpec.from_payload(task.payload, check_input=False)
            return spec.output.stat().st_mtime_ns > spec.input.stat().st_mtime_ns
        except (_process.PayloadError, OSError):
            return False

    def skipped_result(self, task: Task) -> dict[str, Any]:
        """What a skipped transcode's dependents read: its output (its duration would need ffprobe,
        which has no place in the supervisor's loop)."""
        return {"output": str(TranscodeSpec.from_payload(task.payload, check_input=False).output)}

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        """Remove the partial file an attempt killed mid-way (SIGKILL, a crash, the daemon's
        death: recovery calls this for the tasks it fails as INTERRUPTED) left behind."""
        try:
            # A template's task is stored with its input still "{@0.output}": the spec is built
            # from what is known here, and the partial file depends on the output alone.
            payload = {**task.payload, "input": "/"} if task.payload_refs else task.payload
            TranscodeSpec.from_payload(payload, check_input=False).partial(task.id).unlink(missing_ok=True)
        except (_process.PayloadError, OSError):
            pass
