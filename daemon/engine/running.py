"""The attempts a supervisor runs, by task id, and how many each queue runs.

The loop asks "how many does each queue run?" at every claim pass and every sleep; counted over
10,000 attempts at once (an event-loop queue's burst) that was one pass over all of them per
question. Kept as attempts come and go instead, so the answer costs the number of queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daemon.engine.attempt import Attempt


class RunningAttempts(dict[str, "Attempt"]):
    """A dict of the running attempts by task id whose `by_queue` counts them per queue (the
    queue each had when it came in: an attempt's queue does not change). Only `[]=`, `pop`, `del`
    and `clear` change it: the other ways a dict can change are refused, so that the counts can
    never drift from the attempts."""

    def __init__(self) -> None:
        super().__init__()
        self.by_queue: dict[str, int] = {}
        self._queue_of: dict[str, str] = {}

    def __setitem__(self, task_id: str, rt: Attempt) -> None:
        if task_id in self:
            self._forget(task_id)
        super().__setitem__(task_id, rt)
        queue = rt.task.queue
        self._queue_of[task_id] = queue
        self.by_queue[queue] = self.by_queue.get(queue, 0) + 1

    def __delitem__(self, task_id: str) -> None:
        super().__delitem__(task_id)
        self._forget(task_id)

    def pop(self, task_id: str, *default: Any) -> Any:  # type: ignore[override]
        if task_id not in self:
            return super().pop(task_id, *default)  # KeyError, or the default
        self._forget(task_id)
        return super().pop(task_id)

    def clear(self) -> None:
        super().clear()
        self.by_queue, self._queue_of = {}, {}

    def _forget(self, task_id: str) -> None:
        queue = self._queue_of.pop(task_id)
        left = self.by_queue[queue] - 1
        if left:
            self.by_queue[queue] = left
        else:
            del self.by_queue[queue]

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("RunningAttempts changes only by [], pop, del and clear (its counts follow them)")

    update = setdefault = popitem = __ior__ = _refused  # type: ignore[assignment]
