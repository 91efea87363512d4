"""structlog set-up: JSON lines to the daemon's (rotated) log file, readable lines on a terminal.

Every event about a task carries `task_id` and `run_id` (the supervisor binds them), so
`fredica logs` and `jq` can follow one task or run through the daemon log.

structlog events go straight from its processors to the file (one `write` of one JSON line, no
stdlib `LogRecord`, handler locks or formatter objects in between): the loop logs two events per
task, and through the stdlib bridge each cost ~30 us for the file and as much again for the
stream, a tenth of what the loop spends on a task. Records of libraries that use the stdlib's
`logging` reach the same file through a small handler. The stream (stderr) gets every event when
it is a terminal, and only warnings and errors otherwise (a journal, a file): the complete record
is the JSON file that `fredica logs -f` follows, and the journal keeps what needs attention.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import structlog

from daemon import paths

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL, "exception": logging.ERROR}

_installed: "_Sink | None" = None  # the sink of the last `configure`, closed by the next


def configure(
    log_file: Path | None,
    *,
    stream: TextIO | None = sys.stderr,
    level: int = logging.INFO,
    max_bytes: int = MAX_BYTES,
) -> None:
    """Route structlog (and stdlib logging) to `log_file` as JSON and to `stream` for people."""
    global _installed
    if _installed is not None:
        _installed.close()
    file = _LogFile(log_file, max_bytes) if log_file is not None else None
    sink = _installed = _Sink(file, stream, level)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            sink.emit,
        ],
        logger_factory=_NamedLogger,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.addHandler(_StdlibRecords(sink))
    root.setLevel(level)
    # Records carry no caller, thread or process fields we print; not collecting them is the
    # logging HOWTO's own advice for speed (the caller lookup walks the stack for every event).
    # Process-wide: code in the daemon that asks for stack_info=True gets no stack either.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


class _NamedLogger:
    """What structlog binds to: only its name is used (`add_logger_name`); the sink writes."""

    def __init__(self, name: str = "fredica", *_: Any) -> None:
        self.name = name


class _Sink:
    """Where every event ends: a JSON line in the file, a readable line on the stream."""

    def __init__(self, file: "_LogFile | None", stream: TextIO | None, level: int) -> None:
        self.file = file
        self.stream = stream
        on_terminal = stream is not None and stream.isatty()
        self.stream_level = level if on_terminal else logging.WARNING
        self._json = structlog.processors.JSONRenderer()
        self._console = structlog.dev.ConsoleRenderer(colors=on_terminal)
        self._exc_info = structlog.processors.format_exc_info
        self._stream_lock = threading.Lock()

    def emit(self, logger: Any, method: str, event: dict[str, Any]) -> Any:
        """structlog's last processor: writes the event, and drops it (nothing else is bound)."""
        self.write(method, event)
        raise structlog.DropEvent

    def write(self, method: str, event: dict[str, Any]) -> None:
        if "exc_info" in event:
            event = self._exc_info(None, method, event)
        if self.file is not None:
            try:
                self.file.write(self._json(None, method, event) + "\n")
            except Exception:  # noqa: BLE001 (logging must never take down the code that logs)
                pass
        if self.stream is not None and LEVELS.get(method, logging.INFO) >= self.stream_level:
            line = self._console(None, method, dict(event))
            with self._stream_lock:
                try:
                    self.stream.write(line + "\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass  # stderr closed or full: the file has the event

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _StdlibRecords(logging.Handler):
    """Records of stdlib `logging` users, as events of the same sink."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event: dict[str, Any] = {
                "event": record.getMessage(), "level": record.levelname.lower(), "logger": record.name,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                + f".{int(record.msecs * 1000):06d}Z",
            }
            if record.exc_info:
                event["exc_info"] = record.exc_info
            self.sink.write(record.levelname.lower(), event)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


class _LogFile:
    """The daemon log, rotated at `max_bytes` into BACKUPS numbered files.

    Each line is one `write` on a descriptor opened with O_APPEND: whole lines even from several
    threads, nothing buffered that a crash could lose, and `fredica logs -f` sees each at once. A
    log path that is not a regular file (a FIFO, a link to /dev/stdout: a container's way to
    collect logs) is written to, never measured or renamed.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        paths.private_dir(self.path.parent)
        self._fd = -1
        self._size = 0
        self._regular = True
        self._closed = False
        self._open()

    def _open(self) -> None:
        paths.private_file(self.path)  # a new file (first, or after a rotation) is 0600
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        info = os.fstat(fd)
        self._fd, self._regular, self._size = fd, stat.S_ISREG(info.st_mode), info.st_size

    def write(self, line: str) -> None:
        """Append one line. Never raises: a log that cannot be written (a full disk, its directory
        removed, no descriptor left) loses the event, and the daemon goes on (SPEC §13); the next
        line tries to open it again."""
        data = line.encode("utf-8", "backslashreplace")
        with self._lock:
            if self._closed:
                return
            try:
                if self._fd < 0:
                    self._open()
                elif (self._regular and self.max_bytes > 0 and self._size > 0
                      and self._size + len(data) >= self.max_bytes):
                    self._rotate()
                os.write(self._fd, data)
            except OSError:
                return
            self._size += len(data)

    def _rotate(self) -> None:
        # The descriptor is forgotten as it is closed: if the reopen fails, no later line may go
        # to whatever file the kernel gives that number next (the database, a client's socket).
        fd, self._fd = self._fd, -1
        os.close(fd)
        for n in range(BACKUPS - 1, 0, -1):
            older = Path(f"{self.path}.{n}")
            if older.exists():
                os.replace(older, f"{self.path}.{n + 1}")
        try:
            os.replace(self.path, f"{self.path}.1")
        except OSError:
            pass
        self._open()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
