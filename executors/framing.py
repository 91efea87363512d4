"""Length-prefixed frames: how every pipe and socket between fredica's processes splits its bytes
into messages (the control socket, each executor process's status channel, control pipe and
assignment pipe).

A frame is a 4-byte big-endian length, then that many bytes. What the bytes hold (JSON, a pickle)
and what an oversized or garbled frame means is each channel's own business; the header, the
size check against a limit, the encoder and the incremental decoder are here, once.

The assignment pipe uses a second header format, `multiprocessing.Connection.send_bytes`'s (the
length as a signed 4-byte number, or -1 then an 8-byte one for a frame of 2 GiB or more): the
supervisor writes it without blocking (`daemon.pipes.send_within`), while an executor process may
still read it with `Connection.recv_bytes` (a reused process does), and a launcher's fork reads it
with plain `os.read` (`read_frame`), where Connection's Python code would cost a copy-on-write
page fault per object it touches. `long_sizes=True` selects that format.

Executor processes import this module (the fork server preloads it with `executors.endpoint`), so
it imports nothing of the daemon's and nothing beyond `os`.
"""

from __future__ import annotations

import os

HEADER = 4
_LONG = -1  # Connection.send_bytes's marker of an 8-byte length after it
_LONG_HEADER = HEADER + 8
_LONGEST_SHORT = 0x7FFFFFFF
_READ_LIMIT = 1 << 20  # bytes asked of a blocking fd at once by `read_frame`
# The assignment pipe's limit: only the supervisor writes it, and an assignment is as large as
# the task it carries (whose size the submission already bounded).
UNBOUNDED = 1 << 64


class Oversized(ValueError):
    """A frame longer than its channel's limit: announced by a header read, or about to be sent."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes is over the {limit} byte limit")
        self.size = size
        self.limit = limit


class Garbled(ValueError):
    """A header no writer of the format makes (a negative length other than the long marker)."""


def header(size: int, *, long_sizes: bool = False) -> bytes:
    """The header of a frame whose body is `size` bytes."""
    if long_sizes and size > _LONGEST_SHORT:
        return _LONG.to_bytes(HEADER, "big", signed=True) + size.to_bytes(8, "big")
    return size.to_bytes(HEADER, "big")


def encode(body: bytes, limit: int) -> bytes:
    """The frame of `body` (short format); Oversized if it is longer than `limit`."""
    if len(body) > limit:
        raise Oversized(len(body), limit)
    return len(body).to_bytes(HEADER, "big") + body


def body_size(data: bytes | bytearray, limit: int, *, long_sizes: bool = False, at: int = 0) -> tuple[int, int] | None:
    """(header length, body size) of the frame that starts at `at` in `data`, once its header is
    whole (None before); Oversized over `limit`, Garbled for a header the format has no meaning for."""
    # Slices, not a memoryview: a bytearray that a view is held on (by a traceback, say) cannot
    # be resized, and the decoder clears its buffer after an error.
    if len(data) - at < HEADER:
        return None
    if not long_sizes:
        size, start = int.from_bytes(data[at : at + HEADER], "big"), HEADER
    else:
        size, start = int.from_bytes(data[at : at + HEADER], "big", signed=True), HEADER
        if size == _LONG:
            if len(data) - at < _LONG_HEADER:
                return None
            size, start = int.from_bytes(data[at + HEADER : at + _LONG_HEADER], "big"), _LONG_HEADER
        elif size < 0:
            raise Garbled(f"a message length of {size} bytes")
    if size > limit:
        raise Oversized(size, limit)
    return start, size


class Frames:
    """The incremental decoder: `feed` it bytes as they come, in pieces of any size; it gives each
    frame's body once whole, and keeps what follows for the next one."""

    __slots__ = ("limit", "long_sizes", "_buffer", "_pos", "_size")

    def __init__(self, limit: int, *, long_sizes: bool = False) -> None:
        self.limit = limit  # may be changed between frames (a status channel's, once its attempt is known)
        self.long_sizes = long_sizes
        self._buffer = bytearray()
        self._pos = 0  # where the next frame starts: consumed bytes are dropped only once per feed
        self._size: tuple[int, int] | None = None  # the frame under way's (header length, body size)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet given as part of a frame."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes = b"") -> bytes | None:
        """The body of the next whole frame, else None; Oversized or Garbled from its header (what
        is buffered is then useless: the caller drops the channel, or `clear`s). `feed()` with
        nothing looks for a frame that came behind the last one."""
        if data:
            if self._pos:
                del self._buffer[: self._pos]
                self._pos = 0
            self._buffer += data
        if self._size is None:
            self._size = body_size(self._buffer, self.limit, long_sizes=self.long_sizes, at=self._pos)
            if self._size is None:
                return None
        start, size = self._size
        begin = self._pos + start
        end = begin + size
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[begin:end])
        self._size = None
        if end == len(self._buffer):
            self._buffer.clear()
            self._pos = 0
        else:
            self._pos = end
        return body

    def bodies(self, data: bytes = b"") -> list[bytes]:
        """Every frame `data` completes, in order."""
        found = []
        body = self.feed(data)
        while body is not None:
            found.append(body)
            body = self.feed()
        return found

    def missing(self) -> str:
        """What is still to come, for the error that says the rest never did."""
        if self._size is None:
            return f"{HEADER - self.buffered} of the {HEADER} header bytes missing"
        start, size = self._size
        return f"{start + size - self.buffered} of {size} bytes missing"

    def clear(self) -> None:
        """Drop whatever is buffered (a writer died in the middle of a frame)."""
        self._buffer.clear()
        self._pos = 0
        self._size = None


def read_frame(fd: int, limit: int, *, long_sizes: bool = False) -> bytes | None:
    """One frame's body read from the blocking `fd` with plain os.read, never a byte past it;
    None at end-of-file (or a read error) before it is whole."""
    head = _read_exactly(fd, HEADER)
    if head is None:
        return None
    try:
        found = body_size(head, limit, long_sizes=long_sizes)
        if found is None:  # the long marker: 8 more header bytes
            rest = _read_exactly(fd, _LONG_HEADER - HEADER)
            if rest is None:
                return None
            found = body_size(head + rest, limit, long_sizes=long_sizes)
    except ValueError:  # Oversized, Garbled: nothing this frame holds can be trusted
        return None
    assert found is not None
    return _read_exactly(fd, found[1])


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        try:
            chunk = os.read(fd, min(size, _READ_LIMIT))
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
