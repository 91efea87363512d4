"""Finished runs removed as they age: `[daemon] keep_finished`'s hourly pass, and their log files.

The rows go in chunks (`daemon.store.cleaning`), one per tick of the loop while a pass lasts, so
that the loop goes on claiming and finishing tasks between them. A task's log files go only once
the chunk that removed its row is committed: a rolled-back chunk must leave its logs, and a log
that is already missing is no error.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Callable, Iterable

import structlog

from daemon.store import cleaning

log = structlog.get_logger("fredica.cleaning")
EVERY = 3600.0  # seconds from the end of one keep_finished pass to the start of the next


def remove_logs(task_log: Callable[[str], Path], task_ids: Iterable[str]) -> int:
    """Delete each task's log (`<id>.log` and its rotated `<id>.log.1`); how many tasks had one."""
    removed = 0
    for task_id in task_ids:
        path = task_log(task_id)
        found = False
        for name in (path, Path(f"{path}.1")):
            try:
                os.unlink(name)
                found = True
            except FileNotFoundError:
                pass
            except OSError as exc:  # not ours to fix here: the row is gone, the file stays
                log.warning("task_log_not_removed", task_id=task_id, path=str(name), error=exc.strerror)
        removed += found
    return removed


class KeepFinished:
    """Removes runs finished more than `keep` seconds ago: a pass at the first tick, then one
    every EVERY seconds after the last ended; `keep` 0 keeps everything."""

    def __init__(self, keep: float, *, every: float = EVERY, limit: int = cleaning.CHUNK) -> None:
        self.keep = keep
        self.every = every
        self.limit = limit
        self.next_at: float | None = None if keep <= 0 else 0.0  # None: never
        self._before = self.next_at

    def undo(self) -> None:
        """The tick's transaction was rolled back: its chunk is to be taken again."""
        self.next_at = self._before

    def due(self, now: float) -> bool:
        return self.next_at is not None and now >= self.next_at

    def tick(self, conn: sqlite3.Connection, now: float) -> cleaning.Removed | None:
        """One chunk of the pass if one is due (inside the caller's transaction); None if not.
        While the pass lasts, `next_at` stays `now`: the next tick takes the next chunk."""
        self._before = self.next_at  # what `undo` goes back to, should this tick be rolled back
        if not self.due(now):
            return None
        removed = cleaning.remove_chunk(conn, cutoff=now - self.keep, limit=self.limit)
        self.next_at = now if removed.more else now + self.every
        if removed.runs or removed.tasks:
            log.info("finished_runs_removed", runs=removed.runs, tasks=removed.tasks, more=removed.more,
                     keep_finished=self.keep)
        return removed
