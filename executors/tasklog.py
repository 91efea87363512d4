"""A task's log on disk, kept within `max_task_log_bytes` (SPEC §13): `<id>.log`, and `<id>.log.1`.

Once the log holds half the limit, that half is copied to `<id>.log.1` (which it replaces) and the
log is truncated, rather than renamed: everything that writes it holds it open with O_APPEND (the
executor process's fds 1 and 2, and the commands it started with them), and a renamed file would
still take their output. After the truncation their next write lands at the new end, offset 0, so
every writer is bounded alike. A write that lands between the last look at the size and the
truncation is lost: microseconds once in every half-limit of output.

A log found far over its half (output written straight to the fds, between two looks) keeps its
last half only, after a first line that says how much was dropped (`dropped`), so that a reader
following it knows where it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

COPY_ROUNDS = 4  # the log grows while it is copied: catch up this often, then truncate anyway
_DROPPED = "[... {} bytes of earlier output dropped: the log is kept within max_task_log_bytes]\n"
_DROPPED_PATTERN = re.compile(rb"\[\.\.\. (\d+) bytes of earlier output dropped")


def rotated(path: str) -> str:
    """The log's previous half: `<id>.log.1`."""
    return f"{path}.1"


def rotate(path: str, keep: int) -> bool:
    """If the log at `path` holds `keep` bytes or more, make them `path.1` and empty the log;
    True if it did. False too when another process is rotating it at this moment (it takes an
    exclusive flock of its own for that), or when it cannot be done (an OSError: the log's disk
    is full...); the next look tries again."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size < keep:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when fd is closed
        except OSError:
            return False
        end = os.fstat(fd).st_size
        if end < keep:  # another rotation came first
            return False
        _copy_and_truncate(fd, path, end, keep)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _copy_and_truncate(fd: int, path: str, end: int, keep: int) -> None:
    tmp = f"{rotated(path)}.tmp"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        start = 0
        if end > 2 * keep:  # far over: keep the last half, from the start of a line
            start = _next_line(fd, end - keep)
            os.write(out, _DROPPED.format(start).encode())
        copied = start
        for _ in range(COPY_ROUNDS):
            copied += _copy(fd, out, copied, end - copied)
            end = os.fstat(fd).st_size
            if copied >= end:
                break
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(out)
    os.replace(tmp, rotated(path))


def _next_line(fd: int, offset: int) -> int:
    """The offset of the first line that starts at or after `offset` (within 64 KiB; else `offset`)."""
    if offset == 0 or os.pread(fd, 1, offset - 1) == b"\n":
        return offset
    block = os.pread(fd, 64 * 1024, offset)
    newline = block.find(b"\n")
    return offset + newline + 1 if newline != -1 else offset


def _copy(src: int, dst: int, offset: int, count: int) -> int:
    """Copy `count` bytes of `src` from `offset` to the end of `dst`; the bytes copied."""
    done = 0
    while done < count:
        try:
            step = os.copy_file_range(src, dst, count - done, offset + done)
        except OSError:  # not supported here (an old kernel, some file systems)
            data = os.pread(src, min(count - done, 1 << 20), offset + done)
            step = len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]
        if step == 0:
            break
        done += step
    return done


def dropped(head: bytes) -> int | None:
    """How many bytes of the log before it a rotated log left out, read from its first line
    (None if it left out none)."""
    match = _DROPPED_PATTERN.match(head)
    return int(match.group(1)) if match else None


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
