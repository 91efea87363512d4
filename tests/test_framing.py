"""executors.framing: the one frame format of every socket and pipe, and Connection.send_bytes's."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from executors import framing


def frames_of(*bodies: bytes) -> bytes:
    return b"".join(framing.encode(body, 1000) for body in bodies)


def test_bodies_come_whole_from_pieces_of_any_size_and_what_follows_is_kept() -> None:
    data = frames_of(b"one", b"", b"three" * 50)
    for piece in (1, 2, 3, 5, 7, len(data)):
        frames = framing.Frames(1000)
        found = []
        for start in range(0, len(data), piece):
            found += frames.bodies(data[start : start + piece])
        assert found == [b"one", b"", b"three" * 50]
        assert frames.buffered == 0


def test_feed_gives_one_frame_at_a_time_and_feed_with_nothing_finds_the_next() -> None:
    frames = framing.Frames(1000)
    assert frames.feed(frames_of(b"a", b"b")[:-1]) == b"a"
    assert frames.feed() is None
    assert frames.missing() == "1 of 1 bytes missing"
    assert frames.feed(b"b") == b"b"
    assert frames.feed(b"\0\0") is None and frames.missing() == "2 of the 4 header bytes missing"


def test_an_oversized_header_is_refused_before_its_body_and_the_limit_may_change() -> None:
    frames = framing.Frames(10)
    with pytest.raises(framing.Oversized) as caught:
        frames.feed((11).to_bytes(4, "big"))
    assert (caught.value.size, caught.value.limit) == (11, 10)
    assert str(caught.value) == "message of 11 bytes is over the 10 byte limit"
    frames.clear()
    frames.limit = 20
    assert frames.feed(framing.encode(b"x" * 11, 20)) == b"x" * 11
    with pytest.raises(framing.Oversized):
        framing.encode(b"x" * 21, 20)


def test_the_long_format_is_connection_send_bytes_s() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    with reader, writer:
        writer.send_bytes(b"pickled")
        frames = framing.Frames(framing.UNBOUNDED, long_sizes=True)
        assert frames.bodies(os.read(reader.fileno(), 100)) == [b"pickled"]
        os.write(writer.fileno(), framing.header(3, long_sizes=True) + b"abc")
        assert reader.recv_bytes() == b"abc"
    # A frame of 2 GiB or more: -1, then its length in 8 bytes (as Connection writes it).
    long = framing.header(2**31, long_sizes=True)
    assert long == b"\xff\xff\xff\xff" + (2**31).to_bytes(8, "big")
    assert framing.body_size(long[:4], framing.UNBOUNDED, long_sizes=True) is None  # the rest to come
    assert framing.body_size(long, framing.UNBOUNDED, long_sizes=True) == (12, 2**31)
    with pytest.raises(framing.Oversized):
        framing.body_size(long[:4], 100)  # read as the short format, 4 GiB - 1
    with pytest.raises(framing.Garbled):
        framing.Frames(100, long_sizes=True).feed((-2).to_bytes(4, "big", signed=True))


def test_read_frame_reads_no_byte_past_its_frame() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, framing.header(5, long_sizes=True) + b"first" + framing.header(2, long_sizes=True) + b"2n")
        assert framing.read_frame(read_fd, framing.UNBOUNDED, long_sizes=True) == b"first"
        assert framing.read_frame(read_fd, framing.UNBOUNDED, long_sizes=True) == b"2n"
        os.write(write_fd, (9).to_bytes(4, "big") + b"cut")
        os.close(write_fd)
        write_fd = -1
        assert framing.read_frame(read_fd, framing.UNBOUNDED) is None  # end of file inside it
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
