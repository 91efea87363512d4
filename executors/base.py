"""The executor API (SPEC §8): what third-party executors subclass, return and are given.

`TaskExecutor.execute` runs in an executor subprocess (see `executors.endpoint`; an `async def`
one, in an event-loop process, `executors.event_loop`, with an `AsyncTaskContext`) and talks to
the supervisor only through the `TaskContext` it is given: progress and requests go out as small dicts
on the task's status channel; cancel and pause come in as two Events of the attempt, which a
thread of the executor process sets and clears as the supervisor's commands arrive
(`executors.steering`). They are threading Events: a process the executor starts itself does
not see them (tell it to stop, or let stop escalation end it with the attempt's process tree).

Messages on the status channel (child → supervisor), each a dict with a "type":

    {"type": "progress", "percent": int 0-100, "text": str | None}
    {"type": "pausable", "pausable": bool}
    {"type": "pause_request", "reason": str}
    {"type": "resume_request"}
    {"type": "log", "level": "WARNING" | "ERROR" | "CRITICAL", "message": str}
    {"type": "result", "result": <JSON object> | <JSON text, as a string> | None, "error": str | None,
     "error_type": str | None}

Who touches the resume Event (set = running, clear = paused):
- the supervisor, through its commands, clears it for a user pause, and sets it for a user resume
  and on cancel (after the cancel Event is set, so a woken executor always sees the cancel);
- the child clears it only in `request_pause` (the seed's clear → put → wait) and sets it only in
  `request_resume`, to end a pause it asked for itself. A self-resume must not wait for a round
  trip through a busy (or restarting) supervisor, and the seed gives the supervisor no part in it
  beyond recording `is_paused = 0`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import logging
import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Collection, Generic, Mapping, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio
    from multiprocessing.synchronize import Event  # noqa: F401 (named as a string: TaskContext(_Context["Event"]))

    from daemon.models import Task

# Longest status text and forwarded log line: messages stay small whatever an executor passes in.
MAX_TEXT = 1000
MAX_LOG_MESSAGE = 4000
E = TypeVar("E")  # the kind of Event a context's cancel and resume are


@dataclasses.dataclass
class ExecuteResult:
    """What `execute` returns: a result on success, or an error and its type.

    `result` is a dict (stored as JSON) or a JSON string, at most `max_result_bytes` as JSON
    (`stored_result`). `error is None and error_type is None` means success; setting only
    `error_type` is still an error.
    """

    result: Any = None
    error: str | None = None
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        """True when this is a success."""
        return self.error is None and self.error_type is None


class BadResult(ValueError):
    """A result that cannot be an attempt's (SPEC §8, §13); the message says why."""


def stored_result(value: Any, max_bytes: int) -> Any:
    """What a successful attempt's `result` is stored as: a dict as it is, JSON text decoded,
    None as no result. BadResult if it is anything else, is not plain JSON, or is larger than
    `max_bytes` as JSON.

    Both ends apply it: the executor process before it sends the result, and the supervisor to
    what arrives, since an executor can write any message on its channel.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            _within(len(value.encode()), max_bytes)  # measured before parsing: no parse of a huge text
            return json.loads(value, parse_constant=_not_json)
        except UnicodeEncodeError as exc:
            raise BadResult(f"the result is text that is not valid Unicode: {exc.reason}") from None
        except RecursionError:
            raise BadResult("the result cannot be stored as JSON: it is nested too deeply") from None
        except BadResult:
            raise
        except ValueError as exc:
            raise BadResult(f"the result is a string that is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadResult(f"the result must be a dict (a JSON object) or a JSON string, not {type(value).__name__}")
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode())
    except RecursionError:
        raise BadResult("the result cannot be stored as JSON: it is nested too deeply") from None
    except (TypeError, ValueError) as exc:  # includes UnicodeEncodeError: a lone surrogate
        raise BadResult(f"the result cannot be stored as JSON: {exc}") from None
    _within(size, max_bytes)
    return value


def _within(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise BadResult(f"the result takes {size} bytes as JSON, more than max_result_bytes ({max_bytes})")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


class PayloadError(ValueError):
    """The task's payload is malformed; the message says what is wrong."""


def check_keys(payload: Mapping[str, Any], known: Collection[str]) -> None:
    """Refuse a key of `payload` that is not in `known`, suggesting the close match if any
    (a misspelt optional key would otherwise be silently ignored)."""
    for key in sorted(set(payload) - set(known)):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(known))}"
        raise PayloadError(f"unknown key {key!r}{hint}")


class TaskExecutor:
    """Base class of every executor; one subclass per task type."""

    task_type: str
    # The payload's keys, for `fredica types` (empty: not declared). The one-line doc it shows is
    # the first line of the class's docstring (`summary`).
    payload_keys: tuple[str, ...] = ()
    pausable: bool = False  # the task's initial is_pausable; `ctx.set_pausable` changes it later
    # True: every attempt gets a process that never ran another one, even with tasks_per_process
    # > 1 (for executors that change process-wide state: cwd, environment, signal handlers...).
    needs_fresh_process: bool = False

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        """Run the task; called in the executor subprocess, never in the supervisor.

        An `async def execute(self, task, ctx: AsyncTaskContext)` makes an event-loop executor
        (SPEC §15): its attempts run many at once on one asyncio loop (`executors.event_loop`).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement execute()")

    @classmethod
    def validate(cls, payload: Mapping[str, Any]) -> None:
        """A quick check of a payload, run in the daemon at submit (SPEC §14): raise
        PayloadError to refuse the submission. The default accepts any payload.

        It must not depend on what only exists at run time (files an upstream task makes):
        `execute` checks those, and the payload again, for tasks stored before a check existed.
        """

    @classmethod
    def summary(cls) -> str:
        """The one line `fredica types` shows: the first line of the class's docstring."""
        # The class's own docstring only: an inherited one would describe its base, not it.
        lines = inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()
        return lines[0] if lines else ""

    @classmethod
    def runs_in_event_loop(cls) -> bool:
        """True for an event-loop executor (its `execute` is `async def`): the daemon runs it in
        an event-loop executor process, never in a process that runs one attempt at a time."""
        return inspect.iscoroutinefunction(cls.execute)

    def can_skip(self, task: Task) -> bool:
        """Supervisor side, before starting: True completes the task as skipped."""
        return False

    def skipped_result(self, task: Task) -> dict[str, Any]:
        """Supervisor side, for a task `can_skip` skipped: what its result holds besides
        `"skipped": true`, for the tasks that depend on it (e.g. `{"output": ...}`)."""
        return {}

    def on_task_failed(self, task: Task, result: ExecuteResult) -> None:
        """Supervisor side, once, after a permanent failure or a cancel: undo side effects."""


class StatusSink(Protocol):
    """Where a `TaskContext` sends its messages (the child's end of the status channel)."""

    def put(self, message: dict[str, Any]) -> None: ...


class _ForwardToSupervisor(logging.Handler):
    """Sends WARNING and above to the supervisor, so problems show in the daemon's log too."""

    def __init__(self, status: StatusSink) -> None:
        super().__init__(logging.WARNING)
        self._status = status

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()[:MAX_LOG_MESSAGE]
            self._status.put({"type": "log", "level": record.levelname, "message": message})
        except Exception:
            self.handleError(record)


class _Context(Generic[E]):
    """What both contexts share: the task, its upstream results, its logger, progress and the
    pausable flag, and the shapes of the messages they send. `E`: the kind of its cancel and
    resume Events (set = cancelled; set = running)."""

    def __init__(
        self,
        task: Task,
        status: StatusSink,
        cancel_event: E,
        resume_event: E,
        *,
        upstream: Mapping[str, Any] | None = None,
        log: logging.Logger | Callable[[], logging.Logger] | None = None,
    ) -> None:
        self.task = task
        self.upstream: dict[str, Any] = dict(upstream or {})
        self._status = status
        self._cancel = cancel_event
        self._resume = resume_event
        self._pause_lock = threading.Lock()  # guards self-pause state and its two messages (threads)
        self._lock = threading.Lock()  # guards making the logger
        self._progress_lock = threading.Lock()  # orders progress reports, and their de-duplication
        self._last_progress: tuple[int, str | None] | None = None
        self._self_paused = False
        self._log: logging.Logger | None = None
        self._make_log = log  # a logger, a function making one (on first use), or None: the default

    @property
    def log(self) -> logging.Logger:
        """The task's logger: its lines go to the task's log, WARNING and above to the daemon's too.

        Made on first use: most tasks never log, and a logger costs a short task a tenth of its
        process's time.
        """
        with self._lock:
            if self._log is None:
                log = self._make_log
                if log is None:
                    log = logging.getLogger(f"fredica.task.{self.task.id}")
                elif not isinstance(log, logging.Logger):
                    log = log()
                if not any(isinstance(h, _ForwardToSupervisor) for h in log.handlers):
                    log.addHandler(_ForwardToSupervisor(self._status))
                self._log = log
            return self._log

    @log.setter
    def log(self, logger: logging.Logger) -> None:
        with self._lock:
            self._log = logger

    # --- progress ---------------------------------------------------------------------------------

    def progress(self, percent: float, text: str | None = None) -> None:
        """Report progress (clamped to 0-100, whole percents) and an optional status text."""
        value = float(percent)
        whole = 0 if math.isnan(value) else int(min(100.0, max(0.0, value)))
        if text is not None:
            text = str(text)[:MAX_TEXT]
        with self._progress_lock:
            # Executors often report the same whole percent many times in a row (fractions of a
            # percent, per-chunk callbacks); repeating it would only load the channel.
            if self._last_progress == (whole, text):
                return
            self._last_progress = (whole, text)
            # Sent under the lock: two threads' reports reach the supervisor in the order they
            # were recorded, so the last one recorded is the one shown. A lock of its own: a send
            # blocked on a full pipe holds up other progress reports, not the logger.
            self._status.put({"type": "progress", "percent": whole, "text": text})

    def set_pausable(self, flag: bool) -> None:
        """Tell the supervisor whether a user may pause the task from now on."""
        self._status.put({"type": "pausable", "pausable": bool(flag)})

    # --- the two messages of a pause the executor asks for -----------------------------------------

    def _put_pause_request(self, reason: str) -> None:
        self._self_paused = True
        self._status.put({"type": "pause_request", "reason": str(reason)[:MAX_TEXT]})

    def _put_resume_request(self) -> bool:
        """Send resume_request if a pause this executor asked for is in progress; True if it was."""
        if not self._self_paused:
            return False  # a plain user pause is the user's to end
        self._self_paused = False
        self._status.put({"type": "resume_request"})
        return True


class TaskContext(_Context["Event"]):
    """What `execute` gets as `ctx`: progress, cancel and pause, upstream results, a logger.

    Safe to use from several threads of the executor, but not from a signal handler: its methods
    take locks that the interrupted thread may hold (a handler should set a flag instead).
    """

    # --- cancel -----------------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the supervisor asked the task to stop; `execute` should return CANCELLED."""
        return self._cancel.is_set()

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking early on cancel; True if cancelled."""
        return self._cancel.wait(timeout)

    # --- pause ------------------------------------------------------------------------------------

    def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Block while the task is paused; False only if `timeout` passed while still paused.

        A cancel also ends the wait (the supervisor sets the resume Event with the cancel Event),
        so check `cancelled` after it.
        """
        return self._resume.wait(timeout)

    def request_pause(self, reason: str) -> None:
        """Pause the task from inside (e.g. waiting for a resource); returns once resumed.

        The order is the seed's: clear the resume Event, then tell the supervisor, then wait. Clearing
        first means a resume the supervisor sends as soon as it reads the request is never lost: it
        can only set the Event after the clear, and a set Event ends the wait at once.
        """
        if self._cancel.is_set():
            return  # a cancelled task is about to end: pausing it would only delay that
        # The pause lock orders this request against `request_resume` from another thread: the
        # supervisor must see pause_request before the matching resume_request.
        with self._pause_lock:
            self._resume.clear()
            self._put_pause_request(reason)
        # A cancel that raced with the clear above set the resume Event before we cleared it; the
        # supervisor sets the cancel Event first, so it is visible here: we must not wait, and
        # the resume Event is set again, or the executor's other threads would wait for good.
        if self._cancel.is_set():
            self._resume.set()
        else:
            self._resume.wait()
        with self._pause_lock:
            self._self_paused = False

    def request_resume(self) -> None:
        """End a pause this executor asked for with `request_pause` (call from another thread).

        Does nothing unless a `request_pause` is in progress: a plain user pause is the user's to end.
        The request is sent before the Event is set, so the supervisor records `is_paused = 0`
        before any progress the resumed thread reports.
        """
        with self._pause_lock:
            if self._put_resume_request():
                self._resume.set()


class AsyncTaskContext(_Context["asyncio.Event"]):
    """What an event-loop executor's `async def execute` gets as `ctx` (SPEC §15): the same as
    `TaskContext`, with waits that are awaited instead of blocking the loop every other attempt
    of the process runs on.

    Its cancel and resume Events are asyncio Events of the process's loop, set and cleared there
    as the supervisor's commands arrive (`executors.event_loop`): use it from the loop's thread
    only (not from `asyncio.to_thread` or other threads).
    """

    @property
    def cancelled(self) -> bool:
        """True once the supervisor asked the task to stop; `execute` should return CANCELLED.
        If it goes on, its coroutine is cancelled (CancelledError) after the cancel grace."""
        return self._cancel.is_set()

    async def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking early on cancel; True if cancelled."""
        return await _waited(self._cancel, timeout)

    async def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Wait while the task is paused; False only if `timeout` passed while still paused. A
        cancel also ends the wait, so check `cancelled` after it."""
        return await _waited(self._resume, timeout)

    async def request_pause(self, reason: str) -> None:
        """Pause the task from inside; returns once resumed (by the user, or `request_resume`).

        The seed's order, as `TaskContext.request_pause` explains: clear the resume Event, tell
        the supervisor, wait. Nothing runs between the clear and the put (no await), and the
        commands are applied by the same loop, so a resume sent the moment the supervisor reads
        the request always comes after the clear: it ends the wait, never gets lost.
        """
        if self._cancel.is_set():
            return  # a cancelled task is about to end: pausing it would only delay that
        self._resume.clear()
        self._put_pause_request(reason)
        try:
            await self._resume.wait()  # a cancel sets it too
        finally:
            self._self_paused = False

    def request_resume(self) -> None:
        """End a pause this executor asked for with `request_pause` (from another of its
        coroutines); nothing unless one is in progress. resume_request goes before the Event is
        set, so the supervisor records `is_paused = 0` before any progress the resumed one sends."""
        if self._put_resume_request():
            self._resume.set()


async def _waited(event: asyncio.Event, timeout: float | None) -> bool:
    """Whether `event` is set within `timeout` seconds (None: wait until it is)."""
    import asyncio

    if timeout is None:
        await event.wait()
        return True
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
