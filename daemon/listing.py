"""How `ls` and `show RUN` fit what they print: the task table's columns, its width, the "more"
line, and the times `--since` takes.

Pure functions from reply data to lines, like `daemon.render`, with the width passed in: the
terminal's on a terminal, None (no cut) when the output goes to a file or a pipe.
"""

from __future__ import annotations

import datetime
import re
import shutil
import sys
from typing import Any, Iterable, Mapping, Sequence

from daemon import models, render

DEFAULT_LIMIT = 50  # tasks `ls` and `show RUN` print unless told otherwise
HEADERS = ("ID", "RUN", "TYPE", "STATUS", "PROGRESS", "PRI", "RETRIES", "AGE", "TIME", "STATUS TEXT")
RIGHT = ("PROGRESS", "PRI", "RETRIES", "AGE", "TIME")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
# The order a run's counts are listed in: what is going on first, then how things ended.
COUNT_ORDER = ("running", "paused", "waiting", "failed", "cancelled", "completed")


def terminal_width() -> int | None:
    """The terminal's width when the output is one (None: not cut, plain lines for a file)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def parse_since(text: str, now: float) -> float:
    """`--since`: an age (`30s`, `10m`, `2h`, `7d`, `1w`) before `now`, or an ISO 8601 time (local
    time when it names no zone); the Unix time it means. ValueError with what it takes otherwise."""
    found = _AGO.fullmatch(text.strip().lower())
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither an age (30s, 10m, 2h, 7d, 1w) nor an ISO time "
                         "(2026-01-31 or 2026-01-31T08:00)") from None
    return moment.timestamp() if moment.tzinfo else moment.astimezone().timestamp()


def status_text(task: Mapping[str, Any]) -> str:
    """What a task says of itself: its status text while active; how it ended after (the error's
    kind and first line); nothing for a task that completed (its last text is stale)."""
    status = task.get("status")
    if status in models.TERMINAL_STATUSES:
        if not task.get("error_type"):
            return ""
        first = str(task.get("error") or "").splitlines()
        return str(task["error_type"]) + (f": {first[0]}" if first else "")
    return str(task.get("status_text") or "")


def run_time(task: Mapping[str, Any], now: float) -> str:
    """How long it ran, or has been running: `-` if it never started."""
    started = task.get("started_at")
    if not started:
        return "-"
    return render.duration((task.get("completed_at") or now) - started)


def row(task: Mapping[str, Any], now: float) -> list[str]:
    """One task's cells, in HEADERS' order."""
    return [
        render.short_id(task.get("id")),
        render.short_id(task.get("workflow_run_id")),
        str(task.get("type")),
        render.display_status(task),
        render.percent(task.get("progress")),
        str(task.get("priority", 0)),
        f"{task.get('retry_count', 0)}/{task.get('max_retries', 0)}",
        render.age(task.get("created_at"), now),
        run_time(task, now),
        render.one_line(status_text(task)),
    ]


class TaskTable:
    """The task table, printed a page at a time: its columns are as wide as the first page needs
    (a later cell that is wider widens only its own line), and every line is cut to `width`."""

    def __init__(self, first: Sequence[Mapping[str, Any]], now: float, width: int | None) -> None:
        self.now = now
        self.width = width
        cells = [row(task, now) for task in first]
        self.widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(HEADERS)]

    def _line(self, cells: Sequence[str]) -> str:
        padded = (cell.rjust(w) if header in RIGHT else cell.ljust(w)
                  for cell, w, header in zip(cells, self.widths, HEADERS))
        line = "  ".join(padded).rstrip()
        # The status text is last, so a cut takes from it first: the columns before it stay whole.
        return line if self.width is None else line[: self.width]

    def header(self) -> str:
        return self._line(HEADERS)

    def lines(self, tasks: Iterable[Mapping[str, Any]]) -> list[str]:
        return [self._line(row(task, self.now)) for task in tasks]


def more_line(total: int, shown: int, hint: str = "--limit N, --all") -> str | None:
    """`49950 more (--limit N, --all)`, or None when everything was shown."""
    left = total - shown
    return f"{left} more ({hint})" if left > 0 else None


def counts_line(counts: Mapping[str, int]) -> str:
    """`tasks: 2 running, 40 waiting, 958 completed` (the statuses as people see them)."""
    names = sorted(counts, key=lambda n: COUNT_ORDER.index(n) if n in COUNT_ORDER else len(COUNT_ORDER))
    total = sum(counts.values())
    return f"tasks: {total} (" + ", ".join(f"{counts[name]} {name}" for name in names if counts[name]) + ")"
