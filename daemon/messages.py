"""What an attempt's status messages do to its task (SPEC §6-§7): progress, whether it can be
paused, its own pause and resume requests, log lines, and its result; and what a user's pause and
resume do to it.

Messages change only the supervisor's memory (`Attempt`): what they say has happened, and
cannot be taken back, even if the tick that read them is rolled back (a full disk). The loop
writes that memory's mirror in the task row (`is_paused`, `is_pausable`, progress) from there.
Executors only ever send messages.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Callable

from daemon.engine.attempt import Attempt, Phase
from daemon.errors import NotPausable
from daemon.models import Task, TaskStatus
from daemon.store import tasks
from daemon.store import attempts as attempt_store
from executors.base import ExecuteResult


def apply(at: Attempt, message: dict[str, Any], now: float) -> None:
    """Apply one message to the attempt's memory; a malformed one is logged and skipped, never
    stops the ones after it (the attempt's result among them)."""
    kind = message.get("type")
    try:
        if kind == "progress":
            text = message.get("text")
            at.note_progress(int(message.get("percent", 0)), None if text is None else str(text))
        elif kind == "pausable":
            at.set_pausable(bool(message.get("pausable")))
            if not at.pausable and at.paused_by == "user":
                # Paused by a user while it still counted as pausable (the class default, before
                # the executor read its payload): it will never honour that pause, so the pause
                # is undone, not left to show it paused and stop its timeout's clock. Its own
                # request_pause is its own business.
                at.process.resume(at.token)
                at.note_resumed(now)
                at.log.info("task_resumed", by="supervisor", reason="the executor is not pausable")
        elif kind == "pause_request":
            reason = message.get("reason")
            at.note_paused(now, "executor", None if reason is None else str(reason))
            at.log.info("task_paused", by="executor", reason=reason)
        elif kind == "resume_request":
            at.note_resumed(now)
            at.log.info("task_resumed", by="executor")
        elif kind == "log":
            at.log.log(log_level(message.get("level")), "executor_log", message=str(message.get("message")))
        elif kind == "started":  # sent ahead (prefetch): the supervisor records it `running`
            if not at.started(now):
                at.log.warning("executor_start_ignored", phase=at.phase.value)
        elif kind == "revoked":  # sent ahead, and taken back before it started
            at.was_revoked(now)
        elif kind == "result":
            at.report(ExecuteResult(
                result=message.get("result"), error=message.get("error"), error_type=message.get("error_type")
            ), now)
        else:
            at.log.warning("unknown_executor_message", kind=str(kind))
    except (TypeError, ValueError, OverflowError) as exc:
        at.log.warning("bad_executor_message", kind=str(kind), error=f"{type(exc).__name__}: {exc}")


def pause_by_user(
    conn: sqlite3.Connection, task: Task, at: Attempt | None, paused: bool, now: float
) -> tuple[Task, Callable[[], None]]:
    """Pause (or resume) a running, pausable task for a user (SPEC §7): `is_paused` written, and
    the command to its process with the attempt's memory changed to run once that is committed
    (a request whose tick is rolled back must have done nothing). NotPausable, changing nothing,
    when it cannot be."""
    verb = "paused" if paused else "resumed"
    if task.status is TaskStatus.RUNNING and at is None:
        # Its attempt is over here, its outcome not yet written (one run by another supervisor of
        # a shared queue is asked of it instead: daemon/engine/other_hosts.py).
        raise NotPausable(f"task {task.id} has just finished its attempt: it cannot be {verb}")
    if task.status is not TaskStatus.RUNNING or at is None or at.stopping:
        raise NotPausable(f"task {task.id} is {task.display_status}: only a running task can be {verb}")
    if at.finishing:
        raise NotPausable(f"task {task.id} has just finished its attempt: it cannot be {verb}")
    if paused:
        if not at.pausable:
            raise NotPausable(f"task {task.id} ({task.type}) cannot be paused")
        if at.paused_since is not None:
            raise NotPausable(f"task {task.id} is already paused")
    elif at.paused_since is None:
        raise NotPausable(f"task {task.id} is not paused")
    if not attempt_store.set_paused(conn, tasks.AttemptRef.of(at.task), paused):
        raise NotPausable(f"task {task.id} is no longer run by this supervisor: it cannot be {verb} here")

    def command() -> None:
        if paused:
            if not at.pausable or at.phase is not Phase.RUNNING:
                # Said it is not pausable, was stopped or ended in the tick of the request:
                # the pause is not taken, and the row's is_paused is written back from memory.
                at.mirror_dirty = True
                return
            at.process.pause(at.token)
            at.note_paused(now, "user")
            at.log.info("task_paused", by="user")
        else:
            at.process.resume(at.token)
            at.note_resumed(now)
            at.log.info("task_resumed", by="user")

    return tasks.get(conn, task.id), command


def log_level(name: Any) -> int:
    """The logging level an executor's forwarded log line names (INFO if it names none)."""
    level = logging.getLevelName(str(name).upper()) if name is not None else logging.INFO
    return level if isinstance(level, int) else logging.INFO
