"""A task's status channel: both ends of the one-way pipe an attempt reports on.

Each executor process gets its own pipe, which a launcher's forks share one after another (a
launcher forks the next only once the last has exited, and ends what that one left running). A
process killed in the middle of a write can corrupt only that pipe, which the supervisor then
closes (or, for a launcher's fork, resynchronises after the fork's exit: `discard_partial`), and
one that floods it blocks on the full pipe (backpressure) instead of growing the supervisor's
memory.

Framing is ours (`executors.framing`) rather than `Connection.send`/`recv`: a 4-byte big-endian
length, then the message as UTF-8 JSON. The supervisor reads with a non-blocking fd and its own buffer, so a half-written
message never blocks it, and it only ever decodes data, never pickles from a child. The
`multiprocessing` Connection objects are used only to hand the pipe's fds to the child.
"""

from __future__ import annotations

import json
import os
import select
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping, NoReturn

from executors import framing

HEADER_SIZE = framing.HEADER
# Far above any result an attempt may send (max_result_bytes); a length beyond it can only be
# garbage, so the channel is dropped.
MAX_MESSAGE = 64 * 1024 * 1024
READ_CHUNK = 64 * 1024  # the default pipe capacity on Linux
# Room in a message besides its result: every other message is far smaller (their texts are cut
# to at most 10,000 characters, each at most 7 bytes once escaped).
MESSAGE_SLACK = 128 * 1024


def frame_limit(max_result_bytes: int) -> int:
    """The longest message an attempt may send when its result may take `max_result_bytes` as
    JSON: a result given as JSON text is a string in the message, each character escaped to at
    most two."""
    return min(MAX_MESSAGE, 2 * max_result_bytes + MESSAGE_SLACK)


def poll_now(fd: int) -> int:
    """The poll(2) events of `fd` at this moment (0: nothing to read, no hang-up), without waiting."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    events = poller.poll(0)
    return events[0][1] if events else 0


def encode(message: Mapping[str, Any]) -> bytes:
    """One framed message; TypeError or ValueError if it is not plain JSON (framing.Oversized if
    longer than MAX_MESSAGE).

    Text that is not valid Unicode (a lone surrogate, as os.fsdecode makes of a file name's
    undecodable bytes) is sent with those characters as backslash escapes, not refused, where it
    is only words for people (a progress text, a reason, an error); a result's value, which other
    tasks read, stays refused (UnicodeEncodeError is a ValueError)."""
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        body = text.encode()
    except UnicodeEncodeError:
        escaped = {key: value if key == "result" else _escaped(value) for key, value in message.items()}
        body = json.dumps(escaped, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return framing.encode(body, MAX_MESSAGE)


def _escaped(value: Any) -> Any:
    """`value` with every string's lone surrogates written as backslash escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v) for v in value]
    return value


class StatusQueue:
    """The child's end of its status channel: `put` sends one message, blocking while the pipe is full."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._fd = connection.fileno()
        # Executor threads may report concurrently; a message bigger than PIPE_BUF takes several
        # writes, which must not interleave with another thread's.
        self._lock = threading.Lock()
        # Called, instead of raising BrokenPipeError, once the supervisor's end is gone: the
        # attempt is then ended as one whose daemon died (executors._parent), not by a traceback.
        self.on_broken: Callable[[], NoReturn] | None = None

    def put(self, message: Mapping[str, Any]) -> None:
        """Send `message` (encoded before anything is written, so a bad one sends nothing)."""
        self.put_frame(encode(message))

    def put_frame(self, frame: bytes) -> None:
        """Send a message already framed by `encode`."""
        data = memoryview(frame)
        with self._lock:
            while data:
                try:
                    written = os.write(self._fd, data)
                except BrokenPipeError:
                    if self.on_broken is None:
                        raise
                    self.on_broken()
                data = data[written:]

    def close(self) -> None:
        """Close the child's end; the supervisor then sees end-of-file after the last message."""
        self._connection.close()


class StatusReader:
    """The supervisor's end of a status channel: wait on it, then `drain` without ever blocking."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._fd = connection.fileno()
        os.set_blocking(self._fd, False)
        # A message announced as longer than its limit closes the channel as soon as its header
        # is read, before its body is: no executor can make the supervisor hold more
        # (`max_message`, set from `frame_limit`).
        self._frames = framing.Frames(MAX_MESSAGE)
        self.closed = False  # True once no further message can arrive
        self.close_reason: str | None = None
        self.broken = False  # closed because it failed, not because the writer was done
        self.oversized: int | None = None  # the length of the message that was over `max_message`

    @property
    def max_message(self) -> int:
        """The longest message this channel takes (at most MAX_MESSAGE)."""
        return self._frames.limit

    @max_message.setter
    def max_message(self, limit: int) -> None:
        self._frames.limit = limit

    def fileno(self) -> int:
        """The fd the supervisor's loop waits on (daemon.pipes.ready), with the process sentinels."""
        return self._fd

    def drain(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Up to `limit` messages that have fully arrived (all of them if None), never blocking.

        End-of-file, a read error or garbled data mark the channel closed; nothing is raised.
        """
        messages: list[dict[str, Any]] = []
        data = b""
        while limit is None or len(messages) < limit:
            message = self._next_message(data)
            if message is not None:
                messages.append(message)
                data = b""
                continue
            if self.closed:
                break
            data = self._read()
            if not data:
                break
        return messages

    def mark_closed(self, reason: str, *, broken: bool = False) -> None:
        """Stop reading: whatever is still buffered or unread is discarded. `broken`: the channel
        failed (garbled data, a read error) rather than ended."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self.broken = broken
        self._frames.clear()

    def discard_partial(self) -> None:
        """Drop the start of a message whose writer died before finishing it (a launcher's fork:
        the launcher keeps the pipe open, so no end-of-file says so)."""
        self._frames.clear()

    def close(self) -> None:
        """Release the fd."""
        self.mark_closed(self.close_reason or "closed by the supervisor")
        self.connection.close()

    def _read(self) -> bytes:
        """What the pipe holds; b"" when nothing more is available now (closed at its end)."""
        try:
            chunk = os.read(self._fd, READ_CHUNK)
        except BlockingIOError:
            return b""
        except OSError as exc:
            self.mark_closed(f"read error: {exc}", broken=True)
            return b""
        if not chunk:
            partial = self._frames.buffered > 0
            self.mark_closed("end of file inside a message" if partial else "end of file")
        return chunk

    def _next_message(self, data: bytes) -> dict[str, Any] | None:
        if self.closed:
            return None
        try:
            body = self._frames.feed(data)
        except framing.Oversized as exc:
            if exc.size > MAX_MESSAGE:
                self.mark_closed(f"garbled data: a message length of {exc.size} bytes", broken=True)
            else:
                self.oversized = exc.size
                self.mark_closed(f"a message of {exc.size} bytes, over the limit of {exc.limit}", broken=True)
            return None
        if body is None:
            return None
        try:
            message = json.loads(body)
        except ValueError as exc:  # includes UnicodeDecodeError
            self.mark_closed(f"garbled data: {exc}", broken=True)
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self.mark_closed("garbled data: a message that is not an object with a type", broken=True)
            return None
        return message
