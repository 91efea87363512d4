"""Where an executor process's output goes: fds 1 and 2, pointed at each attempt's task log.

Used by `executors.endpoint`; the lines it writes are formatted as the task loggers' are.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daemon.models import Task

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


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
        self._setup()

    def _setup(self) -> None:
        # Line-buffered: what was printed just before a crash is in the log for the CRASHED error.
        self._stdout = _text_stream(1)
        self._stderr = _text_stream(2)
        # The endpoint's own lines go through fd 2 too (a stream of our own: the executor may
        # replace sys.stderr), so they interleave in order with what the executor prints.
        self._lines = _text_stream(2)
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

    def begin(self, log_path: str) -> None:
        """Point fds 1 and 2 at the task's log (so the executor's own children write there too)."""
        self.flush()  # what an earlier attempt left buffered belongs to its own log
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if self._attempts and not self._intact():
            self._setup()
        self._attempts += 1
        sys.stdout, sys.stderr = self._stdout, self._stderr

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


def _text_stream(fd: int) -> Any:
    encoding, errors = _STREAM_CODING
    return open(fd, "w", buffering=1, encoding=encoding, errors=errors, closefd=False)
