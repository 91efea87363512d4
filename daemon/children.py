"""Executor subprocesses: start them, hand them attempts, steer them, end their process trees.

By default every attempt of every task runs in a fresh process, so killing one task's process never
touches another task: a fork of a launcher, a long-lived executor process that never runs executor
code itself (`tasks_per_process` > 1 instead lets a process run several attempts, one at a time).
Launchers and those processes are started with the "forkserver" method by default: each is a fork
of a small, warm server that has already imported the executor machinery, which is much faster than
"spawn" while still never forking the supervisor itself (its threads, sockets and SQLite
connection). "fork" is refused for that reason, and because a forked child would inherit every
other task's pipes.

Processes are found again by pid *and* start time (daemon/processes.py), so a reused pid is never
mistaken for an executor.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

import psutil
import structlog

from daemon import paths, pipes, processes
from executors import assignment, channel, endpoint, steering

if TYPE_CHECKING:
    from daemon.models import Task

START_METHODS = ("forkserver", "spawn")
# Every child would import these on its own otherwise (found by perf on the peers benchmark):
# preloaded, W1 went from 172 to 203 tasks/s. The CLI is not among them: a launcher's heap is
# copied page by page into each attempt's fork, and `fredica daemon` keeps multiprocessing from
# importing the CLI into its children (daemon.service._children_skip_the_cli).
FORKSERVER_PRELOAD = [
    "executors.endpoint",
    "executors.base",
    "daemon.models",
    "pkgutil",
    "multiprocessing.popen_forkserver",
    "multiprocessing.popen_fork",
    "multiprocessing.synchronize",
]
log = structlog.get_logger("fredica.supervisor")
SEND_STALL = 2.0  # seconds an executor process may read nothing of a task being sent to it

ExecutorContext = ForkServerContext | SpawnContext


def make_context(start_method: str = "forkserver", preload: Sequence[str] = ()) -> ExecutorContext:
    """The multiprocessing context executors are started with ("forkserver" or "spawn").

    `preload` names more modules for the fork server to import once (the registered executors'
    modules), so that no child imports them again. It only counts before the server's first start.
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start method must be one of {', '.join(START_METHODS)}, not {start_method!r}")
    if start_method == "spawn":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(dict.fromkeys([*FORKSERVER_PRELOAD, *preload])))
    return context


class Drained(NamedTuple):
    """What one `ExecutorProcess.drain` read: the attempt's messages, whether more may come, and,
    for a launcher, the exit status of the attempt's fork once the launcher has reported it."""

    messages: list[dict[str, Any]]
    open: bool
    fork_exitcode: int | None = None  # None: no report (yet, or not a launcher)


@dataclasses.dataclass(eq=False)
class ExecutorProcess:
    """One executor process: its pipes (assignments and control commands in, status out) and its
    current attempt.

    It is started idle (`start_process`), waiting on its assignment pipe, and is given attempts one
    at a time. A launcher (`fork_each`) runs each in a fresh fork of itself, forked ahead of its
    task, and reports on a pipe of its own ("forked", "exited"); the pid recorded for the task is
    the fork's. Otherwise the process runs them itself: with `last=True` it exits after that
    attempt, else it reports the result and waits for the next one (`tasks_per_process`).
    """

    process: BaseProcess
    status: channel.StatusReader
    control: Connection  # our end of the pipe cancel, pause and resume commands go down
    pid: int
    create_time: float | None  # None if the child was gone before it could be looked at
    assignments: Connection | None  # our end of the pipe attempts are sent on; None after the last
    reports: channel.StatusReader | None = None  # a launcher's own messages; None: not a launcher
    attempt_pid: int | None = None  # a launcher's fork waiting for the next attempt
    awaiting_report: bool = False  # a launcher whose last attempt's exit it has not reported yet
    # The process running the current attempt, by pid and start time: the launcher's fork, or
    # this process itself. Stop escalation signals its tree, never a launcher's.
    attempt_process: tuple[int, float | None] | None = None
    task_id: str | None = None  # the attempt it runs or ran last
    log_path: Path | None = None
    attempts: int = 0  # attempts assigned so far
    last: bool = False  # the current attempt is its last: it exits after reporting
    # The sentinel becomes ready exactly when the process has ended and been reaped (the fork
    # server's status pipe), so "not ready" answers is_alive with one poll(2) instead of
    # multiprocessing's selector; a spawned child's sentinel can also be held open by a grandchild.
    sentinel_exact: bool = False
    _descendants: dict[int, psutil.Process] = dataclasses.field(default_factory=dict, repr=False)
    _exitcode: int | None = dataclasses.field(default=None, repr=False)
    _closed: bool = dataclasses.field(default=False, repr=False)

    # --- attempts -------------------------------------------------------------------------------

    @property
    def attempt_token(self) -> str:
        """Names the current attempt in control commands: a command meant for an earlier attempt
        (the same task's, before a retry, included) can never steer this one."""
        return f"{self.task_id}#{self.attempts}"

    def next_attempt_process(self) -> tuple[int, float | None]:
        """The pid and start time of the process the next attempt will run in, to record first
        (a launcher's waiting fork: its start is read from /proc, once per attempt). OSError for
        a launcher with no waiting fork: recording the launcher instead would have a stop end
        its whole tree."""
        if not self.fork_each:
            return self.pid, self.create_time
        if self.attempt_pid is None:
            raise OSError(f"executor launcher {self.pid} has no fork waiting for a task")
        return self.attempt_pid, processes.start_time(self.attempt_pid)

    def assign(
        self,
        task: Task,
        executor_ref: str,
        upstream: Mapping[str, Any],
        log_path: Path,
        *,
        last: bool,
        process: tuple[int, float | None] | None = None,
        limits: assignment.Limits = assignment.Limits(),
    ) -> "ExecutorProcess":
        """Send the process its next attempt; OSError if it has died or was given its last one.

        `process`: what `next_attempt_process` told the caller, who recorded it (looked up if None).
        `limits`: what the attempt may leave; its status channel refuses longer messages.
        """
        if self.assignments is None:
            raise OSError(f"executor process {self.pid} takes no more tasks")
        log_path = Path(log_path)
        paths.private_dir(log_path.parent)  # a stat per attempt: it nearly always exists
        self._descendants.clear()  # an earlier attempt's: stop escalation is for this one's tree
        self.task_id, self.log_path, self.last = task.id, log_path, last
        self.attempt_process = process if process is not None else self.next_attempt_process()
        self.awaiting_report = self.fork_each
        self.attempts += 1
        self.status.max_message = channel.frame_limit(limits.result_bytes)
        message = assignment.Assignment(task, executor_ref, dict(upstream), str(log_path), self.attempt_token, last, limits)
        try:
            pipes.send_within(self.assignments.fileno(), pickle.dumps(message, pickle.HIGHEST_PROTOCOL), SEND_STALL)
        finally:
            if last:
                self.assignments.close()
                self.assignments = None
        return self

    def dismiss(self, timeout: float = 2.0) -> None:
        """End an idle process: it exits when its assignment pipe closes (killed if it does not)."""
        if self.assignments is not None:
            self.assignments.close()
            self.assignments = None
        if self.reap(timeout) is None:
            self.kill()
            self.reap(timeout)
        self.close()

    # --- the status channel ---------------------------------------------------------------------

    @property
    def fork_each(self) -> bool:
        """A launcher: each attempt runs in a fresh fork of it."""
        return self.reports is not None

    def drain(self, limit: int | None = None, *, check_exit: bool = True) -> Drained:
        """Read up to `limit` messages (all available if None) without blocking; never raises.

        Once the child has exited and its messages are read, the channel counts as closed even if
        a descendant inherited its end of the pipe: nothing the child wrote can still be missing.
        A launcher's report of its fork's exit comes on a pipe of its own, which no attempt can
        write: an "exited" message on the status channel is the attempt's, and no exit. `check_exit`
        False skips asking whether the process has exited (a poll of its sentinel), for a caller
        that knows it had not.
        """
        # Looked at before reading: if the child had exited by then, all it wrote is in the pipe.
        exited = check_exit and not self.is_alive()
        fork_exitcode = self._exit_report() if self.reports is not None else None
        if fork_exitcode is not None:
            # The fork has exited, so all it wrote is in the pipe: read it to the end, and drop
            # the start of a message it was killed in the middle of.
            messages = self.status.drain(None)
            self.status.discard_partial()
            return Drained(messages, not self.status.closed, fork_exitcode)
        messages = self.status.drain(limit)
        if exited and not self.status.closed and (limit is None or len(messages) < limit):
            self.status.mark_closed("the executor process exited")
        return Drained(messages, not self.status.closed)

    def _exit_report(self) -> int | None:
        """The exit status of the launcher's last fork, if its report has come (-1 if the report
        does not say one); the next fork's pid is noted."""
        assert self.reports is not None
        for report in self.reports.drain(1):
            if report.get("type") == "exited":
                next_pid, code = report.get("next_pid"), report.get("exitcode")
                self.attempt_pid = next_pid if _is_int(next_pid) else None
                self.awaiting_report = False
                return code if _is_int(code) else -1
        return None

    def settled(self) -> bool:
        """Ready for an attempt: not a launcher, or one that has reported its last attempt's exit
        (and so announced the fork that waits for the next). Reads its report if it has come."""
        if self.reports is not None and self.awaiting_report and not self._closed:
            # Only the report can be left: the attempt's result was its last word.
            fork_exitcode = self.drain(100).fork_exitcode
            if fork_exitcode not in (0, None):
                log.warning("executor_exit_after_result", pid=self.pid, task_id=self.task_id,
                            exit=describe_exit(fork_exitcode))
            if self.awaiting_report and not self.is_alive():
                self.awaiting_report = False  # died before reporting: nothing more will come
        return not self.awaiting_report

    @property
    def ending(self) -> bool:
        """A launcher that announced no next fork (its waiting fork died): it is exiting."""
        return self.fork_each and self.attempt_pid is None

    def usable(self) -> bool:
        """Alive and able to take an attempt once settled: not a launcher that is ending. Reads a
        report an idle launcher sent about its waiting fork's death."""
        if self.reports is not None and not self.awaiting_report and not self._closed:
            self._exit_report()
        return not self.ending and self.is_alive()

    def fds(self) -> list[Any]:
        """What to wait on for news of this process: its sentinel and open channels."""
        handles: list[Any] = [self.sentinel]
        if not self.status.closed:
            handles.append(self.status)
        if self.reports is not None and not self.reports.closed:
            handles.append(self.reports)
        return handles

    # --- steering -------------------------------------------------------------------------------

    def request_cancel(self, reason: str = "cancel") -> None:
        """Ask the attempt to stop; wakes it if paused (cancel is set first, so it sees why).
        `reason` ("cancel", "timeout" or "shutdown") is for the line its log ends with."""
        self._command("cancel", reason)

    def pause(self) -> None:
        """Pause a pausable attempt at its next `wait_if_paused`."""
        self._command("pause")

    def resume(self) -> None:
        """Let a paused attempt continue."""
        self._command("resume")

    def _command(self, kind: str, reason: str | None = None) -> None:
        # Never blocks: the pipe is full only if the process stopped reading it (stuck or dead),
        # and then stop escalation's signals are what ends the attempt.
        if self.task_id is None:
            return
        try:
            os.write(self.control.fileno(), steering.command(kind, self.attempt_token, reason))
        except OSError as exc:
            log.warning("executor_command_lost", command=kind, pid=self.pid, task_id=self.task_id, error=str(exc))

    # --- the process ----------------------------------------------------------------------------

    @property
    def sentinel(self) -> int:
        """Becomes readable when the process ends (the loop waits on it with daemon.pipes.ready)."""
        return self.process.sentinel

    def is_alive(self) -> bool:
        """True while the executor process runs."""
        return self.exitcode is None

    @property
    def exitcode(self) -> int | None:
        """The exit status once ended: >= 0 an exit code, < 0 the signal that killed it."""
        # Kept once known: reaping reads the status out of a fork-server child's sentinel, which
        # is then not readable again until the fork server closes its end (under load, later).
        if self._closed or self._exitcode is not None:
            return self._exitcode
        if self.sentinel_exact and not channel.poll_now(self.sentinel):
            return None
        self._exitcode = self.process.exitcode
        return self._exitcode

    def reap(self, timeout: float | None = 0.0) -> int | None:
        """Wait up to `timeout` for the process to end; its exit status, or None if still running."""
        if self._closed or self._exitcode is not None:
            return self._exitcode
        self.process.join(timeout)
        self._exitcode = self.process.exitcode
        return self._exitcode

    def terminate_tree(self) -> None:
        """SIGTERM the executor process and all its descendants."""
        self._signal_tree(signal.SIGTERM)

    def kill_tree(self) -> None:
        """SIGKILL the executor process and all its descendants (those seen by terminate_tree too)."""
        self._signal_tree(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the attempt's tree and the process itself: a launcher is not in its attempt's tree."""
        self.kill_tree()
        self.process.kill()

    def close(self) -> None:
        """Release the channels and the process handle; call once the process has ended."""
        if self._closed:
            return
        if self.assignments is not None:
            self.assignments.close()
            self.assignments = None
        self.status.close()
        if self.reports is not None:
            self.reports.close()
        if not self.control.closed:
            self.control.close()
        self._exitcode = self.reap(0.0)
        if self._exitcode is not None:
            self.process.close()
            self._closed = True

    def _signal_tree(self, sig: signal.Signals) -> None:
        root = self._root()
        if root is not None:
            for proc in processes.descendants(root):
                self._descendants.setdefault(proc.pid, proc)
        # Descendants seen earlier are signalled even if the root is gone: a grandchild that
        # ignored SIGTERM still gets the SIGKILL. psutil refuses to signal a reused pid.
        targets = [root] if root is not None else []
        processes.send(sig, [*targets, *self._descendants.values()])

    def _root(self) -> psutil.Process | None:
        if self.fork_each:
            if self.attempt_process is None:
                return None
            pid, create_time = self.attempt_process
            return processes.find_leftover(pid, create_time) if create_time is not None else None
        if self.create_time is not None:
            return processes.find_leftover(self.pid, self.create_time)
        if self.is_alive():
            try:
                return psutil.Process(self.pid)
            except psutil.Error:
                return None
        return None


def start_process(context: ExecutorContext, *, fork_each: bool = False) -> ExecutorProcess:
    """Start an idle executor process, waiting for its first attempt (see `ExecutorProcess`).

    Starting a process costs milliseconds (the fork server's round trip, the child's set-up); the
    supervisor starts one ahead of time (`warm_spare`), so dispatch is one message.
    """
    # Pipe(duplex=False) is (reader, writer): attempts and commands go down, status and reports come up.
    assignments_in, assignments = context.Pipe(duplex=False)
    control_in, control = context.Pipe(duplex=False)
    status, status_out = context.Pipe(duplex=False)
    reports, reports_out = context.Pipe(duplex=False) if fork_each else (None, None)
    ours = [c for c in (assignments, control, status, reports) if c is not None]
    theirs = [c for c in (assignments_in, control_in, status_out, reports_out) if c is not None]
    process = context.Process(
        target=endpoint.serve,
        args=(assignments_in, control_in, status_out, reports_out),
        name="fredica-executor",
        # Not daemonic: a daemonic process may not start multiprocessing children of its own,
        # and executors may need to. The supervisor ends its children explicitly.
        daemon=False,
    )
    try:
        process.start()
    except BaseException:
        for connection in ours:
            connection.close()
        raise
    finally:
        # Our copies of the child's ends must go: the readers would never see end-of-file, and the
        # child would never see its assignment pipe close.
        for connection in theirs:
            connection.close()
    os.set_blocking(control.fileno(), False)
    os.set_blocking(assignments.fileno(), False)  # see pipes.send_within
    pid = process.pid
    assert pid is not None
    started = ExecutorProcess(
        process=process,
        status=channel.StatusReader(status),
        control=control,
        pid=pid,
        create_time=processes.start_time(pid),
        assignments=assignments,
        reports=channel.StatusReader(reports) if reports is not None else None,
        sentinel_exact=isinstance(context, ForkServerContext),
    )
    if fork_each:
        started.attempt_pid = _first_fork(started)
    return started


def _first_fork(launcher: ExecutorProcess, timeout: float = 30.0) -> int:
    """The pid a new launcher announces for its first fork (OSError if it does not)."""
    assert launcher.reports is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not launcher.reports.closed:
        for message in launcher.reports.drain(1):
            if message.get("type") == "forked" and _is_int(message.get("pid")):
                return message["pid"]
        pipes.ready([launcher.reports, launcher.sentinel], max(0.0, deadline - time.monotonic()))
    launcher.dismiss()
    raise OSError(f"executor launcher {launcher.pid} did not start ({describe_exit(launcher.exitcode)})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def spawn(
    task: Task,
    executor_ref: str,
    upstream: Mapping[str, Any],
    log_path: Path,
    *,
    context: ExecutorContext,
    limits: assignment.Limits = assignment.Limits(),
) -> ExecutorProcess:
    """Start a fresh executor process for one attempt of `task`; its output goes to `log_path`."""
    return start_process(context).assign(task, executor_ref, upstream, Path(log_path), last=True, limits=limits)


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, for people: "exit code 3", "killed by SIGKILL"."""
    if exitcode is None:
        return "still running"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"


def tail(path: Path | str, lines: int = 20, *, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log file (reading at most `max_bytes` from its end); "" if none."""
    if lines <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            block = 8192
            data = b""
            position = size
            # Read backwards block by block until there are enough lines or the budget is spent.
            while position > 0 and data.count(b"\n") <= lines and len(data) < max_bytes:
                step = min(block, position, max_bytes - len(data))
                position -= step
                f.seek(position)
                data = f.read(step) + data
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])
