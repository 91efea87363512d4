"""An event-loop executor process: many attempts of `async def` executors at once (SPEC §15).

The process (executors/event_loop.py) runs each attempt it is sent as an asyncio task at once;
every status message names its attempt (`"attempt": token`), and `{"type": "alive"}` comes from
its loop every `heartbeat_interval` seconds. So, unlike the other kinds, one process here holds
several attempts: `route` says which a message is for, and the process's exit ends them all.

Stopping an attempt is the process's own business (it cancels the coroutine after the
assignment's `cancel_grace`, and reports it CANCELLED within twice that): its tree is shared, so
no signal ends one attempt. What the loop ends is the process, when its loop has not beaten for
longer than `loop_block_limit` (an attempt blocks it); every attempt in it is then recorded
CRASHED, and retried as SPEC §6 says.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import psutil
import structlog

from daemon import processes
from daemon.engine.executor_processes.base import ExecutorProcess

if TYPE_CHECKING:
    from daemon.engine.attempt import Attempt

log = structlog.get_logger("fredica.supervisor")
HEARTBEAT_INTERVAL = 0.5  # how often its loop says it is alive: a fraction of any sane loop_block_limit


@dataclasses.dataclass(eq=False)
class EventLoopProcess(ExecutorProcess):
    """Holds many attempts at once on one asyncio loop (see the module docstring)."""

    kind: ClassVar[str] = "event_loop"
    holds_many: ClassVar[bool] = True

    queue: str = "default"  # whose workers its attempts are
    block_limit: float = 10.0  # seconds without a heartbeat after which its loop counts as blocked
    alive_at: float | None = None  # the loop's `now` when its last heartbeat was read
    holding: int = 0  # attempts taken for it and not yet released (daemon.engine.event_loops)
    blocked: bool = False  # found blocked: being ended, takes nothing more

    def _send(self, data: bytes) -> None:
        # Never waited for, as the other kinds' are: the process writes status while it reads
        # them, and the loop reads that status only between ticks: a hand-over that waited for a
        # busy process (thousands of attempts at once) would wait on itself.
        self._queue(data)

    def next_attempt_process(self) -> tuple[int, float | None]:
        return self.pid, self.create_time

    def takes_another(self, attempt: Attempt) -> bool:
        return not self.blocked and not self.status.closed and self.is_alive()

    def _root(self) -> psutil.Process | None:
        if self.create_time is not None:
            return processes.find_leftover(self.pid, self.create_time)
        return None

    def token_of(self, task_id: str | None, number: int) -> str:
        # Unique in the process for its whole life, as the other kinds' are for theirs.
        return f"{task_id}#{self.pid}.{number}"

    def route(self, message: dict[str, Any], attempts: Mapping[str, Attempt], now: float) -> Attempt | None:
        """The attempt `message` is for (None: the process's own, or one no longer held)."""
        if message.get("type") == "alive":
            self.alive_at = now
            return None
        token = message.pop("attempt", None)
        return attempts.get(token) if isinstance(token, str) else None

    def watch(self, now: float) -> float | None:
        """End the process if its loop has not beaten for `block_limit`; when to look next."""
        if self.blocked or not self.is_alive():
            return None
        since = self.alive_at if self.alive_at is not None else now
        if self.alive_at is None:
            self.alive_at = now  # started now, as far as the loop can tell
        if now - since <= self.block_limit:
            return since + self.block_limit
        log.error("event_loop_blocked", pid=self.pid, seconds=round(now - since, 3), limit=self.block_limit,
                  attempts=self.holding)
        self.blocked = True
        self.kill()
        return None

    # No signal can end one attempt of a process that holds several: the process cancels it.
    def terminate_attempt(self) -> None:
        pass

    def kill_attempt(self) -> None:
        pass

    def kill(self) -> None:
        """SIGKILL the process and whatever it started: every attempt it holds ends."""
        root = self._root()
        if root is not None:
            processes.send(signal.SIGKILL, processes.descendants(root))
        self.process.kill()
