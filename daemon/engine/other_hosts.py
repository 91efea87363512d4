"""The supervisor's part in a queue shared with other supervisors (SPEC §16): what they did to the
tasks it runs, and what its users ask of the tasks they run.

A cancel given on another host is the task's own transition, written there; this supervisor
finds the row of its attempt moved on and stops the attempt, whose late writes the fence refuses.
A pause or resume cannot be written there (only the owner holds the process to steer), so it is
asked: the requesting supervisor checks it against the row (`is_pausable`, `is_paused`, mirrors
the owner keeps) and writes the wish in `pause_wanted`; the owner acts on it as on its own user's
request, and clears it. Both reach the owner at the other host's commit through its NOTIFY, and
within `LOOK_INTERVAL` without one (`notify = false`, or a listener being reconnected).

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import structlog

from daemon import messages
from daemon.engine.attempt import Attempt
from daemon.errors import NotPausable
from daemon.models import Task, TaskStatus
from daemon.store import tasks
from daemon.store import attempts as attempt_store

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.supervisor")

# How often the rows of our attempts are read when no wake-up came: SPEC §16's "within a second"
# for a cancel, pause or resume given on another host, however the wake-ups fare. One SELECT by
# primary key of the tasks in flight here, only while there are some.
LOOK_INTERVAL = 0.9


class FollowsOtherHosts:
    """Cancels, pauses and resumes across the supervisors of one queue (see the module docstring)."""

    def _init_other_hosts(self) -> None:
        self._look_for_replaced = False  # woken by another host: what did it do to our attempts?
        self._next_look = 0.0

    def owner_elsewhere(self: Supervisor, task: Task) -> str | None:
        """The other supervisor of a shared queue that runs `task`, if one does."""
        if self.lease is None or task.status is not TaskStatus.RUNNING or task.id in self.running:
            return None
        owner = task.supervisor
        return owner if owner is not None and owner != self.settings.name else None

    def _follow_other_hosts(self: Supervisor, now: float, *, heartbeat_missed: bool) -> None:
        """Read the rows of our attempts when another host may have changed them: when woken by
        one, when a heartbeat found a row no longer ours, and every LOOK_INTERVAL on a shared
        queue."""
        due = self.lease is not None and now >= self._next_look
        if (self._look_for_replaced or heartbeat_missed or due) and (self.running or self.ahead):
            refs = [tasks.AttemptRef.of(rt.task) for rt in self._attempts()]
            self._act_on_rows(attempt_store.look_at_attempts(self.conn, refs), now)
            self._next_look = now + LOOK_INTERVAL
        self._look_for_replaced = False

    def _act_on_rows(self: Supervisor, rows: attempt_store.AttemptRows, now: float) -> None:
        for task_id in rows.replaced:
            rt, ahead = self.running.get(task_id), self.ahead.get(task_id)
            if (ahead.revoke_reason == "cancelled" if ahead is not None
                    else rt is not None and (rt.stopping or rt.finishing)):
                continue  # told at an earlier look: not told (nor logged) again at each look while it stops
            # Rescued while this supervisor was taken for dead, or cancelled from another host:
            # their writes are refused, and they are told to stop rather than work on for nothing.
            # One sent ahead is taken back with nothing more to write: its row is written already.
            log.warning("attempt_no_longer_current", task_id=task_id, action="stopping it; its writes are ignored")
            self._request_stop(task_id, "cancel" if task_id in self.running else "cancelled", now)
        for task_id, paused in rows.pause_wanted.items():
            rt = self.running.get(task_id)
            if rt is None:  # a row running at an attempt of ours sent ahead: its start is on the way
                continue
            try:
                _, command = messages.pause_by_user(self.conn, tasks.get(self.conn, task_id), rt, paused, now)
            except NotPausable as exc:  # it changed since the other host looked: said, and dropped
                rt.log.info("pause_not_taken", asked="pause" if paused else "resume", by="another supervisor",
                            reason=exc.message)
            else:
                self._steer_once_committed(rt, command)
            attempt_store.answer_pause(self.conn, tasks.AttemptRef.of(rt.task))

    def _steer_once_committed(self: Supervisor, rt: Attempt, command: Callable[[], None]) -> None:
        """Send a pause or resume to `rt`'s process after the tick's commit, if it still runs."""
        self._outbox.append(lambda: command() if self.running.get(rt.task.id) is rt else None)

    def _ask_owner(self: Supervisor, task: Task, owner: str, paused: bool) -> Task:
        """Ask `owner`, the supervisor that runs `task`, to pause or resume it (a user's request
        here). Refused with NotPausable, changing nothing, by what its row says."""
        verb = "paused" if paused else "resumed"
        if paused and not task.is_pausable:
            raise NotPausable(f"task {task.id} ({task.type}) cannot be paused")
        if paused and task.is_paused:
            raise NotPausable(f"task {task.id} is already paused")
        if not paused and not task.is_paused:
            raise NotPausable(f"task {task.id} is not paused")
        if not attempt_store.ask_pause(self.conn, tasks.AttemptRef.of(task), paused):
            raise NotPausable(f"task {task.id} has just ended its attempt under supervisor {owner}: it cannot be {verb}")
        self._outbox.append(lambda: log.info("pause_asked", task_id=task.id, of=owner,
                                             asked="pause" if paused else "resume"))
        return tasks.get(self.conn, task.id)

