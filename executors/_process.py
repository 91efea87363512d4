"""Run an external command in its own process group, steered by a task's pause and cancel.

Shared by the built-in SHELL and TRANSCODE_MP4 executors (with the few result helpers all built-ins
use). The command gets a new session, so its process group holds it and everything it starts, but
for what leaves the group (`setsid cmd &`, job control): those seen while the command runs get
the group's signals too, and what detaches itself otherwise is ended with the attempt
(`_parent.end_leftovers`):

- pause = SIGSTOP to the group, resume = SIGCONT: the command needs no cooperation;
- cancel = SIGTERM (with SIGCONT, so a paused group can act on it), then SIGKILL after a grace;
- when the command (the group leader) exits, whatever it left running in its group is ended the
  same way, as systemd does for a service's cgroup: a task leaves nothing behind.

The output pipes are read in the executor's main thread with a selector, between the pause and
cancel checks, instead of in reader threads: there is no thread to stop or join, and a background
process that keeps the pipe open cannot hang the task (its output is read for a short while after
the leader exits, then the group is ended).

The leader is reaped only at the very end (`os.waitid(..., WNOWAIT)` notices its exit): while its
zombie exists, its pid, which is the group id, cannot be reused, so signalling the group can never
hit an unrelated process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Sequence

import psutil

from daemon import models
from executors._parent import die_with_parent, running
from executors.base import ExecuteResult, PayloadError  # noqa: F401 (PayloadError: re-exported for the built-ins)

if TYPE_CHECKING:
    from executors.base import TaskContext

LineHandler = Callable[[str], None]

POLL_INTERVAL = 0.05  # how soon a pause or a cancel is noticed while the command is quiet
EXIT_DRAIN = 0.5  # after the leader exits: how long to wait for the rest of the group's output
READ_SIZE = 64 * 1024
MAX_LINE = 64 * 1024  # a longer "line" (binary output, a huge progress bar) is cut into pieces

class CommandNotStarted(Exception):
    """The command could not be started (not found, not executable, bad working directory)."""


def absolute_path(value: object, key: str) -> Path:
    """The payload's `key`, an absolute file path (~ expanded); PayloadError says what is wrong."""
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{key} (an absolute file path) is required")
    if "\0" in value:
        raise PayloadError(f"{key} must not contain a NUL byte: {value!r}")
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # "~name" for an unknown user, or "~" without a home directory
        raise PayloadError(f"{key}: cannot expand the ~ of {value!r} (unknown user?)") from None
    # Relative to what? The daemon's working directory is no place for a task's files.
    if not path.is_absolute():
        raise PayloadError(f"{key} must be an absolute path, not {value!r}")
    return path


def output_path(value: object, key: str = "output") -> Path:
    """The payload's `key`, an absolute path of a file to write (not a directory); PayloadError
    says what is wrong."""
    path = absolute_path(value, key)
    try:
        is_dir = path.is_dir()
    except OSError as exc:  # e.g. a name too long
        raise PayloadError(f"{key} is not a usable path ({exc.strerror}): {value!r}") from None
    if is_dir:
        raise PayloadError(f"{key} is a directory: {value}")
    return path


def payload_error(message: object) -> ExecuteResult:
    """The never-retried PAYLOAD_ERROR result."""
    return ExecuteResult(error=str(message), error_type=models.PAYLOAD_ERROR)


def cancelled_result() -> ExecuteResult:
    """The CANCELLED result."""
    return ExecuteResult(error="cancelled", error_type=models.CANCELLED)


def describe_returncode(returncode: int) -> str:
    """"exit code 3" or "killed by SIGKILL" for a Popen return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a command ended: its return code (negative: the signal) and whether we cancelled it."""

    returncode: int
    cancelled: bool


# --- output -----------------------------------------------------------------------------------------


class LineSplitter:
    """Turns chunks of bytes into text lines; a lone CR ends a line too (progress bars use it)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[str]:
        """The lines completed by `data`."""
        self._buffer += data
        lines: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            end, after = cut
            lines.append(self._buffer[:end].decode("utf-8", errors="replace"))
            self._buffer = self._buffer[after:]
        while len(self._buffer) > MAX_LINE:
            lines.append(self._buffer[:MAX_LINE].decode("utf-8", errors="replace"))
            self._buffer = self._buffer[MAX_LINE:]
        return lines

    def flush(self) -> list[str]:
        """The last, unterminated line, if any (at end of file)."""
        rest, self._buffer = self._buffer, b""
        if rest.endswith(b"\r"):  # held back in case an LF followed; none will now
            rest = rest[:-1]
            return [rest.decode("utf-8", errors="replace")]
        return [rest.decode("utf-8", errors="replace")] if rest else []


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """(end of the first line, start of the next) or None if no line is complete yet."""
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (lf, lf + 1)
    if cr + 1 == len(buffer):
        return None  # a CR at the very end may be the first half of a CRLF
    return (cr, cr + 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)


class OutputPump:
    """Reads the command's pipes without blocking and hands each line to its handler."""

    def __init__(self, streams: Sequence[tuple[IO[bytes], LineHandler]]) -> None:
        self._selector = selectors.DefaultSelector()
        self._streams = [stream for stream, _ in streams]
        for stream, handler in streams:
            os.set_blocking(stream.fileno(), False)
            self._selector.register(stream.fileno(), selectors.EVENT_READ, (LineSplitter(), handler))

    @property
    def open(self) -> bool:
        """True while some pipe has not reached end of file."""
        return bool(self._selector.get_map())

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` for output and dispatch the complete lines."""
        for key, _ in self._selector.select(timeout):
            splitter, handler = key.data
            try:
                data = os.read(key.fd, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                lines = splitter.feed(data)
            else:
                self._selector.unregister(key.fd)
                lines = splitter.flush()
            for line in lines:
                handler(line)

    def drain(self, timeout: float) -> None:
        """Read until every pipe is at end of file, or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while self.open:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.pump(min(left, POLL_INTERVAL))

    def close(self, dispatch: bool = True) -> None:
        """Dispatch unterminated last lines (unless `dispatch` is False) and close the pipes."""
        for key in list(self._selector.get_map().values()):
            splitter, handler = key.data
            for line in splitter.flush() if dispatch else []:
                handler(line)
        self._selector.close()
        for stream in self._streams:
            stream.close()


# --- the process group ------------------------------------------------------------------------------


class ProcessGroup:
    """A started command, leader of its own process group, and whatever it started that left the
    group (`setsid cmd &`, job control): signals reach those too."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pgid = popen.pid  # start_new_session makes the leader's pid the group id
        self._reaped = False
        self._escaped: dict[int, psutil.Process] = {}  # seen outside the group, by pid

    @property
    def pid(self) -> int:
        """The leader's pid."""
        return self.popen.pid

    def send(self, sig: int) -> None:
        """Signal every process of the group, and those of the command's that left it (nothing
        happens if none is left); each once."""
        self._note_escaped()
        if not self._reaped:  # once reaped, the group id may belong to someone else
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in list(self._escaped.values()):
            try:
                proc.send_signal(sig)  # psutil checks the pid still names that process
            except psutil.Error:
                del self._escaped[proc.pid]

    def _note_escaped(self) -> None:
        """Remember the command's descendants that are in another process group by now: those of
        the leader while it runs, and those of the ones already seen. (Once the leader has exited,
        its children are the executor process's: a process that detached itself then, or by a
        double fork at once, is left to the end of the attempt, which ends it.)"""
        roots = [proc for proc in self._escaped.values() if running(proc)]
        if not self.leader_exited():
            try:
                roots.append(psutil.Process(self.pid))
            except psutil.Error:
                pass
        for root in roots:  # none, usually, once the command has exited: no scan of /proc then
            try:
                found = root.children(recursive=True)
            except psutil.Error:
                continue
            for proc in found:
                try:
                    if os.getpgid(proc.pid) == self.pgid:
                        continue
                except OSError:
                    continue
                known = self._escaped.get(proc.pid)
                if known is None or not running(known):  # a pid seen before may name another now
                    self._escaped[proc.pid] = proc

    def leader_exited(self) -> bool:
        """True once the leader has exited (it stays a zombie until `reap`)."""
        if self._reaped:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def live_members(self) -> list[int]:
        """Pids of the group's processes, and of those that left it, still running (zombies are done)."""
        self._note_escaped()
        members = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == self.pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except (OSError, psutil.Error):
                continue
        members += [proc.pid for proc in self._escaped.values() if running(proc)]
        return members

    def end(self, grace: float, idle: Callable[[float], None]) -> None:
        """SIGTERM (and SIGCONT) the group, then SIGKILL what is left after `grace` seconds.

        `idle(timeout)` is called while waiting; it keeps the pipes read so that a process blocked on
        a full pipe can still act on its SIGTERM.
        """
        if not self.live_members():
            return
        self.send(signal.SIGTERM)
        self.send(signal.SIGCONT)  # a stopped process only acts on SIGTERM once it runs again
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            idle(POLL_INTERVAL)
            if not self.live_members():
                return
        self.send(signal.SIGKILL)

    @property
    def reaped(self) -> bool:
        """True once the leader's exit status has been collected."""
        return self._reaped

    def reap(self) -> int:
        """Collect the leader's exit status; the group is not signalled after this."""
        returncode = self.popen.wait()
        self._reaped = True
        return returncode


def start(
    argv: Sequence[str] | str,
    *,
    shell: bool = False,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    merge_stderr: bool = True,
) -> ProcessGroup:
    """Start the command in a new session with piped output; CommandNotStarted if it cannot run."""
    try:
        popen = subprocess.Popen(
            argv,
            shell=shell,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,  # nothing may read the daemon's terminal
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
            # Runs in the forked child before exec. If the executor process dies abruptly (SIGKILL),
            # the command must not run on unsupervised; the supervisor also kills the whole tree,
            # this only covers the gap when nobody does.
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    except FileNotFoundError as exc:
        name = argv if isinstance(argv, str) else argv[0]
        if cwd is not None and not os.path.isdir(cwd):
            raise CommandNotStarted(f"working directory not found: {cwd}") from exc
        raise CommandNotStarted(f"command not found: {name}") from exc
    except PermissionError as exc:
        name = argv if isinstance(argv, str) else argv[0]
        raise CommandNotStarted(f"command not executable (permission denied): {name}") from exc
    except OSError as exc:  # ENOEXEC (not a program), E2BIG, ...
        raise CommandNotStarted(f"command could not be started: {exc}") from exc
    return ProcessGroup(popen)


def run(
    ctx: TaskContext,
    argv: Sequence[str] | str,
    *,
    on_stdout: LineHandler,
    on_stderr: LineHandler | None = None,
    shell: bool = False,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    kill_grace: float = 3.0,
    pausable: bool = True,
) -> Outcome:
    """Run a command to its end, following the task's pause and cancel; lines go to the handlers.

    Without `on_stderr`, stderr is merged into stdout. With `pausable` False a pause is ignored (the
    command is never stopped). Raises CommandNotStarted. Whatever happens, nothing of the group is
    left running when this returns or raises.
    """
    group = start(argv, shell=shell, cwd=cwd, env=env, merge_stderr=on_stderr is None)
    assert group.popen.stdout is not None
    streams: list[tuple[IO[bytes], LineHandler]] = [(group.popen.stdout, on_stdout)]
    if on_stderr is not None:
        assert group.popen.stderr is not None
        streams.append((group.popen.stderr, on_stderr))
    pump = OutputPump(streams)

    def idle(timeout: float) -> None:
        if pump.open:
            pump.pump(timeout)
        else:
            ctx.wait_cancelled(timeout)

    ctx.log.info("started pid %d (its own process group)", group.pid)
    finished = False
    try:
        while True:
            if ctx.cancelled:
                ctx.log.info("cancel: ending process group %d", group.pgid)
                group.end(kill_grace, idle)
                pump.drain(EXIT_DRAIN)
                outcome = Outcome(group.reap(), cancelled=True)
                break
            if pausable and not ctx.wait_if_paused(timeout=0):
                group.send(signal.SIGSTOP)
                ctx.log.info("paused: process group %d stopped", group.pgid)
                ctx.wait_if_paused()  # a cancel sets the resume Event too, so this always ends
                group.send(signal.SIGCONT)
                ctx.log.info("resumed: process group %d continued", group.pgid)
                continue
            idle(POLL_INTERVAL)
            if group.leader_exited():
                pump.drain(EXIT_DRAIN)  # usually at end of file already
                group.end(kill_grace, idle)  # background processes it left in its group
                pump.drain(EXIT_DRAIN)
                outcome = Outcome(group.reap(), cancelled=False)
                break
        finished = True
    finally:
        if not group.reaped:  # an exception (e.g. from a handler): leave nothing running
            group.send(signal.SIGKILL)
            group.reap()
        pump.close(dispatch=finished)
    return outcome
