"""Where an executor process's output goes: fds 1 and 2, pointed at each attempt's task log,
which is kept within its limit (`executors.tasklog`); or, in an event-loop process, which runs
many attempts at once and so cannot point its fds at any one log, each attempt's own `AttemptLog`,
which `print()` and the root logger reach through the attempt's context (`route_to_attempt_logs`).

Used by `executors.endpoint` and `executors.event_loop`; the lines they write are formatted as the
task loggers' are.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from executors import tasklog

if TYPE_CHECKING:
    from daemon.models import Task

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# How much of its own output the process writes between two looks at the log's size, at most
# (what the commands it started write straight to the fds is seen at the next look).
CHECK_EVERY = 1024 * 1024
# The most of a line not ended yet an event-loop attempt's log holds back (`AttemptLog.write`).
PARTIAL_LINE_MAX = 8192


class AttemptOutput:
    """Where an attempt's output goes: fds 1 and 2, pointed at the task's log for each attempt.

    The streams and the logging handler for the first attempt are made ahead of it: in a launcher,
    before it forks, so every fork inherits them and an attempt pays for an open and two dup2s
    rather than for new file objects and a handler (in a fresh fork, every object first touched
    costs a copy-on-write page fault). A process that runs several attempts makes them anew for a
    later one if an earlier attempt detached, replaced, reconfigured or closed them, or
    reconfigured the root logger.
    """

    def __init__(self) -> None:
        self._attempts = 0
        self.handler: logging.Handler | None = None
        self.log_path: str | None = None  # the current attempt's log
        self._keep = 0  # half of its max_task_log_bytes: the size it is rotated at
        self._unchecked = 0  # bytes written through our streams since the last look at its size
        self._check_every = CHECK_EVERY
        self._setup()

    def _setup(self) -> None:
        # Line-buffered: what was printed just before a crash is in the log for the CRASHED error.
        self._stdout = self._text_stream(1)
        self._stderr = self._text_stream(2)
        # The endpoint's own lines go through fd 2 too (a stream of our own: the executor may
        # replace sys.stderr), so they interleave in order with what the executor prints.
        self._lines = self._text_stream(2)
        handler = logging.StreamHandler(self._lines)
        self._formatter = logging.Formatter(LOG_FORMAT)
        handler.setFormatter(self._formatter)
        # Libraries that log through the root logger land in the task's log too.
        root = logging.getLogger()
        if self.handler is not None:
            root.removeHandler(self.handler)
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        self.handler = handler

    def begin(self, log_path: str, max_bytes: int) -> None:
        """Point fds 1 and 2 at the task's log (so the executor's own children write there too),
        kept within `max_bytes`."""
        self.flush()  # what an earlier attempt left buffered belongs to its own log
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.log_path, self._keep = log_path, max(1, max_bytes // 2)
        self._check_every = max(4096, min(self._keep // 8, CHECK_EVERY))
        self._unchecked = 0
        self.keep_within_limit()  # a retry appends to the log of the attempts before it
        if self._attempts and not self._intact():
            self._setup()
        self._attempts += 1
        sys.stdout, sys.stderr = self._stdout, self._stderr

    def keep_within_limit(self) -> None:
        """Rotate the attempt's log if it has reached half its limit (a look at its size, usually
        all this costs)."""
        if self.log_path is None:
            return
        try:
            if os.fstat(1).st_size < self._keep:
                return
        except OSError:
            pass  # fd 1 closed by the executor: the rotation looks by the path
        tasklog.rotate(self.log_path, self._keep)

    def _wrote(self, count: int) -> None:
        self._unchecked += count
        if self._unchecked >= self._check_every:
            self._unchecked = 0
            self.keep_within_limit()

    def _text_stream(self, fd: int) -> Any:
        encoding, errors = _STREAM_CODING
        raw = _CountedFd(fd, self._wrote)
        return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errors, line_buffering=True)

    def _intact(self) -> bool:
        """Whether the streams and the root logger are as `_setup` left them: an earlier attempt
        in this process did not replace, detach, close or reconfigure them."""
        if sys.stdout is not self._stdout or sys.stderr is not self._stderr:
            return False
        root = logging.getLogger()
        if root.level != logging.WARNING or root.disabled or root.filters or self.handler not in root.handlers:
            return False
        handler = self.handler
        if handler.level != logging.NOTSET or handler.filters or handler.formatter is not self._formatter:
            return False
        try:
            return all(
                not stream.closed and stream.line_buffering and (stream.encoding, stream.errors) == _STREAM_CODING
                for stream in (self._stdout, self._stderr, self._lines)
            ) and getattr(self.handler, "stream", None) is self._lines
        except ValueError:  # detached
            return False

    def line(self, level: str, message: str) -> None:
        """One line of the endpoint's own, formatted as the loggers' lines are."""
        text = self.format_line(level, message)
        assert self.handler is not None
        self.handler.acquire()  # whole lines, between those of ctx.log in other threads
        try:
            self._lines.write(text)
        except (OSError, ValueError):
            pass  # the log's disk is full or its stream was closed: the result still goes
        finally:
            self.handler.release()

    @staticmethod
    def format_line(level: str, message: str) -> str:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        return f"{stamp},{int(now * 1000) % 1000:03d} {level} {message}\n"

    @classmethod
    def append_line(cls, log_path: str | os.PathLike[str], level: str, message: str) -> None:
        """One line at the end of a task's log, from outside the attempt writing it (nothing if
        it cannot be written: it only ever adds to what the log already says)."""
        try:
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            os.write(fd, cls.format_line(level, message).encode("utf-8", "backslashreplace"))
        except OSError:
            pass
        finally:
            os.close(fd)

    def task_logger(self, task: Task) -> logging.Logger:
        """A logger for `ctx.log`, writing timestamped lines to the task's log."""
        # Not registered with `logging.getLogger`: a process running many attempts would keep
        # every attempt's logger forever.
        logger = logging.Logger(f"fredica.task.{task.id}", logging.INFO)
        assert self.handler is not None
        logger.addHandler(self.handler)
        logger.propagate = False
        return logger

    def flush(self) -> None:
        for stream in (sys.stdout, sys.stderr, self._stdout, self._stderr, self._lines):
            try:
                stream.flush()
            except Exception:
                pass


_STREAM_CODING = ("utf-8", "backslashreplace")


class AttemptLog:
    """One attempt's task log in an event-loop process: written only through this object, so
    every byte is counted, and the log kept within `max_bytes` as it goes (no other writer holds
    it: the process's fds 1 and 2 stay pointed where they were, shared by all its attempts).

    Lean, because a process holds one per attempt it runs, thousands at once: whole lines go
    straight to the fd with one write each (line-buffered, as the other processes' streams are:
    what was printed before a crash is in the log), a line not ended yet waits as a short string,
    and the logging handler is made only when something logs. A `TextIOWrapper` over a
    `BufferedWriter` and a handler made up front cost 9 KB an attempt, 45 MB in each of the two
    processes of 10,000 sleeping tasks; this costs about 1 KB (`benchmarks/RESULTS.md`).
    """

    def __init__(self, log_path: str, max_bytes: int) -> None:
        self.log_path = log_path
        self._keep = max(1, max_bytes // 2)
        self._check_every = max(4096, min(self._keep // 8, CHECK_EVERY))
        self._unchecked = 0
        tasklog.rotate(log_path, self._keep)  # a retry appends to the log of the attempts before it
        self._fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._partial = ""  # what was written since the last line ended
        self._handler: logging.Handler | None = None
        self.closed = False
        self._loggers: list[logging.Logger] = []

    @property
    def handler(self) -> logging.Handler:
        """The logging handler that writes records to this log (made at the first use)."""
        if self._handler is None:
            self._handler = logging.StreamHandler(self)  # type: ignore[arg-type]  # write/flush: a stream
            self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        return self._handler

    def line(self, level: str, message: str) -> None:
        """One line of the process's own about this attempt, formatted as the loggers' lines are."""
        self.write(AttemptOutput.format_line(level, message))

    def write(self, text: str) -> None:
        """Append `text` (nothing once closed, or if the log's disk is full: the result still goes)."""
        if self.closed:
            return
        if "\n" not in text and "\r" not in text and len(self._partial) + len(text) < PARTIAL_LINE_MAX:
            self._partial += text  # no line ended: it waits for the rest of its line
            return
        # All of it, as a line-buffered stream flushes (at a carriage return too: a progress bar
        # that redraws one line never ends it), or as its buffer would once full.
        whole, self._partial = self._partial + text, ""
        self._write(whole)

    def flush(self) -> None:
        """Write a line that was not ended yet."""
        if self._partial and not self.closed:
            whole, self._partial = self._partial, ""
            self._write(whole)

    def _write(self, text: str) -> None:
        data = text.encode(*_STREAM_CODING)
        try:
            while data:
                written = os.write(self._fd, data)
                self._wrote(written)
                data = data[written:]
        except OSError:
            pass

    def logger(self, task: Task) -> logging.Logger:
        """A logger for `ctx.log`, writing timestamped lines to this log (unregistered, as
        `AttemptOutput.task_logger`'s: a long-lived process would keep them all)."""
        logger = logging.Logger(f"fredica.task.{task.id}", logging.INFO)
        logger.addHandler(self.handler)
        logger.propagate = False
        self._loggers.append(logger)
        return logger

    def close(self) -> None:
        """Flush and close; what the attempt's leftovers log later goes nowhere."""
        if self.closed:
            return
        for logger in self._loggers:
            logger.removeHandler(self._handler)  # type: ignore[arg-type]  # made with the first logger
        self.flush()
        self.closed = True
        os.close(self._fd)

    def _wrote(self, count: int) -> None:
        self._unchecked += count
        if self._unchecked >= self._check_every:
            self._unchecked = 0
            try:
                if os.fstat(self._fd).st_size < self._keep:
                    return
            except OSError:
                return
            tasklog.rotate(self.log_path, self._keep)


# The log of the attempt whose code runs now, in an event-loop process: each attempt's asyncio
# task sets it, and what that task starts (other tasks, callbacks) inherits its context.
CURRENT_LOG: contextvars.ContextVar[AttemptLog | None] = contextvars.ContextVar("fredica_attempt_log", default=None)


def route_to_attempt_logs() -> None:
    """In an event-loop process: `sys.stdout`, `sys.stderr` and the root logger write to the
    current attempt's log (`CURRENT_LOG`); outside any attempt, to the process's stderr."""
    fallback = sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")
    sys.stdout = sys.stderr = _ToAttemptLog(fallback)
    root = logging.getLogger()
    root.addHandler(_RootToAttemptLog())
    root.setLevel(logging.WARNING)  # as in the other kind of process: libraries' warnings


class _ToAttemptLog(io.TextIOBase):
    """A text stream that writes to the current attempt's log, or to `fallback` outside one."""

    def __init__(self, fallback: Any) -> None:
        super().__init__()
        self._fallback = fallback

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        log = CURRENT_LOG.get()
        if log is not None and not log.closed:
            log.write(text)
        else:
            with contextlib.suppress(OSError, ValueError):
                self._fallback.write(text)
        return len(text)

    def flush(self) -> None:
        log = CURRENT_LOG.get()
        with contextlib.suppress(OSError, ValueError):
            (log if log is not None and not log.closed else self._fallback).flush()


class _RootToAttemptLog(logging.Handler):
    """The root logger's handler in an event-loop process: a record goes to the log of the
    attempt that logged it (`logging.lastResort` outside one)."""

    def emit(self, record: logging.LogRecord) -> None:
        log = CURRENT_LOG.get()
        if log is not None and not log.closed:
            log.handler.handle(record)
        elif logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


class _CountedFd(io.RawIOBase):
    """An fd (never closed here) as a raw stream that counts what goes through it."""

    def __init__(self, fd: int, wrote: Any) -> None:
        super().__init__()
        self._fd = fd
        self._wrote = wrote

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        written = os.write(self._fd, data)
        self._wrote(written)
        return written
