"""The peers' task functions (RQ and Huey import them in their workers; no daemon imports here).

Stdlib only and tiny on purpose: RQ's default `Worker` forks a work horse per job and the horse
imports this module again every time (its parent never imports job modules), so this module's
import cost is part of what RQ's fork-per-job mode costs per job, as it would be for a user.

- `noop`, `stamp`: for RQ, which records completion itself (finished-job registry, result stream).
  `stamp` returns the time it started running (`time.time()`, its first statement).
- `noop_marked`, `stamp_marked`: for Huey, which records nothing for a task that returns None.
  Instead of making Huey store results (one more SQLite write per task), each task appends to the
  file named by $PEER_MARKER at its very end: one byte for `noop_marked`, the start time and a
  newline for `stamp_marked`. The client watches the file's size. O_APPEND writes of a few bytes
  are atomic, so the two worker processes never interleave within a record.
"""

from __future__ import annotations

import os
import time

MARKER_ENV = "PEER_MARKER"


def noop(*args: object) -> None:
    """Does nothing (a Huey pipeline passes the previous result as an argument: accepted)."""


def stamp(*args: object) -> float:
    """Returns the time it started running."""
    return time.time()


def _append(data: bytes) -> None:
    fd = os.open(os.environ[MARKER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def noop_marked(*args: object) -> None:
    """Does nothing, then marks its completion with one byte."""
    _append(b".")


def stamp_marked(*args: object) -> None:
    """Records the time it started running, as a line, at its end."""
    append_stamp(time.time())


def append_stamp(started: float) -> None:
    """Appends `started` as a line: the record of a stamping task (the client reads it back)."""
    _append(b"%.6f\n" % started)
