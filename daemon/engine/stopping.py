"""How the supervisor stops an attempt: a user's cancel, a timeout, a shutdown (SPEC §7). Its
process is asked to stop, then made to (`Attempt.escalate`, after cancel_grace).

Apart from the loop because every path that ends an attempt early comes here (requests, deadlines,
shutdown, another host's cancel): a user's request takes effect only once its tick is committed.

A mixin of `daemon.supervisor.Supervisor`, whose loop calls these on its own thread.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from daemon.engine.attempt import Attempt, Phase

if TYPE_CHECKING:
    from daemon.supervisor import Supervisor


class StopsAttempts:
    """Cancels, timeouts and shutdowns of attempts (see the module docstring)."""

    # --- stopping an attempt --------------------------------------------------------------------

    def _request_stop(self: Supervisor, task_id: str, reason: str, now: float, *, requested: bool = False) -> bool:
        """Ask a running task's executor to stop; False if no executor of ours runs it.

        `requested`: for a user's request, whose effects wait for its tick's commit (rolled back,
        it must have done nothing); a timeout or a shutdown acts at once.
        """
        rt = self.running.get(task_id)
        if rt is None:
            ahead = self.ahead.get(task_id) if self.ahead else None
            if ahead is not None and reason != "timeout":
                self._revoke(ahead, reason, now, requested=requested)
                return True
            return False
        before = (rt.phase, rt.stop_reason)
        if not rt.request_stop(reason, now):
            # Stopping already, or over: an attempt that has reported its result (or whose
            # process has exited) ended as it said, whatever comes now.
            return True
        if requested:
            # Decided now, so that an attempt ending in this same tick is recorded as stopped;
            # undone if the tick is rolled back, and the process told only once it is committed.
            self._stops.append((rt, *before))
        if requested:
            self._outbox.append(functools.partial(self._tell_to_stop, rt, reason, now))
        else:
            self._tell_to_stop(rt, reason, now)
        return True

    def _tell_to_stop(self: Supervisor, rt: Attempt, reason: str, now: float) -> None:
        if self.running.get(rt.task.id) is not rt:
            return  # ended meanwhile, in the tick of the request: nothing left to stop
        # Sets the resume Event too, so a paused executor wakes up to see the cancel.
        rt.process.request_cancel(reason, rt.token)
        rt.note_resumed(now)
        rt.log.info("task_stop_requested", reason=reason)

    def _enforce_deadlines(self: Supervisor, rt: Attempt, now: float) -> None:
        if rt.phase is Phase.RUNNING:
            if rt.task.timeout is not None and rt.active_seconds(now) >= rt.task.timeout:
                self._request_stop(rt.task.id, "timeout", now)
            return
        rt.escalate(now, self.settings.cancel_grace)

    # --- shutdown -------------------------------------------------------------------------------

    def _interrupt_all(self: Supervisor, now: float) -> None:
        for task_id in list(self.running):
            self._request_stop(task_id, "shutdown", now)
