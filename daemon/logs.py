"""structlog set-up: JSON lines to the daemon's (rotated) log file, readable lines on a terminal.

Every event about a task carries `task_id` and `run_id` (the supervisor binds them), so
`fredica logs` and `jq` can follow one task or run through the daemon log.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import stat
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

from daemon import paths

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


def configure(
    log_file: Path | None,
    *,
    stream: TextIO | None = sys.stderr,
    level: int = logging.INFO,
    max_bytes: int = MAX_BYTES,
) -> None:
    """Route structlog (and stdlib logging) to `log_file` as JSON and to `stream` for people."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    if log_file is not None:
        paths.private_dir(log_file.parent)
        to_file = _RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=BACKUPS)
        to_file.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=shared,
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(),
                ],
            )
        )
        root.addHandler(to_file)
    if stream is not None:
        to_stream = logging.StreamHandler(stream)
        to_stream.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=shared,
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.dev.ConsoleRenderer(colors=stream.isatty()),
                ],
            )
        )
        root.addHandler(to_stream)
    root.setLevel(level)
    # Records carry no caller, thread or process fields we print; not collecting them is the
    # logging HOWTO's own advice for speed (the caller lookup walks the stack for every event).
    # Process-wide: code in the daemon that asks for stack_info=True gets no stack either.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


class _RotatingFileHandler(logging.handlers.RotatingFileHandler):
    """RotatingFileHandler that formats each record once.

    The stdlib's `shouldRollover` formats the record to measure it (and stats the file), then
    `emit` formats it again: with two events per task that was half the cost of logging. Like the
    stdlib's, it never rotates what is not a regular file: a log path that is a FIFO or a link to
    /dev/stdout (a container's way to collect logs) is written to, never measured or renamed.
    """

    _regular_file = True

    def _open(self) -> Any:
        paths.private_file(self.baseFilename)  # a new file (first, or after a rotation) is 0600
        stream = super()._open()
        self._regular_file = stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
        return stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            if self.stream is None:
                self.stream = self._open()
            if (
                self.maxBytes > 0 and self._regular_file
                and self.stream.tell() + len(line) >= self.maxBytes and self.stream.tell() > 0
            ):
                self.doRollover()
            self.stream.write(line)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

