"""`fredica watch`: live progress of running and waiting tasks that fits the terminal.

Each refresh asks the daemon only for what it draws: the running tasks that fit (longest running
first), then the waiting ones next to be claimed in the rows left, each request with the total
that matches; the last line says what did not fit (`3 more running, 9950 waiting`). On a terminal
the live lines are redrawn in place, never more than its height; a task that ends while drawn is
printed once above them, for good. Not on a terminal: one plain line per change, no cursor codes.

Drawn by hand rather than with a terminal library: a cursor-up, a clear-to-end and lines cut to
the width are all it needs, and `rich` would add its import time to a command that redraws every
half second (measured in benchmarks/RESULTS.md, "Listing").
"""

from __future__ import annotations

import shutil
from typing import Any, Callable, Mapping, Sequence

import click

from daemon import client, models, render
from daemon.errors import FredicaError

INTERVAL = 0.5  # seconds between refreshes
RUNNING = models.TaskStatus.RUNNING.value  # paused tasks are running ones too
WAITING = models.DisplayStatus.WAITING.value


def rows_for_tasks() -> int:
    """Task lines that fit: the terminal's height less the last line and the line the cursor
    waits on (so that nothing scrolls); at least one."""
    return max(1, shutil.get_terminal_size().lines - 2)


def summary_line(more_running: int, waiting: int, waiting_drawn: bool) -> str:
    """`3 more running, 9950 waiting` (`more waiting` when some waiting tasks are drawn)."""
    return f"{more_running} more running, {waiting} {'more ' if waiting_drawn else ''}waiting"


class Screen:
    """Where `watch` draws: redrawn in place on a terminal, one line per change otherwise."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.live_lines = 0
        self.shown: dict[str, tuple[str, int, str]] = {}
        self.last_summary: str | None = None

    def update(self, finished: Sequence[Mapping[str, Any]], active: Sequence[Mapping[str, Any]],
               summary: str | None = None) -> None:
        """Print the tasks that just finished (once, for good), the active ones and the last line."""
        if not self.tty:
            for task in [*finished, *active]:
                state = (render.display_status(task), int(task.get("progress") or 0), str(task.get("status_text")))
                if self.shown.get(task["id"]) != state:
                    self.shown[task["id"]] = state
                    click.echo(render.progress_line(task))
            for task in finished:
                self.shown.pop(task["id"], None)
            if summary is not None and summary != self.last_summary:
                self.last_summary = summary
                click.echo(summary)
            return
        width = shutil.get_terminal_size().columns
        # Back to the first live line, clear to the end of the screen, draw again; a line cut to
        # one less than the width never wraps, so the count of lines to go back over stays true.
        out = [f"\x1b[{self.live_lines}A\r\x1b[J"] if self.live_lines else []
        live = [render.progress_line(task) for task in active] + ([summary] if summary is not None else [])
        out += [line[: width - 1] + "\n" for line in [*(render.progress_line(t) for t in finished), *live]]
        self.live_lines = len(live)
        click.echo("".join(out), nl=False, color=True)  # color=True: keep the escapes


class Watch:
    """What one `watch` has seen: task id → its latest dict, and which have been printed as ended."""

    def __init__(self, fredica: client.Client, run_id: str | None = None) -> None:
        self.fredica = fredica
        self.run_id = run_id  # None: every task
        self.known: dict[str, dict[str, Any]] = {}
        self.printed: set[str] = set()

    def _listed(self, status: str, sort: str, limit: int) -> tuple[list[dict[str, Any]], int]:
        args: dict[str, Any] = {"status": status, "sort": sort, "limit": limit, "total": True}
        if self.run_id is not None:
            args["run"] = self.run_id
        listed = self.fredica.stream("ls_pages", **args)
        found = list(listed)
        return found, int(listed.final.get("total") or 0)

    def refresh(self, rows: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, bool]:
        """(ended since the last refresh, active ones drawn, the last line, whether nothing is active)."""
        running, running_total = self._listed(RUNNING, "duration", rows)
        waiting, waiting_total = self._listed(WAITING, "priority", rows - len(running))
        drawn = running + waiting
        ids = {task["id"] for task in drawn}
        ended = []
        for task_id, task in list(self.known.items()):
            if task_id in ids or task.get("status") not in models.ACTIVE_STATUSES:
                continue
            # No longer drawn: ended, or only pushed out of the rows by others.
            try:
                now = self.fredica.get(task_id)
            except FredicaError:
                now = dict(task, status="unknown")
            if now.get("status") in models.ACTIVE_STATUSES:
                del self.known[task_id]
            else:
                self.known[task_id] = now
                ended.append(now)
        self.known.update((task["id"], task) for task in drawn)
        line = summary_line(running_total - len(running), waiting_total - len(waiting), bool(waiting))
        return ended, drawn, line, running_total + waiting_total == 0


def _watch_one(fredica: client.Client, task_id: str, screen: Screen, sleep: Callable[[float], None]
               ) -> list[dict[str, Any]]:
    """One task until it ends; the task then."""
    while True:
        task = fredica.get(task_id)
        if task.get("status") not in models.ACTIVE_STATUSES:
            screen.update([task], [])
            return [task]
        screen.update([], [task])
        sleep(INTERVAL)


def run(fredica: client.Client, target: str | None, tty: bool, sleep: Callable[[float], None]) -> bool:
    """Watch until nothing watched is active (or Ctrl-C); print the outcome. Whether every task
    watched completed (for `watch ID`'s exit status)."""
    screen = Screen(tty)
    run_id = None
    if target is not None:
        shown = fredica.call("show", id=target, tasks_limit=0)
        if shown["kind"] == "task":
            ended = _watch_one(fredica, shown["object"]["id"], screen, sleep)
            click.echo(render.outcome_summary(ended))
            return render.all_completed(ended)
        run_id = shown["object"]["id"]
    watch = Watch(fredica, run_id)
    while True:
        ended, drawn, line, done = watch.refresh(rows_for_tasks())
        screen.update(ended, drawn, None if done else line)
        if done:
            break
        sleep(INTERVAL)
    if run_id is None:
        click.echo(render.outcome_summary(watch.known.values()))
        return render.all_completed(watch.known.values())
    counts: dict[str, int] = fredica.call("show", id=run_id, tasks_limit=0)["object"].get("task_counts") or {}
    click.echo(render.counts_summary(counts))
    return set(counts) <= {models.TaskStatus.COMPLETED.value}

