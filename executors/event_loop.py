"""The event-loop executor process (SPEC §15): many attempts of `async def` executors at once, on
one asyncio loop. Its entry point `serve` is started as `endpoint.serve` is.

Wire contract with the supervisor (the pipes `daemon.engine.executor_processes.start_process` makes):

- assignments (supervisor → process): pickled `executors.assignment.Assignment`s, each framed as
  `Connection.send_bytes` frames it (`daemon.pipes.send_within`). Send as many as the process
  should hold: each is started at once, as an asyncio task, unless it is `prefetched` (sent ahead,
  SPEC §15): that one waits behind the attempt its `after` names, and starts when that one is over
  (at once if it is already), saying {"type": "started", "attempt"} first; a "revoke" command
  takes it back before that ({"type": "revoked", "attempt"}; `executors.ahead`). `assignment.last` is ignored;
  `assignment.cancel_grace` is used (below). Closing this pipe dismisses the process: it takes no
  more, and exits (code 0) once every attempt it holds has sent its result.
- control (supervisor → process): the commands of `executors.steering.command`, `{"type": cancel |
  pause | resume, "attempt": token, "reason"}`. A command for an attempt not started yet (its
  assignment still in the pipe) is kept for it (up to PENDING_ATTEMPTS attempts). The hang-up of
  this pipe says the daemon is gone: every attempt's coroutine is cancelled, its log ends with
  `_parent.ORPHANED`, nothing more is sent, and the process exits (code 1) within ORPHAN_GRACE
  seconds, or within twice that, ended by a thread, if an attempt blocks the loop.
- status (process → supervisor): `executors.channel` frames. `{"type": "alive"}` when the loop
  starts and then every `heartbeat_interval` seconds (1 s by default), sent from the loop itself,
  so that a gap longer than the queue's `loop_block_limit` means an attempt blocks the loop. Every
  other message is one of `executors.base`'s (progress, pausable, pause_request, resume_request,
  log, result) with `"attempt": token` added; an attempt's result is its last message. Writes
  block while the pipe is full, and the whole loop (heartbeat included) with them: judge a gap
  only from what the supervisor could have read meanwhile.

An attempt: its log (`assignment.log_path`) starts and ends with the same lines as in the other
kind of process (`endpoint.last_line`) and is kept within `limits.log_bytes`; its result is
checked as there (`endpoint.result_message`, `limits.result_bytes`). An exception, or a result that
cannot be stored, is that attempt's result alone. A cancel sets `ctx.cancelled` and wakes a paused
wait; after `cancel_grace` seconds the coroutine is cancelled (CancelledError, reported as
CANCELLED); one that swallows that too is reported CANCELLED after as long again, and left to run
unreported until the process exits.

Where output goes: fds 1 and 2 are the process's, shared by all its attempts, so they are not
pointed at any log; they stay as the daemon left them (its stderr). `print()` (sys.stdout and
sys.stderr) and the root logger write to the log of the attempt whose code calls them, found
through the asyncio task's context (`output.CURRENT_LOG`); what is written to fds 1 and 2
directly (commands started without redirecting their output, C extensions) reaches the daemon's
stderr. Processes an attempt starts and leaves running are ended when the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import pickle
import select
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Mapping, NoReturn

from daemon import models
from executors import framing, registry
from executors.ahead import WaitingBehind
from executors._parent import ORPHANED, adopt_orphans, daemon_gone, end_leftovers
from executors._process import cancelled_result
from executors.assignment import Assignment
from executors.base import AsyncTaskContext, ExecuteResult, StatusSink
from executors.channel import READ_CHUNK, StatusQueue
from executors.endpoint import AttemptChannel, encoded_result, error_message, last_line, prepare_process, result_message
from executors.output import CURRENT_LOG, AttemptLog, route_to_attempt_logs
from executors.steering import Commands, Steered

HEARTBEAT_INTERVAL = 1.0
ORPHAN_GRACE = 1.0  # seconds the attempts of a dead daemon get to unwind their CancelledError
# Commands kept for attempts not started yet: a process holds many, and the assignment and the
# control pipe are read in no set order.
PENDING_ATTEMPTS = 1024
_ending = threading.Lock()  # one path ends the process; any other waits for the exit


def serve(
    assignments: Connection,
    control: Connection,
    status_connection: Connection,
    heartbeat_interval: float = HEARTBEAT_INTERVAL,
) -> NoReturn:
    """Entry point of an event-loop executor process (see the module's docstring)."""
    prepare_process()
    # A segfault (an extension module) ends every attempt here: its traceback goes to the
    # process's stderr, the daemon's, as no one attempt's log can be told apart.
    faulthandler.enable(file=2, all_threads=True)
    adopt_orphans()  # what attempts start and orphan is ours to end at the exit
    route_to_attempt_logs()
    status = StatusQueue(status_connection)
    process = EventLoopProcess(assignments.fileno(), control.fileno(), status, heartbeat_interval)
    status.on_broken = process.end_orphaned  # the supervisor is gone
    loop = asyncio.new_event_loop()
    exit_code = loop.run_until_complete(process.run())
    process.exit(exit_code)


class EventLoopProcess:
    """The loop's side of the process: reads both pipes, starts and steers attempts, beats."""

    def __init__(self, assignments_fd: int, control_fd: int, status: StatusQueue, heartbeat_interval: float) -> None:
        self.status = status
        self._assignments_fd = assignments_fd
        self._control_fd = control_fd
        self._heartbeat_interval = heartbeat_interval
        self.commands = Commands(PENDING_ATTEMPTS)
        self.commands.on_revoke = self._revoke
        self.behind = WaitingBehind()  # attempts sent ahead, not started
        # As `Connection.send_bytes` frames them (`daemon.pipes.send_within`): `executors.framing`.
        self._frames = framing.Frames(framing.UNBOUNDED, long_sizes=True)
        self.attempts: dict[str, Attempt] = {}
        self.orphaned = False  # the daemon is gone: nothing more is sent
        self._dismissed = False
        self._finished: asyncio.Future[int] | None = None

    async def run(self) -> int:
        """Serve until dismissed and idle (0) or the daemon is gone (1); the exit code."""
        loop = asyncio.get_running_loop()
        self._finished = loop.create_future()
        for fd in (self._assignments_fd, self._control_fd):
            os.set_blocking(fd, False)
        loop.add_reader(self._assignments_fd, self._read_assignments)
        loop.add_reader(self._control_fd, self._read_control)
        _watch_for_a_blocked_orphan(self._control_fd, self)
        heartbeat = loop.create_task(self._heartbeat())
        try:
            return await self._finished
        finally:
            heartbeat.cancel()

    async def _heartbeat(self) -> None:
        while not self.orphaned:
            self.status.put({"type": "alive"})
            await asyncio.sleep(self._heartbeat_interval)

    def _read_assignments(self) -> None:
        chunk = _read(self._assignments_fd)
        if chunk is None:
            return
        if not chunk:  # dismissed: no more attempts
            asyncio.get_running_loop().remove_reader(self._assignments_fd)
            self._dismissed = True
            self._finish_if_idle()
            return
        try:
            bodies = self._frames.bodies(chunk)
        except framing.Garbled:
            traceback.print_exc()  # as for an assignment that cannot be unpickled, below
            self.exit(1)
        for data in bodies:
            try:
                assignment: Assignment = pickle.loads(data)
            except Exception:
                # Only the supervisor writes here: an attempt it cannot name cannot be reported,
                # and waiting for it would hang; the process ends, all its attempts crashed.
                traceback.print_exc()
                self.exit(1)
            self._start(assignment)

    def _start(self, assignment: Assignment) -> None:
        if assignment.prefetched and not self.behind.arrive(assignment, self.attempts.__contains__):
            return  # it waits behind another, or was revoked already
        self._begin(assignment)

    def _begin(self, assignment: Assignment) -> None:
        if assignment.prefetched:  # said before any of its executor's code runs
            self.status.put({"type": "started", "attempt": assignment.attempt})
        attempt = Attempt(assignment, self)
        self.attempts[assignment.attempt] = attempt
        attempt.task = asyncio.get_running_loop().create_task(attempt.run(), name=assignment.attempt)
        self.commands.attach(attempt)  # after the task exists: a cancel kept for it may time it

    def _read_control(self) -> None:
        chunk = _read(self._control_fd)
        if chunk is None:
            return
        if chunk:
            self.commands.feed(chunk)
        else:
            self._orphan()

    def _revoke(self, token: str) -> None:
        answer, start = self.behind.revoke(token, self.attempts.__contains__)
        if answer:
            self.status.put({"type": "revoked", "attempt": token})
        for assignment in start:
            self._begin(assignment)

    def _orphan(self) -> None:
        """The daemon is gone: cancel every attempt, give them ORPHAN_GRACE to unwind, exit."""
        loop = asyncio.get_running_loop()
        self.orphaned = True
        self.behind.clear()
        for fd in (self._assignments_fd, self._control_fd):
            loop.remove_reader(fd)
        for attempt in self.attempts.values():
            attempt.abandon()
        self._finish_if_idle()
        loop.call_later(ORPHAN_GRACE, self.end_orphaned)

    def attempt_done(self, attempt: Attempt) -> None:
        """`attempt` has reported (or, orphaned, ended): the process may be done."""
        self.attempts.pop(attempt.token, None)
        self.commands.detach(attempt.token)
        if not self.orphaned:
            for follower in self.behind.ended(attempt.token):
                self._begin(follower)
        self._finish_if_idle()

    def _finish_if_idle(self) -> None:
        if self.attempts or self._finished is None or self._finished.done():
            return
        if self.orphaned:
            self._finished.set_result(1)
        elif self._dismissed:
            self._finished.set_result(0)

    def end_orphaned(self) -> NoReturn:
        """The daemon is gone: say so in the log of every attempt not ended yet, end every
        process they started, exit. Called from any thread (and by a broken status pipe)."""
        self.orphaned = True
        if not _ending.acquire(blocking=False):
            threading.Event().wait()  # another thread is at it, and exits
        try:
            attempts = list(self.attempts.values())
        except RuntimeError:  # changed by the loop's thread meanwhile (this is the watch thread)
            attempts = list(self.attempts.values())
        for attempt in attempts:
            attempt.log_orphaned()
        self.exit(1, holding_the_lock=True)

    def exit(self, code: int, *, holding_the_lock: bool = False) -> NoReturn:
        """End every process the attempts left, flush, and exit with `code`."""
        if not holding_the_lock and not _ending.acquire(blocking=False):
            threading.Event().wait()
        end_leftovers(wait=0.5)
        with contextlib.suppress(Exception):
            self.status.close()
        os._exit(code)


class Attempt(Steered):
    """One attempt on the loop: its Events, log, channel and coroutine."""

    def __init__(self, assignment: Assignment, process: EventLoopProcess) -> None:
        super().__init__(assignment.attempt)
        self.assignment = assignment
        self.token = assignment.attempt
        self._process = process
        self.cancel_event = asyncio.Event()
        self.resume_event = asyncio.Event()
        self.resume_event.set()  # set = running; a pause clears it
        self.channel = AttemptChannel(Tagged(process.status, self.token))
        self.task: asyncio.Task[None] | None = None
        self.log: AttemptLog | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._cancelled_by_us = False
        self.reported = False

    # --- steering (Steered: applied by the loop as commands arrive) -------------------------------

    def _set_cancel(self) -> None:
        if self.cancel_event.is_set():
            return  # a second cancel does not restart the grace
        self.cancel_event.set()
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(self.assignment.cancel_grace, self._cancel_coroutine))

    def _set_resume(self) -> None:
        self.resume_event.set()

    def _clear_resume(self) -> None:
        self.resume_event.clear()

    def _cancel_coroutine(self) -> None:
        """The grace is over and the attempt goes on: CancelledError in its coroutine."""
        if self.task is None or self.task.done() or self.reported:
            return
        self._cancelled_by_us = True
        self._line("WARNING", f"still running {self.assignment.cancel_grace:g} s after the cancel: its coroutine is cancelled")
        self.task.cancel()
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(self.assignment.cancel_grace, self._give_up))

    def _give_up(self) -> None:
        """It swallowed the CancelledError too: reported CANCELLED, left to run unreported."""
        if not self.reported:
            self._line("WARNING", "its coroutine ignored being cancelled: reported cancelled, left running unreported")
            self._report(result_message(cancelled_result(), self.assignment.limits.result_bytes))

    def abandon(self) -> None:
        """The daemon is gone: cancel the coroutine at once."""
        self._cancelled_by_us = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    # --- the attempt --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the attempt and report its result; never raises."""
        try:
            await self._run()
        except BaseException as exc:  # a bug of ours: still this attempt's result alone
            self._report(error_message(f"the event-loop process failed the attempt: {type(exc).__name__}: {exc}"))
        finally:
            for timer in self._timers:
                timer.cancel()
            if self._process.orphaned:
                self.log_orphaned()
            self._process.attempt_done(self)

    async def _run(self) -> None:
        assignment, task = self.assignment, self.assignment.task
        try:
            self.log = AttemptLog(assignment.log_path, assignment.limits.log_bytes)
        except OSError as exc:
            self._report(error_message(f"the attempt could not start: cannot open its log: {exc}"))
            return
        CURRENT_LOG.set(self.log)  # this task's context only: print() and logging find its log
        self.log.line(
            "INFO",
            f"task {task.id} ({task.type}) attempt {task.retry_count + 1} started in pid {os.getpid()} "
            f"with {assignment.executor_ref}",
        )
        log = self.log
        ctx = AsyncTaskContext(
            task, self.channel, self.cancel_event, self.resume_event,
            upstream=assignment.upstream, log=lambda: log.logger(task),
        )
        outcome = await self._execute(ctx)
        if not self._process.orphaned:
            self._report(result_message(outcome, assignment.limits.result_bytes))

    async def _execute(self, ctx: AsyncTaskContext) -> Any:
        """Import the executor and await it; an exception becomes an EXCEPTION result, our own
        cancel after the grace a CANCELLED one."""
        ref = self.assignment.executor_ref
        try:
            cls = registry.load_class(ref)
            if not cls.runs_in_event_loop():
                return ExecuteResult(
                    error=f"{ref}: its execute() is not async def, so it cannot run in an event-loop executor process",
                    error_type=models.NO_EXECUTOR,
                )
            return await cls().execute(self.assignment.task, ctx)
        except asyncio.CancelledError:
            if self._cancelled_by_us:
                return cancelled_result()
            self._line("ERROR", "execute() raised:\n" + traceback.format_exc().rstrip())
            return ExecuteResult(error="CancelledError: raised by the executor itself", error_type=models.EXCEPTION)
        except BaseException as exc:  # SystemExit from an executor is a bug to report, not an exit
            self._line("ERROR", "execute() raised:\n" + "".join(traceback.format_exception(exc)).rstrip())
            return ExecuteResult(error=f"{type(exc).__name__}: {exc}", error_type=models.EXCEPTION)

    def _report(self, message: dict[str, Any]) -> None:
        """Send the result (the attempt's last message), once, after the log's last line."""
        if self.reported or self._process.orphaned:
            return
        self.reported = True
        self.channel.close()
        message, frame = encoded_result({**message, "attempt": self.token})
        self._line("INFO", last_line(message, self, self.assignment.task))
        if self.log is not None:
            self.log.close()
        self._process.status.put_frame(frame)  # a broken pipe ends the process (on_broken)
        if self.task is not None and not self.task.done():
            self._process.attempt_done(self)  # given up on: it no longer holds the process

    def log_orphaned(self) -> None:
        """End the log with the line that says the daemon is gone (once)."""
        if self.log is not None and not self.log.closed and not self.reported:
            self.log.line("WARNING", ORPHANED)
            self.log.close()

    def _line(self, level: str, message: str) -> None:
        if self.log is not None:
            self.log.line(level, message)


class Tagged:
    """A status sink that adds the attempt's token to every message it sends."""

    def __init__(self, status: StatusSink, attempt: str) -> None:
        self._status = status
        self._attempt = attempt

    def put(self, message: Mapping[str, Any]) -> None:
        self._status.put({**message, "attempt": self._attempt})


def _read(fd: int) -> bytes | None:
    """What the non-blocking `fd` holds (b"" at end of file or on an error; None: nothing yet)."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _watch_for_a_blocked_orphan(control_fd: int, process: EventLoopProcess) -> None:
    """A thread that ends the process if the daemon is gone and the loop, blocked by an attempt,
    has not ended it within twice ORPHAN_GRACE (the loop itself sees the hang-up as end of file)."""

    def watch() -> None:
        poller = select.poll()
        poller.register(control_fd, 0)  # its hang-up only: the commands are the loop's to read
        while not any(daemon_gone(events) for _, events in poller.poll()):
            pass
        threading.Event().wait(2 * ORPHAN_GRACE)
        process.end_orphaned()

    threading.Thread(target=watch, name="fredica-daemon-watch", daemon=True).start()
