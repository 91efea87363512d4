"""The control channel's reader: commands reach exactly the attempt they name."""

from __future__ import annotations

import os
import threading
from typing import Iterator

import pytest

from executors import channel, steering
from executors.steering import ControlReader
from tests.conftest import wait_for


@pytest.fixture
def control() -> Iterator[tuple[ControlReader, int]]:
    read_fd, write_fd = os.pipe()
    yield ControlReader(read_fd), write_fd
    os.close(write_fd)  # the reader thread sees end-of-file and stops


def send(write_fd: int, kind: str, attempt: str) -> None:
    os.write(write_fd, steering.command(kind, attempt))


def test_commands_steer_the_current_attempt(control: tuple[ControlReader, int]) -> None:
    reader, write_fd = control
    attempt = reader.steer("task#1")
    send(write_fd, "pause", "task#1")
    wait_for(lambda: not attempt.resume.is_set())
    send(write_fd, "resume", "task#1")
    wait_for(attempt.resume.is_set)
    send(write_fd, "pause", "task#1")
    send(write_fd, "cancel", "task#1")  # wakes a paused attempt, cancel first
    wait_for(attempt.cancel.is_set)
    assert attempt.resume.is_set()


def test_a_command_sent_before_its_attempt_starts_is_kept_for_it(control: tuple[ControlReader, int]) -> None:
    reader, write_fd = control
    reader.start()  # an earlier attempt of this process used its Events: the thread reads ahead
    send(write_fd, "pause", "task#2")
    send(write_fd, "cancel", "other#1")
    send(write_fd, "pause", "other#1")  # read after the cancel above: its arrival marks both read
    wait_for(lambda: "other#1" in reader._pending and len(reader._pending["other#1"]) == 2)
    attempt = reader.steer("task#2")
    assert not attempt.resume.is_set() and not attempt.cancel.is_set()
    assert reader._pending == {}  # the rest was for attempts that never came


def test_a_command_for_an_earlier_attempt_of_the_same_task_never_steers_its_retry(
    control: tuple[ControlReader, int]
) -> None:
    reader, write_fd = control
    reader.steer("task#1")
    retry = reader.steer("task#2")  # the same task again, after its first attempt ended
    send(write_fd, "cancel", "task#1")  # late: meant for the attempt that is over
    send(write_fd, "pause", "task#2")  # read after the late cancel
    wait_for(lambda: not retry.resume.is_set())
    assert not retry.cancel.is_set()
    reader.steer("task#3")
    assert reader._pending == {}


def test_no_thread_reads_until_an_attempt_uses_its_events(control: tuple[ControlReader, int]) -> None:
    reader, write_fd = control
    attempt = reader.steer("task#1")
    send(write_fd, "pause", "task#1")
    send(write_fd, "cancel", "other#1")
    assert reader._thread is None
    # The first use applies everything sent so far before it answers: no waiting needed.
    assert not attempt.resume.is_set()
    assert reader._pending == {"other#1": [("cancel", None)]}
    assert reader._thread is not None and reader._thread.is_alive()
    send(write_fd, "cancel", "task#1")  # and the thread applies what comes later
    wait_for(attempt.cancel.is_set)
    assert attempt.resume.is_set()


def test_a_cancel_says_why_to_the_attempt_it_names(control: tuple[ControlReader, int]) -> None:
    reader, write_fd = control
    os.write(write_fd, steering.command("cancel", "task#2", "shutdown"))  # before its attempt starts
    os.write(write_fd, steering.command("cancel", "task#1", "timeout"))
    earlier = reader.steer("task#1")
    assert earlier.cancel_reason == "timeout" and earlier.cancel.is_set()
    later = reader.steer("task#2")
    assert later.cancel_reason == "shutdown" and later.cancel.is_set()
    assert reader.steer("task#3").cancel_reason is None  # not cancelled


def test_a_stale_resume_cannot_end_a_pause_the_executor_asks_for_later(
    control: tuple[ControlReader, int]
) -> None:
    reader, write_fd = control
    attempt = reader.steer("task#1")
    send(write_fd, "pause", "task#1")  # a user's pause and resume, never looked at by the attempt
    send(write_fd, "resume", "task#1")
    attempt.resume.clear()  # the seed's clear of request_pause: applies both commands first
    assert not attempt.resume.is_set()


def test_a_second_threads_first_use_waits_until_the_commands_already_sent_are_applied(
    control: tuple[ControlReader, int]
) -> None:
    reader, write_fd = control
    attempt = reader.steer("task#1")
    send(write_fd, "pause", "task#1")
    feeding, go = threading.Event(), threading.Event()
    feed = reader._feed

    def slow_feed(chunk: bytes) -> None:
        feeding.set()
        go.wait()
        feed(chunk)

    reader._feed = slow_feed  # type: ignore[method-assign]
    first = threading.Thread(target=attempt.cancel.is_set)
    first.start()
    feeding.wait()
    seen: list[bool] = []
    second = threading.Thread(target=lambda: seen.append(attempt.resume.is_set()))
    second.start()
    second.join(0.5)  # time for a wrong answer to show; the right one comes only after `go`
    go.set()
    first.join()
    second.join()
    assert seen == [False]  # paused: the command sent before either use


def test_garbage_on_the_control_pipe_stops_nothing(control: tuple[ControlReader, int]) -> None:
    reader, write_fd = control
    attempt = reader.steer("task#1")
    os.write(write_fd, (5).to_bytes(4, "big") + b"\xffnot")
    os.write(write_fd, b"{")  # completes a 5-byte frame that is not JSON
    os.write(write_fd, steering.encode({"type": "explode", "attempt": "task#1"}))
    send(write_fd, "cancel", "task#1")
    wait_for(attempt.cancel.is_set)


def test_an_unknown_command_cannot_be_sent() -> None:
    with pytest.raises(ValueError):
        steering.command("kill", "task#1")


def test_a_forks_rehearsal_runs_clean_and_leaves_steering_idle(control: tuple[ControlReader, int]) -> None:
    from executors import endpoint

    reader, write_fd = control
    send(write_fd, "cancel", "task#1")
    endpoint._rehearse(endpoint._rehearsal_assignment(), reader)  # raises if any step breaks
    assert reader._thread is None  # the command still waits for the real attempt
    assert reader.steer("task#1").cancel.is_set()


def test_a_header_longer_than_any_command_stops_reading_rather_than_buffering() -> None:
    commands = steering.Commands()
    attempt = steering.Steering("task#1", ControlReader(-1))
    commands.attach(attempt)
    commands.feed(steering.command("pause", "task#1"))
    assert not threading.Event.is_set(attempt.resume)
    commands.feed((channel.MAX_MESSAGE + 1).to_bytes(4, "big") + b"x" * 100)
    commands.feed(steering.command("resume", "task#1"))  # framing lost: nothing after it is a command
    assert not threading.Event.is_set(attempt.resume)
    assert commands._frames is None  # and nothing of the garbage is held
