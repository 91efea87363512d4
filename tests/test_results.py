"""What an attempt's result may be (SPEC §8, §13): a JSON object or JSON text, at most
`max_result_bytes`; anything else is BAD_RESULT, never retried, on whichever side it is found."""

from __future__ import annotations

import json
import os
import re
import threading
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any, Callable

import pytest

from daemon import models
from daemon.models import TaskStatus
from daemon.supervisor import Supervisor
from executors import channel
from executors.base import BadResult, stored_result
from tests.conftest import wait_for
from tests.test_supervisor import EXECUTORS, make_supervisor, submit, wait_ended  # noqa: F401 (a fixture)

RESULT_EXECUTORS = EXECUTORS | {
    "RAW_RESULT": "tests.sample_executors:RawResult",
    "OVERSIZED_FRAME": "tests.sample_executors:OversizedFrame",
    "BIG_RESULT": "tests.sample_executors:BigResult",
    "BAD_RESULT": "tests.sample_executors:BadResult",
}


def raw_result(value: Any) -> dict[str, Any]:
    return {"message": {"type": "result", "result": value, "error": None, "error_type": None}}


@pytest.mark.parametrize("value", [[1, 2], 5, "not json", "NaN", True])
def test_a_raw_result_frame_that_is_no_object_nor_json_text_is_a_bad_result(
    make_supervisor: Callable[..., Supervisor], value: Any
) -> None:
    sup = make_supervisor(executors=RESULT_EXECUTORS)
    task = wait_ended(sup, submit(sup, "RAW_RESULT", max_retries=3, payload=raw_result(value)))
    assert task.status is TaskStatus.FAILED and task.error_type == models.BAD_RESULT
    assert task.retry_count == 0 and task.result is None  # never retried, nothing stored


def test_a_raw_result_frame_of_json_text_or_an_object_is_stored(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(executors=RESULT_EXECUTORS)
    as_text = wait_ended(sup, submit(sup, "RAW_RESULT", payload=raw_result("[1, 2]")))
    as_object = wait_ended(sup, submit(sup, "RAW_RESULT", payload=raw_result({"a": 1})))
    assert as_text.status is as_object.status is TaskStatus.COMPLETED
    assert (as_text.result, as_object.result) == ([1, 2], {"a": 1})


def test_a_raw_result_frame_over_max_result_bytes_is_a_bad_result(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(executors=RESULT_EXECUTORS, max_result_bytes=1000)
    fits = wait_ended(sup, submit(sup, "RAW_RESULT", payload=raw_result({"blob": "x" * 989})))  # 1000 bytes
    assert fits.status is TaskStatus.COMPLETED
    task = wait_ended(sup, submit(sup, "RAW_RESULT", max_retries=2, payload=raw_result({"blob": "x" * 990})))
    assert task.status is TaskStatus.FAILED and task.error_type == models.BAD_RESULT and task.retry_count == 0
    assert task.error == "the result takes 1001 bytes as JSON, more than max_result_bytes (1000)"


def test_a_result_over_max_result_bytes_fails_the_task_for_good(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor(executors=RESULT_EXECUTORS, max_result_bytes=10_000)
    task = wait_ended(sup, submit(sup, "BIG_RESULT", max_retries=2, payload={"size": 20_000}))
    assert task.status is TaskStatus.FAILED and task.error_type == models.BAD_RESULT and task.retry_count == 0
    assert "more than max_result_bytes (10000)" in task.error


def test_a_message_announced_longer_than_a_result_may_be_ends_the_attempt_unread(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor(executors=RESULT_EXECUTORS, max_result_bytes=1000)
    pid_file = tmp_path / "pid"
    task_id = submit(sup, "OVERSIZED_FRAME", max_retries=2,
                     payload={"pid_file": str(pid_file), "size": 60 * 1024 * 1024})
    task = wait_ended(sup, task_id)
    assert task.status is TaskStatus.FAILED and task.error_type == models.BAD_RESULT and task.retry_count == 0
    assert task.error.startswith(f"the executor sent a message of {60 * 1024 * 1024} bytes")
    pid = int(pid_file.read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 5)  # ended, not left blocked on its pipe


def test_the_status_reader_never_takes_in_a_message_over_its_limit() -> None:
    reader_end, writer_end = mp_connection.Pipe(duplex=False)
    reader = channel.StatusReader(reader_end)
    reader.max_message = channel.frame_limit(1000)
    size = 10 * 1024 * 1024

    def write() -> None:
        try:
            os.write(writer_end.fileno(), size.to_bytes(channel.HEADER_SIZE, "big") + b"x" * size)
        except BrokenPipeError:
            pass  # the reader is gone: the test's end

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_for(lambda: (mp_connection.wait([reader_end], 5), reader.drain())[1] == [] and reader.closed, 10)
    assert reader.broken and reader.oversized == size
    assert writer.is_alive()  # still blocked on the full pipe: the reader stopped at the header
    reader.close()
    writer.join(10)
    writer_end.close()


@pytest.mark.parametrize(
    ("value", "stored"),
    [(None, None), ({"a": [1]}, {"a": [1]}), ('{"a": 1}', {"a": 1}), ('"done"', "done"), ("[1, 2]", [1, 2])],
)
def test_stored_result_takes_objects_and_json_text(value: Any, stored: Any) -> None:
    assert stored_result(value, 100) == stored


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ([1, 2], "must be a dict (a JSON object) or a JSON string, not list"),
        (3, "not int"),
        ("{", "not valid JSON"),
        ("NaN", "NaN is not a JSON value"),
        ({"x": float("inf")}, "cannot be stored as JSON"),
        ("\ud800", "not valid Unicode"),
        ({"blob": "é" * 50}, "takes 111 bytes as JSON"),  # bytes, not characters
        (json.dumps("x" * 200), "takes 202 bytes"),
    ],
)
def test_stored_result_refuses_anything_else(value: Any, why: str) -> None:
    with pytest.raises(BadResult, match=re.escape(why)):
        stored_result(value, 100)
