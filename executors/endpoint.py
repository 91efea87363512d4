"""The executor subprocess: its entry point `serve`, which runs the attempts the supervisor sends.

The status channel it reports on is `executors.channel`; cancel, pause and resume come in through
`executors.steering`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import gc
import logging
import os
import pickle
import select
import signal
import threading
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Mapping, NoReturn

from daemon import models
from executors import framing, registry
from executors.ahead import AheadAttempts
from executors.assignment import Assignment
from executors._parent import (
    LOOK_INTERVAL, AttemptState, adopt_orphans, await_end, daemon_gone, die_with_parent, end_leftovers,
    end_orphaned_attempt, watch_daemon,
)
from executors.base import BadResult, ExecuteResult, StatusSink, TaskContext, stored_result
from executors.channel import READ_CHUNK, StatusQueue, encode, poll_now
from executors.output import AttemptOutput
from executors.steering import ControlReader, Steered, Steering

if TYPE_CHECKING:
    from daemon.models import Task

MAX_ERROR = 10_000


# --- the subprocess -------------------------------------------------------------------------------


def serve(
    assignments: Connection,
    control: Connection,
    status_connection: Connection,
    reports: Connection | None = None,
) -> None:
    """Entry point of an executor process: run the attempts the supervisor sends, one at a time.

    With a `reports` pipe the process is a launcher: each attempt runs in a fresh fork of it (see
    `_launch_each_attempt`). Otherwise it runs them itself; each assignment then says whether it
    is the process's last. After the last one, or when the assignment pipe closes (dismissed, or
    the supervisor is gone), the process exits with `os._exit`, so threads or processes an
    executor left behind cannot keep its worker slot busy.
    """
    prepare_process()
    status = StatusQueue(status_connection)
    # A segfault in an extension module then leaves a Python traceback in the task's log (fd 2
    # is pointed at each attempt's log in turn), which the supervisor quotes in the CRASHED error.
    faulthandler.enable(file=2, all_threads=True)
    # Made once here, inherited by every fork: an attempt only points fds 1 and 2 at its log.
    output = AttemptOutput()
    # What an attempt's processes orphan becomes ours (a launcher's: what a fork that died left).
    adopt_orphans()
    state = AttemptState()
    if reports is not None:
        _launch_each_attempt(assignments, control, status, StatusQueue(reports), output, state)
    status.on_broken = functools.partial(end_orphaned_attempt, state)
    watch_daemon(control.fileno(), state)
    steering = ControlReader(control.fileno())
    ahead = AheadAttempts(status)
    steering.on_revoke = ahead.revoke
    while True:
        try:
            assignment: Assignment = assignments.recv()
        except (EOFError, OSError):
            # Dismissed, or the supervisor is gone: there is nothing to run and nobody to tell.
            _shut_down(status, output, 0)
        if assignment.prefetched and not ahead.start(assignment.attempt):
            continue  # revoked while it waited: the supervisor has it back
        if assignment.prefetching:
            steering.start()  # the next one may be revoked while this one runs: read at once
        state.take()
        exit_code = _run_attempt(assignment, status, steering, output, state, end_leftovers_first=False)
        if assignment.last or exit_code:
            assignments.close()
            _shut_down(status, output, exit_code)


def prepare_process() -> None:
    """What every kind of executor process does first: its own process group, signals as a
    Python program starts with them, no fd of ours for the commands it runs, no terminal."""
    # The supervisor decides when a task stops: a Ctrl-C (or hang-up) on the daemon's terminal,
    # which reaches the whole foreground process group, must not kill executors behind its back.
    # So they leave that group, rather than ignore SIGINT: an ignored signal stays ignored across
    # exec, and the commands executors run would inherit that (a script could not trap it).
    os.setpgid(0, 0)
    # And whatever ignored them before (a daemon started in the background by a script gets
    # SIGINT and SIGQUIT ignored, and multiprocessing passes that on) is undone: the commands an
    # executor runs inherit ignored signals across exec.
    # SIGINT as a Python program starts with (KeyboardInterrupt in the executor, the default
    # after exec); SIGQUIT at its default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    # Nothing this process got (our pipes; multiprocessing's to the fork server and the resource
    # tracker) is for the commands an executor starts: one started without close_fds (os.system)
    # would hold them open, and a pipe held open never reports its end.
    _close_on_exec_above_stderr()
    null = os.open(os.devnull, os.O_RDONLY)  # nothing may read the daemon's terminal
    os.dup2(null, 0)
    os.close(null)


def _close_on_exec_above_stderr() -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the descriptor listdir itself had open, now closed


def _launch_each_attempt(
    assignments: Connection,
    control: Connection,
    status: StatusQueue,
    reports: StatusQueue,
    output: AttemptOutput,
    state: AttemptState,
) -> NoReturn:
    """Run every attempt in a fresh fork of this process, which itself never runs executor code.

    The next attempt's process is forked before its task arrives and reads it from the assignment
    pipe itself, so a task starts with one message, straight from the supervisor to the process
    that runs it (each process woken on this 2-core VM costs more than the message). The launcher
    only waits for its fork to exit, then forks the next. It reports on a pipe of its own, which
    no attempt holds: "forked" with the pid of the fork waiting for a task, and, once that fork
    has run its attempt and exited, "exited" with its exit status and the next fork's pid. The
    supervisor sends the next task only after that report, so a fork is the pipe's only reader.
    An attempt killed half-way through a message can garble only the status channel, never these
    reports. A launcher that dies takes its attempt with it (PR_SET_PDEATHSIG), so an attempt
    never outlives the process the supervisor knows it by; and a launcher whose daemon dies ends
    the attempt under way (`_await_fork`).
    """
    launcher = os.getpid()
    try:
        rehearsal: bytes | None = _rehearsal_assignment()
    except Exception:
        rehearsal = None  # no head start, but a working launcher
    # Everything made so far (the preloaded modules, the rehearsal's assignment) stays as long as
    # the launcher: moved out of the collector's generations, the forks' collections never walk
    # it, and what they touch spans fewer pages (measured: ~50 fewer copy-on-write faults a fork).
    gc.collect()
    gc.freeze()

    def fork_next() -> int:
        state.reset()
        pid = os.fork()
        if pid == 0:
            reports.close()
            try:
                die_with_parent(launcher)
                adopt_orphans()
                status.on_broken = functools.partial(await_end, control.fileno())
                _run_assigned_attempt(assignments, control, status, output, state, rehearsal)
            except BaseException:
                traceback.print_exc()  # into the task's log, if it got that far
            finally:
                os._exit(1)  # whatever escapes, never back into the launcher's code
        return pid

    pid = fork_next()
    reports.put({"type": "forked", "pid": pid})
    while True:
        exitcode = _await_fork(pid, control.fileno(), state)
        # `state`, shared with every fork, is taken once it has read its whole assignment. A fork
        # that died before that may have left the pipe in the middle of a message, which the
        # next fork must never read.
        if state.state == AttemptState.IDLE:
            if _hung_up(assignments.fileno()):
                _shut_down(status, output, 0)  # dismissed, or the supervisor is gone: the fork read end-of-file
            # It died waiting, perhaps while a task was on its way: say how, and end here. The
            # supervisor counts an attempt it had sent as crashed; its write, if still going,
            # fails once no reader is left.
            with contextlib.suppress(OSError):
                reports.put({"type": "exited", "exitcode": exitcode, "next_pid": None})
            _shut_down(status, output, 1)
        # A fork that died (killed, crashed) ended nothing it started: those processes, orphaned
        # to the launcher, still hold the status pipe the next fork writes on. Ended before it is
        # forked, and before the report, so all they wrote is read as this attempt's.
        end_leftovers()
        # Commands the attempt never read (it did not look at its Events) would fill the pipe all
        # the launcher's forks share; none can be for the next attempt, not assigned before the
        # report below.
        _discard_readable(control.fileno())
        pid = fork_next()
        try:
            reports.put({"type": "exited", "exitcode": exitcode, "next_pid": pid})
        except OSError:
            _shut_down(status, output, 1)  # the supervisor is gone


def _await_fork(pid: int, control_fd: int, state: AttemptState) -> int:
    """Wait for the fork `pid` to exit; its exit status. Meanwhile its log is kept within its
    limit (what the fork writes itself is counted as it goes, not what its commands write straight
    to the log), and a daemon that dies ends the attempt under way (`end_orphaned_attempt`)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # before Linux 5.3: its exit only
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(control_fd, 0)  # its hang-up only: the commands are the fork's to read
        while True:
            events = dict(poller.poll(LOOK_INTERVAL * 1000))
            if pidfd in events:
                break
            if daemon_gone(events.get(control_fd, 0)):
                if state.state == AttemptState.TAKEN:
                    end_orphaned_attempt(state)
                # Waiting for its task, it reads end-of-file; having sent its result, it ends.
                poller.unregister(control_fd)
            state.keep_log_within_limit()
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _run_assigned_attempt(
    assignments: Connection,
    control: Connection,
    status: StatusQueue,
    output: AttemptOutput,
    state: AttemptState,
    rehearsal: bytes | None,
) -> NoReturn:
    """The forked attempt: wait for its task on the assignment pipe, run it, exit."""
    steering = ControlReader(control.fileno())
    if rehearsal is not None and not poll_now(assignments.fileno()):  # no task (or end) waiting yet
        try:
            _rehearse(rehearsal, steering)
        except Exception:
            pass  # only ever a head start: the attempt itself reports what goes wrong
    # As `Connection.send_bytes` frames it, read with plain os.read: in a fresh fork, Connection's
    # Python code would cost a page fault per object it touches.
    data = framing.read_frame(assignments.fileno(), framing.UNBOUNDED, long_sizes=True)
    if data is None:
        os._exit(0)  # dismissed, or the supervisor is gone, before a task came
    state.take()
    assignments.close()
    exit_code = _run_attempt(pickle.loads(data), status, steering, output, state, end_leftovers_first=True)
    _shut_down(status, output, exit_code)


def _rehearsal_assignment() -> bytes:
    """An assignment for a stand-in task, pickled as the supervisor pickles real ones."""
    fields = {field.name: None for field in dataclasses.fields(models.Task)}
    fields.update(id="rehearsal", type="REHEARSAL", status=models.TaskStatus.RUNNING, depends_on=(),
                  payload={}, retry_count=0, max_retries=0, is_paused=False, is_pausable=False)
    assignment = Assignment(models.Task(**fields), "module:Class", {}, "", "rehearsal#0")
    return pickle.dumps(assignment, pickle.HIGHEST_PROTOCOL)


def _rehearse(assignment: bytes, steering: ControlReader) -> None:
    """Go through an attempt's steps on a stand-in task while no task waits, touching nothing
    outside this process: in a fresh fork every object first touched costs a copy-on-write page
    fault, and taken now they are not between a task's arrival and its start."""
    stand_in: Assignment = pickle.loads(assignment)
    task = stand_in.task
    steered = Steering(stand_in.attempt, steering)  # Events made, never used: the reader stays idle
    TaskContext(task, AttemptChannel(_NoStatus()), steered.cancel, steered.resume, upstream=stand_in.upstream)
    AttemptOutput.format_line("INFO", f"task {task.id} ({task.type}) attempt 1 started in pid {os.getpid()}")
    encode(result_message(ExecuteResult(result={}), stand_in.limits.result_bytes))


class _NoStatus:
    """A status channel that is never written: the rehearsal's."""

    def put(self, message: Mapping[str, Any]) -> None:
        raise AssertionError("a rehearsal sends nothing")


def _hung_up(fd: int) -> bool:
    """True if the pipe `fd` reads from holds nothing and its writer has closed it."""
    events = poll_now(fd)
    return bool(events) and not events & select.POLLIN


def _discard_readable(fd: int) -> None:
    """Read and drop whatever `fd` holds now, without waiting."""
    try:
        while poll_now(fd) and os.read(fd, READ_CHUNK):
            pass
    except OSError:
        pass


class AttemptChannel:
    """The status channel as one attempt's `TaskContext` sees it, closed once the attempt ends.

    In a process that runs several attempts, a thread the previous executor left behind may still
    report progress; once its attempt has reported its result, those messages are dropped rather
    than credited to the next task.
    """

    def __init__(self, status: StatusSink) -> None:
        self._status = status
        self._lock = threading.Lock()
        self._open = True

    def put(self, message: Mapping[str, Any]) -> None:
        with self._lock:
            if self._open:
                self._status.put(message)

    def close(self) -> None:
        """Drop every later message (waits for a `put` in progress to finish)."""
        with self._lock:
            self._open = False


def _run_attempt(
    assignment: Assignment,
    status: StatusQueue,
    reader: ControlReader,
    output: AttemptOutput,
    state: AttemptState,
    *,
    end_leftovers_first: bool,
) -> int:
    """Run one attempt of `task` and send its result; the exit code the process should end with
    if it stops now (non-zero when the result could not be reported or the attempt not set up).

    `end_leftovers_first`: end whatever the attempt started and left running before the result
    goes (a fork that runs one attempt). A process that runs several leaves them to the next
    attempt, as it does its threads and module state (an executor may keep a pool of helpers),
    and ends them when it exits.
    """
    task, executor_ref, log_path, limits = assignment.task, assignment.executor_ref, assignment.log_path, assignment.limits
    steering = reader.steer(assignment.attempt)
    channel = AttemptChannel(status)
    state.log_to(log_path, limits.log_bytes)
    try:
        output.begin(log_path, limits.log_bytes)
        ctx = TaskContext(
            task, channel, steering.cancel, steering.resume, upstream=assignment.upstream, log=lambda: output.task_logger(task)
        )
    except BaseException as exc:  # e.g. the log cannot be opened: say so rather than just die
        try:
            status.put(error_message(f"the executor process could not start: {type(exc).__name__}: {exc}"))
        finally:
            os._exit(1)
    output.line(
        "INFO",
        f"task {task.id} ({task.type}) attempt {task.retry_count + 1} started in pid {os.getpid()} with {executor_ref}",
    )
    message = result_message(_execute(task, executor_ref, ctx, output), limits.result_bytes)
    output.keep_within_limit()  # what its commands wrote straight to the log is counted nowhere else
    # In a fork of its own, nothing the attempt started may outlive it, not even what detached
    # itself (adopt_orphans): once the supervisor has its result, the task is over.
    left = end_leftovers() if end_leftovers_first else []
    if left:
        output.line("WARNING", f"ended {len(left)} processes the task left running: {', '.join(map(str, left))}")
    channel.close()  # the result is the attempt's last message
    message, frame = encoded_result(message)
    # The log is complete before the result goes: once the supervisor records the task as ended,
    # `fredica logs` may read the log to its end, and this process may still be exiting.
    output.line("INFO", last_line(message, steering, task))
    output.flush()
    exit_code = 0
    try:
        status.put_frame(frame)  # the supervisor gone: its `on_broken` ends the attempt, no return
        state.reported()
    except OSError as exc:
        output.line("ERROR", f"cannot report the result: {exc}")
        exit_code = 1
    output.flush()
    return exit_code


def last_line(message: Mapping[str, Any], steering: Steered, task: Task) -> str:
    """The line an attempt's log ends with: how it ended, as the supervisor will record it. A
    failure after the supervisor stopped the attempt is recorded for the stop's reason."""
    if message["error"] is None:
        return "task finished: ok"
    said = f"{message['error_type']}: {message['error']}"
    reason = steering.cancel_reason
    if reason == "shutdown":
        return f"task interrupted by the daemon's shutdown ({said}): put back, it runs again after the next start"
    if reason == "timeout" and task.timeout is not None:
        return f"task stopped: timed out after {task.timeout:g} s ({said})"
    if reason == "cancel":
        return f"task cancelled by the user ({said})"
    return f"task finished: {said}"


def result_message(outcome: Any, max_result_bytes: int) -> dict[str, Any]:
    """The "result" message for what `execute` returned. A result that cannot be stored is
    refused here, before anything is sent (BAD_RESULT); JSON text goes as the text, for the
    supervisor to tell it from any other kind of value."""
    if not isinstance(outcome, ExecuteResult):
        return error_message(f"execute() returned {type(outcome).__name__}, not an ExecuteResult")
    if not outcome.ok:
        error = outcome.error if outcome.error is not None else outcome.error_type
        error_type = None if outcome.error_type is None else str(outcome.error_type)
        return {"type": "result", "result": None, "error": str(error)[:MAX_ERROR], "error_type": error_type}
    try:
        stored_result(outcome.result, max_result_bytes)
    except BadResult as exc:
        return error_message(str(exc), models.BAD_RESULT)
    return {"type": "result", "result": outcome.result, "error": None, "error_type": None}


def encoded_result(message: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The result `message` and its frame; a BAD_RESULT message instead if it cannot be encoded
    (what `stored_result` let by: too large once escaped, say). Other keys of `message` (an
    event-loop process's "attempt") are kept."""
    try:
        return message, encode(message)
    except (TypeError, ValueError, RecursionError) as exc:  # ValueError: framing.Oversized too
        error = error_message(f"the result cannot be sent: {type(exc).__name__}: {exc}", models.BAD_RESULT)
        error.update((key, value) for key, value in message.items() if key not in error)
        return error, encode(error)


def error_message(error: str, error_type: str = models.EXCEPTION) -> dict[str, Any]:
    """A failed attempt's "result" message."""
    return {"type": "result", "result": None, "error": error[:MAX_ERROR], "error_type": error_type}


def _execute(task: Task, executor_ref: str, ctx: TaskContext, output: AttemptOutput) -> Any:
    """Import the executor and run it; any exception becomes an EXCEPTION result."""
    try:
        cls = registry.load_class(executor_ref)
        if cls.runs_in_event_loop():
            return ExecuteResult(error=not_here(executor_ref), error_type=models.NO_EXECUTOR)
        return cls().execute(task, ctx)
    except BaseException as exc:  # SystemExit from an executor is a bug to report, not an exit
        output.line("ERROR", "execute() raised:\n" + "".join(traceback.format_exception(exc)).rstrip())
        return ExecuteResult(error=f"{type(exc).__name__}: {exc}", error_type=models.EXCEPTION)


def not_here(executor_ref: str) -> str:
    """Why an executor of the wrong kind for its process does not run there."""
    return (
        f"{executor_ref}: its execute() is async def, an event-loop executor (SPEC §15), and this "
        f"executor process runs one attempt at a time; it runs only in an event-loop executor process"
    )


def _shut_down(status: StatusQueue, output: AttemptOutput, exit_code: int) -> NoReturn:
    end_leftovers()  # a process that ran several attempts kept what they left; nothing outlives it
    logging.shutdown()
    output.flush()
    status.close()
    os._exit(exit_code)
