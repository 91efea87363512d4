"""A queue's prefetch (SPEC §15): the workers that hold tasks sent ahead, and what a queue may
claim and must take back.

A worker of a queue with `prefetch = N` is a `Lane`: the attempt it runs (its head), in a process
that runs attempts one at a time (a reused process, `tasks_per_process` > 1) or in an event-loop
process (one lane per attempt it runs), and up to N attempts sent ahead behind it, oldest first,
each still `claimed`. The process starts the next on its own once the one before it is over, and
says "started"; the lane then has that one as its head. Between the two (the head over, "started"
not read yet) the lane has no head, and its worker is still taken: the next is its own to start.

A fresh process per attempt takes nothing ahead (its next fork does not exist yet, and the forks
share one control pipe the launcher drains between attempts): a queue's prefetch does nothing for
it. Nothing here reads the database or the clock.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable

from daemon.engine.attempt import Attempt, Phase
from executors.base import TaskExecutor

if TYPE_CHECKING:
    from daemon.engine.executor_processes.base import ExecutorProcess

GOING = (Phase.ASSIGNED, Phase.RUNNING)  # a head behind which tasks may wait
KINDS = ("reused", "event_loop")  # the processes that take tasks ahead


@dataclasses.dataclass(eq=False)
class Lane:
    """One worker of a queue that sends tasks ahead (see the module docstring)."""

    queue: str
    process: ExecutorProcess
    head: Attempt | None
    ahead: list[Attempt] = dataclasses.field(default_factory=list)
    # Whether the process may take another attempt once all of the lane's are over: as its last
    # attempt that ran left it (`takes_another`).
    reusable: bool = True

    def takes_ahead(self, prefetch: int, tasks_per_process: int) -> bool:
        """Whether one more attempt may be sent ahead here: room in the lane, a head that is
        not stopping, and a process that will run it (never its last: that one is sent when the
        process is idle, as any other)."""
        process = self.process
        if len(self.ahead) >= prefetch or process.assignments is None or process.status.closed:
            return False
        if process.holds_many:
            blocked = getattr(process, "blocked", False)
            return not blocked and (self.head is None or self.head.phase in GOING) and process.is_alive()
        if self.head is not None and (self.head.phase not in GOING or process.last):
            return False
        # Those of this tick are handed over after its commit: counted here already.
        unsent = sum(1 for rt in [self.head, *self.ahead] if rt is not None and not rt.token)
        return process.attempts + unsent + 1 < tasks_per_process and process.is_alive()

    def fits(self, executor: TaskExecutor) -> bool:
        """Whether `executor`'s attempt may wait here: in a process of the kind it runs in."""
        if self.process.holds_many:
            return executor.runs_in_event_loop()
        return not executor.runs_in_event_loop() and not executor.needs_fresh_process

    def tail(self) -> Attempt | None:
        """The attempt one sent ahead now follows (the last of the lane)."""
        return self.ahead[-1] if self.ahead else self.head

    def started(self, rt: Attempt) -> None:
        """`rt`, sent ahead, has started: it is the head now."""
        if rt in self.ahead:
            self.ahead.remove(rt)
        self.head = rt

    def over(self, rt: Attempt, takes_another: bool) -> bool:
        """`rt`, one of the lane's, is over; True once the lane holds none of ours (its process
        is then released, as `reusable` says)."""
        if rt is self.head:
            self.head = None
            self.reusable = takes_another
        elif rt in self.ahead:
            self.ahead.remove(rt)
        return self.head is None and not self.ahead

    def withdraw(self, rt: Attempt) -> None:
        """`rt`'s dispatch was rolled back: it was never sent."""
        if rt in self.ahead:
            self.ahead.remove(rt)


def waiting_behind(lanes: Iterable[Lane]) -> list[Attempt]:
    """The attempts sent ahead that wait behind a running head, not asked back: those a worker
    of the queue that frees takes over. Oldest first."""
    found = [rt for lane in lanes if lane.head is not None for rt in lane.ahead if rt.phase is Phase.PREFETCHED]
    return sorted(found, key=lambda rt: (rt.started_at, rt.task.seq))


def occupied(lanes: Iterable[Lane]) -> int:
    """Workers taken beside the running attempts: lanes whose next is starting, and the workers
    kept for attempts asked back to be handed over."""
    taken = 0
    for lane in lanes:
        if lane.head is None:
            taken += 1
        taken += sum(1 for rt in lane.ahead if rt.phase is Phase.REVOKING and rt.revoke_reason == "handoff")
    return taken
