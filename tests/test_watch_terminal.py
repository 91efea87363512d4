"""`fredica watch` and `fredica ls` in a real pseudo-terminal of a fixed size, against the real
daemon with 50 running tasks and 10 waiting: what reaches the screen is replayed on a small
emulator of the few codes `watch` writes (cursor up, clear to the end, carriage return)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.daemon_harness import Daemon

RUNNING, WAITING = 50, 10
TEXT = "muxing stream 3 of 7 into the matroska container " * 4  # ~200 characters
SUMMARY = re.compile(r"\d+ more running, \d+ (more )?waiting")


class Terminal:
    """The screen of a terminal of `rows` x `cols`, fed the text a program writes to it."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.grid = [""] * rows
        self.row = self.col = 0
        self.off_screen: list[int] = []  # cursor-ups past the top: lines that were lost
        self.wrapped = 0  # lines longer than the width
        self.redrawn: list[list[str]] = []  # the screen just before each redraw

    def feed(self, text: str) -> None:
        at = 0
        while at < len(text):
            code = re.match(r"\x1b\[(\d*)([A-Za-z])", text[at:])
            if code:
                self._code(int(code.group(1) or 1), code.group(2))
                at += code.end()
                continue
            char = text[at]
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self._down()
            elif char.isprintable():
                if self.col >= self.cols:
                    self.wrapped += 1
                    self.col = 0
                    self._down()
                line = self.grid[self.row].ljust(self.col)
                self.grid[self.row] = line[: self.col] + char + line[self.col + 1:]
                self.col += 1
            at += 1

    def _down(self) -> None:
        if self.row == self.rows - 1:
            self.grid = self.grid[1:] + [""]  # scrolled: the top line goes to the scrollback
        else:
            self.row += 1

    def _code(self, count: int, name: str) -> None:
        if name == "A":
            self.redrawn.append(list(self.grid))
            if count > self.row:
                self.off_screen.append(count)
            self.row = max(0, self.row - count)
        elif name == "J":
            self.grid[self.row] = self.grid[self.row][: self.col]
            for below in range(self.row + 1, self.rows):
                self.grid[below] = ""


class Pty:
    """A command run on a pseudo-terminal of a fixed size; what it writes, kept as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int, cols: int) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {key: value for key, value in env.items() if key not in ("COLUMNS", "LINES")}
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm"},
                                        start_new_session=True)
        os.close(slave)
        self.master = master
        self.output = b""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the last writer has closed the terminal
                return
            if not chunk:
                return
            with self._lock:
                self.output += chunk

    def text(self) -> str:
        with self._lock:
            return self.output.decode("utf-8", "replace")

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        os.close(self.master)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def gated(tmp_path: Path):
    """A daemon with 50 tasks running (a long status text each) and 10 waiting, until `go` exists."""
    d = Daemon(tmp_path / "d", max_workers=RUNNING, executors={"GATE": "tests.listing_executors:Gate"})
    d.start()
    go = tmp_path / "go"
    try:
        d.data("submit", tasks=[{"type": "GATE", "payload": {"go_file": str(go), "percent": n * 2, "text": TEXT}}
                                for n in range(RUNNING + WAITING)])

        def settled() -> bool:
            running = d.data("ls_pages", status="running", limit=RUNNING, total=True)
            return running["total"] == RUNNING and all(t["status_text"] for t in running["items"])

        wait_for(settled, timeout=90)
        yield d, go
    finally:
        go.touch()
        d.kill_if_running()


def fredica(d: Daemon, *args: str, rows: int, cols: int) -> Pty:
    return Pty([sys.executable, "-m", "daemon", *args, "--config", str(d.config)], d.env(), rows, cols)


def test_watch_fits_a_24_by_80_terminal(gated):
    d, go = gated
    screen = fredica(d, "watch", rows=24, cols=80)
    try:
        # Three redraws of the same state: what stays on the screen while tasks run.
        wait_for(lambda: screen.text().count("28 more running, 10 waiting") >= 3, timeout=30)
        go.touch()
        assert screen.finish(timeout=60) == 0
    finally:
        screen.kill()
    term = Terminal(24, 80)
    term.feed(screen.text())
    assert term.off_screen == []  # every redraw went back over lines still on the screen
    assert term.wrapped == 0
    assert len(term.redrawn) >= 3
    while_running = term.redrawn[1]  # the screen just before the second redraw
    drawn = [line for line in while_running if line.startswith("[")]
    assert len(drawn) == 22  # 24 rows: 22 tasks, the last line, the cursor's line
    last = [line for line in while_running if line][-1]
    assert last == "28 more running, 10 waiting"
    assert all(len(line) == 79 for line in drawn)  # the status text goes on to the edge
    assert all(SUMMARY.fullmatch([line for line in grid if line][-1]) for grid in term.redrawn[1:])
    assert re.search(r"watched \d+ tasks: \d+ completed", screen.text())


def test_ls_uses_a_terminal_wider_than_80_columns(gated):
    d, _ = gated
    screen = fredica(d, "ls", "--status", "running", "--limit", "5", rows=24, cols=132)
    try:
        assert screen.finish(timeout=30) == 0
    finally:
        screen.kill()
    lines = screen.text().replace("\r\n", "\n").splitlines()
    assert lines[0].split()[:2] == ["ID", "RUN"]
    assert [len(line) for line in lines[1:6]] == [132] * 5  # cut at its width, not at 80
    assert lines[-1] == f"{RUNNING - 5} more (--limit N, --all)"
