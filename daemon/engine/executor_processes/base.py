"""What every kind of executor process has: its pipes, its exit, its steering, its process tree.

The supervisor's loop talks to this interface only; each kind (a launcher that forks a fresh
process per attempt, a process reused for several attempts) fills in how an attempt's process is
named and recorded (`next_attempt_process`, `_root`), how its end is learnt (`_attempt_exit`) and
whether it takes another attempt (`takes_another`).

Processes are found again by pid *and* start time (daemon/processes.py), so a reused pid is never
mistaken for an executor.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import pickle
import signal
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, NamedTuple, Sequence

import psutil
import structlog

from daemon import paths, pipes, processes
from executors import assignment, channel, framing, steering

if TYPE_CHECKING:
    from daemon.engine.attempt import Attempt
    from daemon.models import Task

START_METHODS = ("forkserver", "spawn")
# Every child would import these on its own otherwise (found by perf on the peers benchmark):
# preloaded, W1 went from 172 to 203 tasks/s. The CLI is not among them: a launcher's heap is
# copied page by page into each attempt's fork, and `fredica daemon` keeps multiprocessing from
# importing the CLI into its children (daemon.service._children_skip_the_cli).
FORKSERVER_PRELOAD = [
    "executors.endpoint",
    "executors.event_loop",
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


class Ahead(NamedTuple):
    """An attempt sent ahead (prefetch, SPEC §15): what becomes the current attempt's once the
    process says it has started it."""

    task_id: str
    number: int
    log_path: Path
    last: bool
    attempt_process: tuple[int, float | None]


class Drained(NamedTuple):
    """What one `ExecutorProcess.drain` read: the attempt's messages, whether more may come, and
    the exit status of the attempt's process once it has exited (a launcher's fork, as the
    launcher reported it, or the executor process itself) and all it wrote has been read."""

    messages: list[dict[str, Any]]
    open: bool
    exitcode: int | None = None  # None: still running, or not all of it read yet


@dataclasses.dataclass(eq=False)
class ExecutorProcess:
    """One executor process: its pipes (assignments and control commands in, status out) and its
    current attempt. Started idle (`start_process`), waiting on its assignment pipe, it is given
    attempts one at a time."""

    kind: ClassVar[str] = ""  # "fresh", "reused" or "event_loop": what the pools keep apart
    holds_many: ClassVar[bool] = False  # several attempts at once (their tree is shared)

    process: BaseProcess
    status: channel.StatusReader
    control: Connection  # our end of the pipe cancel, pause and resume commands go down
    pid: int
    create_time: float | None  # None if the child was gone before it could be looked at
    assignments: Connection | None  # our end of the pipe attempts are sent on; None after the last
    # The process running the current attempt, by pid and start time: a launcher's fork, or this
    # process itself. Stop escalation signals its tree, never a launcher's.
    attempt_process: tuple[int, float | None] | None = None
    task_id: str | None = None  # the attempt it runs or ran last
    log_path: Path | None = None
    attempts: int = 0  # attempts assigned so far
    number: int = 0  # the current attempt's among them (1 for its first): its token's
    last: bool = False  # the current attempt is its last: it exits after reporting
    # Prefetch (SPEC §15): attempts sent ahead of the current one, by token, neither started nor
    # revoked yet. Once any was sent (`sent_ahead`), "started" and "revoked" name their attempt.
    ahead: dict[str, Ahead] = dataclasses.field(default_factory=dict)
    sent_ahead: bool = False
    # The sentinel becomes ready exactly when the process has ended and been reaped (the fork
    # server's status pipe), so "not ready" answers is_alive with one poll(2) instead of
    # multiprocessing's selector; a spawned child's sentinel can also be held open by a grandchild.
    sentinel_exact: bool = False
    _descendants: dict[int, psutil.Process] = dataclasses.field(default_factory=dict, repr=False)
    # Assignments not yet written, written as the pipe takes them (`send_more`): a process that
    # runs attempts reads its next only once the one before it is over, so nothing sent ahead
    # may wait for it (an event-loop process's are never waited for either).
    _outgoing: collections.deque[memoryview] = dataclasses.field(default_factory=collections.deque, repr=False)
    _exitcode: int | None = dataclasses.field(default=None, repr=False)
    _closed: bool = dataclasses.field(default=False, repr=False)

    # --- what each kind says --------------------------------------------------------------------

    def next_attempt_process(self) -> tuple[int, float | None]:
        """The pid and start time of the process the next attempt will run in, to record first."""
        raise NotImplementedError

    def takes_another(self, attempt: Attempt) -> bool:
        """Whether, its `attempt` having reported, the process can be given another."""
        raise NotImplementedError

    def _root(self) -> psutil.Process | None:
        """The root of the current attempt's process tree, if it is still there."""
        raise NotImplementedError

    def watch(self, now: float) -> float | None:
        """Look at the process itself (not its attempts); when to look again (None: no need)."""
        return None

    def _attempt_exit(self) -> int | None:
        """The attempt's exit status if its process has exited and reported it apart from its
        status channel (a launcher's fork); None otherwise."""
        return None

    # Idle processes: whether one is ready for an attempt. Only a launcher can be on its way
    # (reporting its last fork's exit), or be ending.
    awaiting_report: bool = False
    reports: channel.StatusReader | None = None

    def settled(self) -> bool:
        """Ready for an attempt once its last one's end is known (see the launcher's)."""
        return True

    @property
    def ending(self) -> bool:
        """Exiting of its own accord (see the launcher's)."""
        return False

    def usable(self) -> bool:
        """Alive and able to take an attempt once settled."""
        return self.is_alive()

    # --- attempts -------------------------------------------------------------------------------

    @property
    def attempt_token(self) -> str:
        """Names the current attempt in control commands: a command meant for an earlier attempt
        (the same task's, before a retry, included) can never steer this one."""
        return self.token_of(self.task_id, self.number)

    def token_of(self, task_id: str | None, number: int) -> str:
        """The token of the `number`-th attempt assigned to this process, of `task_id`."""
        return f"{task_id}#{number}"

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
        cancel_grace: float = 5.0,
        prefetched: bool = False,
        prefetching: bool = False,
        after: str | None = None,
    ) -> str:
        """Send the process its next attempt; the attempt's token. OSError if it has died or was
        given its last one.

        `process`: what `next_attempt_process` told the caller, who recorded it (looked up if None).
        `limits`: what the attempt may leave; its status channel refuses longer messages.
        `cancel_grace`: how long an event-loop process lets a cancelled attempt end by itself.
        `prefetched`: sent ahead, behind the current attempt, which stays current until the process
        says it has started this one (`begin_ahead`). `prefetching`: its queue sends tasks ahead.
        `after`: in a process that holds several, the attempt this one follows.
        """
        if self.assignments is None:
            raise OSError(f"executor process {self.pid} takes no more tasks")
        log_path = Path(log_path)
        paths.private_dir(log_path.parent)  # a stat per attempt: it nearly always exists
        attempt_process = process if process is not None else self.next_attempt_process()
        self.attempts += 1
        token = self.token_of(task.id, self.attempts)
        if prefetched and self.holds_many:
            pass  # no attempt of it is "current": every message names its own
        elif prefetched:
            self.ahead[token] = Ahead(task.id, self.attempts, log_path, last, attempt_process)
            self.sent_ahead = True
        else:
            self._descendants.clear()  # an earlier attempt's: stop escalation is for this one's tree
            self.task_id, self.log_path, self.last, self.number = task.id, log_path, last, self.attempts
            self.attempt_process = attempt_process
            self._assigned()
        self.status.max_message = channel.frame_limit(limits.result_bytes)
        message = assignment.Assignment(
            task, executor_ref, dict(upstream), str(log_path), token, last, limits, cancel_grace,
            prefetched=prefetched, prefetching=prefetching, after=after,
        )
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        try:
            if prefetched or self._outgoing:  # behind what is still to be written, in order
                self._queue(data)
            else:
                self._send(data)
        finally:
            if last:
                self.assignments.close()
                self.assignments = None
        return token

    def _assigned(self) -> None:
        """What a kind notes when an attempt is sent."""

    def _send(self, data: bytes) -> None:
        """Write one assignment: its process reads it before anything else (OSError if it stalls)."""
        assert self.assignments is not None
        if self._outgoing:  # one sent ahead and taken back is still being written: it goes first
            self._finish_outgoing(SEND_STALL)
        pipes.send_within(self.assignments.fileno(), data, SEND_STALL)

    def _finish_outgoing(self, stall: float) -> None:
        """Write what `_queue` left unwritten, waiting for the process to read it (OSError if it
        reads none of it for `stall` seconds)."""
        while self._outgoing and self.assignments is not None:
            self.send_more()
            if self._outgoing and not pipes.ready([], stall, writable=[self.assignments.fileno()]):
                raise OSError(f"the executor process read none of its task for {stall:g} s")

    def _queue(self, data: bytes) -> None:
        """Write one assignment as far as the pipe takes it now; the rest follows (`send_more`)."""
        self._outgoing.append(memoryview(framing.header(len(data), long_sizes=True) + data))
        self.send_more()

    def unsent(self) -> int | None:
        """The assignment pipe's fd while what was assigned is not all written (None: it is)."""
        return self.assignments.fileno() if self._outgoing and self.assignments is not None else None

    def send_more(self) -> None:
        """Write more of what was assigned, as far as the pipe takes it without waiting."""
        while self._outgoing and self.assignments is not None:
            head = self._outgoing[0]
            try:
                written = os.write(self.assignments.fileno(), head)
            except BlockingIOError:
                return
            except OSError:
                self._outgoing.clear()  # gone: its exit, read from its sentinel, ends its attempts
                return
            if written < len(head):
                self._outgoing[0] = head[written:]
                return
            self._outgoing.popleft()

    def begin_ahead(self, token: str) -> None:
        """The process says it has started `token`, sent ahead: that is its current attempt now."""
        sent = self.ahead.pop(token, None)
        if sent is None:
            return
        self._descendants.clear()
        self.task_id, self.number, self.log_path, self.last, self.attempt_process = sent

    def route(self, message: dict[str, Any], attempts: Mapping[str, Attempt], now: float) -> Attempt | None:
        """The attempt, of those it holds (by token), that `message` is for: its only one, unless
        attempts were sent ahead (then "started" and "revoked" name theirs, and the rest are the
        current attempt's)."""
        if not self.sent_ahead:
            return next(iter(attempts.values()), None)
        kind = message.get("type")
        if kind in ("started", "revoked"):
            token = message.pop("attempt", None)
            if not isinstance(token, str):
                return None
            if kind == "started":
                self.begin_ahead(token)
            else:
                self.ahead.pop(token, None)
            return attempts.get(token)
        return attempts.get(self.attempt_token)

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

    def drain(self, limit: int | None = None, *, check_exit: bool = True) -> Drained:
        """Read up to `limit` messages (all available if None) without blocking; never raises.

        Once the process has exited and its messages are read, the channel counts as closed even
        if a descendant inherited its end of the pipe: nothing it wrote can still be missing.
        `check_exit` False skips asking whether the process has exited (a poll of its sentinel),
        for a caller that knows it had not.
        """
        # Looked at before reading: if the child had exited by then, all it wrote is in the pipe.
        exited = check_exit and self._has_exited()
        exitcode = self._attempt_exit()
        if exitcode is not None:
            # The attempt's process has exited, so all it wrote is in the pipe: read it to the
            # end, and drop the start of a message it was killed in the middle of.
            messages = self.status.drain(None)
            self.status.discard_partial()
            return Drained(messages, not self.status.closed, exitcode)
        messages = self.status.drain(limit)
        if exited and not self.status.closed and (limit is None or len(messages) < limit):
            self.status.mark_closed("the executor process exited")
        if self.status.closed and not self.is_alive():
            code = self.exitcode
            return Drained(messages, False, code if code is not None else -1)
        return Drained(messages, not self.status.closed)

    def _has_exited(self) -> bool:
        """True once the process has ended and been reaped."""
        if not self.is_alive():
            return True
        if not self.sentinel_exact and channel.poll_now(self.sentinel):
            # A spawned child's sentinel fires a moment before it can be reaped (it is still in its
            # exit path): wait for it here rather than spin the loop until then. A fork-server
            # child's fires only once it has been reaped, which is_alive has just said it has not.
            self.reap(0.1)
            return not self.is_alive()
        return False

    def fds(self) -> list[Any]:
        """What to wait on for news of this process: its sentinel and open channels."""
        handles: list[Any] = [self.sentinel]
        if not self.status.closed:
            handles.append(self.status)
        if self.reports is not None and not self.reports.closed:
            handles.append(self.reports)
        return handles

    # --- steering -------------------------------------------------------------------------------

    def request_cancel(self, reason: str = "cancel", token: str | None = None) -> None:
        """Ask the attempt to stop; wakes it if paused (cancel is set first, so it sees why).
        `reason` ("cancel", "timeout" or "shutdown") is for the line its log ends with."""
        self._command("cancel", token, reason)

    def pause(self, token: str | None = None) -> None:
        """Pause a pausable attempt at its next `wait_if_paused`."""
        self._command("pause", token)

    def resume(self, token: str | None = None) -> None:
        """Let a paused attempt continue."""
        self._command("resume", token)

    def revoke(self, token: str) -> None:
        """Take back an attempt sent ahead, unless it has started (SPEC §15)."""
        self._command("revoke", token)

    def _command(self, kind: str, token: str | None, reason: str | None = None) -> None:
        # Never blocks: the pipe is full only if the process stopped reading it (stuck or dead),
        # and then stop escalation's signals are what ends the attempt.
        if self.task_id is None:
            return
        try:
            os.write(self.control.fileno(), steering.command(kind, token or self.attempt_token, reason))
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

    def terminate_attempt(self) -> None:
        """SIGTERM the attempt's process and all its descendants."""
        self._signal_tree(signal.SIGTERM)

    def kill_attempt(self) -> None:
        """SIGKILL the attempt's process and all its descendants (those seen by terminate_attempt too)."""
        self._signal_tree(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the attempt's tree and the process itself: a launcher is not in its attempt's tree."""
        self.kill_attempt()
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


def open_pipes(context: ExecutorContext, *, reports: bool) -> tuple[list[Connection | None], list[Connection | None]]:
    """The pipes of a new executor process: (ours, the child's), each as (assignments, control,
    status, reports); reports only for a launcher. Pipe(duplex=False) is (reader, writer):
    attempts and commands go down, status and reports come up."""
    assignments_in, assignments = context.Pipe(duplex=False)
    control_in, control = context.Pipe(duplex=False)
    status, status_out = context.Pipe(duplex=False)
    reports_in, reports_out = context.Pipe(duplex=False) if reports else (None, None)
    return [assignments, control, status, reports_in], [assignments_in, control_in, status_out, reports_out]


def start_child(
    context: ExecutorContext, target: Any, *, reports: bool, extra: tuple[Any, ...] = ()
) -> tuple[BaseProcess, list[Connection | None]]:
    """Start an executor process running `target(assignments, control, status[, reports], *extra)`;
    the process and our ends of its pipes (as `open_pipes`)."""
    ours, theirs = open_pipes(context, reports=reports)
    process = context.Process(
        target=target,
        args=(*[end for end in theirs if end is not None], *extra),
        name="fredica-executor",
        # Not daemonic: a daemonic process may not start multiprocessing children of its own,
        # and executors may need to. The supervisor ends its children explicitly.
        daemon=False,
    )
    try:
        process.start()
    except BaseException:
        for connection in ours:
            if connection is not None:
                connection.close()
        raise
    finally:
        # Our copies of the child's ends must go: the readers would never see end-of-file, and the
        # child would never see its assignment pipe close.
        for connection in theirs:
            if connection is not None:
                connection.close()
    assignments, control = ours[0], ours[1]
    assert assignments is not None and control is not None
    os.set_blocking(control.fileno(), False)
    os.set_blocking(assignments.fileno(), False)  # see pipes.send_within
    return process, ours


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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
