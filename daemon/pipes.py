"""Non-blocking I/O on the executor processes' pipes, for the supervisor's loop: waiting on many
at once, and sending a task without ever waiting for good on the process that should read it."""

from __future__ import annotations

import math
import os
import select
from typing import Any, Sequence

from executors import framing


def send_within(fd: int, data: bytes, stall: float) -> None:
    """Write `data` on the non-blocking `fd`, framed as `Connection.send_bytes` frames it; OSError
    if the reader takes none of it for `stall` seconds.

    A task bigger than the pipe is written only as fast as its process reads it, and a process
    that is stopped (SIGSTOP, a debugger) or stuck before reading must not hang the loop: the
    caller ends that process instead.
    """
    size = len(data)
    header = framing.header(size, long_sizes=True)
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # One write for a usual task; a big one is not copied just to prepend its header.
    for part in (header + data,) if size <= 65536 else (header, data):
        view = memoryview(part)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                pass
            if view and not poller.poll(stall * 1000):
                raise OSError(f"the executor process read none of its task for {stall:g} s")


def ready(handles: Sequence[Any], timeout: float | None, writable: Sequence[int] = ()) -> list[Any]:
    """Those of `handles` (fds, or objects with `fileno()`) that are ready to read, and of the fds
    `writable` those ready to be written, waiting up to `timeout` seconds (None: until one is).

    What `multiprocessing.connection.wait` does for the supervisor's handles, with one poll object
    of the C library instead of a Python selector and a key object per handle: the loop waits
    several times per task.
    """
    by_fd: dict[int, Any] = {h if isinstance(h, int) else h.fileno(): h for h in handles}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    for fd in writable:
        poller.register(fd, select.POLLOUT | (select.POLLIN if fd in by_fd else 0))
        by_fd.setdefault(fd, fd)
    milliseconds = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in poller.poll(milliseconds)]
