"""An event-loop process's task log for one attempt (`executors.output.AttemptLog`): whole lines
reach the file as they are written (with what follows them), a line not ended yet waits and is written at the close, the
log stays within its limit, and each attempt's log costs little memory, since a process holds one
for every attempt it runs at once (thousands: SPEC §15)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from daemon.models import TaskStatus
from executors.output import PARTIAL_LINE_MAX, AttemptLog
from tests.conftest import make_task


def test_what_ends_a_line_is_written_at_once_and_a_partial_line_at_the_close(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    log = AttemptLog(str(path), 1 << 20)
    log.write("print without")
    assert path.read_text() == ""
    log.write(" a newline, then\nthe start of the next")
    assert path.read_text() == "print without a newline, then\nthe start of the next"  # as line-buffered
    log.write("\u00e9 \udcff\n")  # a lone surrogate is written escaped, as by the other streams
    assert path.read_text().endswith("the start of the next\u00e9 \\udcff\n")
    log.write("last words")
    log.close()
    assert path.read_text().endswith("\\udcff\nlast words")
    log.write("after the close\n")  # goes nowhere
    assert "after the close" not in path.read_text()


def test_its_logger_writes_formatted_records(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    log = AttemptLog(str(path), 1 << 20)
    logger = log.logger(make_task("ECHO", status=TaskStatus.RUNNING))
    logger.info("halfway there")
    logger.debug("not at INFO")
    log.close()
    [line] = path.read_text().splitlines()
    assert line.endswith(" INFO halfway there")
    assert not logger.handlers  # a long-lived process does not keep it writing to a closed log


def test_the_log_is_kept_within_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    log = AttemptLog(str(path), 64 * 1024)
    for i in range(5000):
        log.write(f"line {i} {'x' * 40}\n")
    log.close()
    assert path.stat().st_size <= 64 * 1024
    assert path.read_text().splitlines()[-1].startswith("line 4999 ")


def test_an_attempts_log_costs_little_memory(tmp_path: Path) -> None:
    """10,000 attempts at once (issue 13's burst) in two processes is 5,000 logs each: at the
    9 KB a TextIOWrapper over a BufferedWriter cost, 45 MB a process."""
    logs = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            log = AttemptLog(str(tmp_path / f"{i}.log"), 1 << 20)
            log.line("INFO", f"task {i} (SLEEP) attempt 1 started in pid 1 with benchmarks.noop:AsyncSleep")
            logs.append(log)
        per_log = (tracemalloc.get_traced_memory()[0] - before) / len(logs)
    finally:
        tracemalloc.stop()
        for log in logs:
            log.close()
    assert per_log < 1024, f"{per_log:.0f} bytes a log"


def test_a_line_that_never_ends_is_neither_held_for_ever_nor_let_grow(tmp_path: Path) -> None:
    """A progress bar redraws one line with carriage returns and never ends it: it is written at
    each one, and a long run of text with no end is written once it passes the bound."""
    path = tmp_path / "t.log"
    log = AttemptLog(str(path), 64 * 1024)
    for percent in range(0, 101, 10):
        log.write(f"\r{percent:3d}%")
    assert path.read_bytes().endswith(b"\r100%")
    for _ in range(3000):
        log.write("x" * 100)  # 300 KB with no end: written as it comes, and kept within the limit
    assert len(log._partial) < PARTIAL_LINE_MAX
    log.close()
    assert path.stat().st_size <= 64 * 1024
