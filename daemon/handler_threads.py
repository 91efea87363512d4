"""The threads that run the control socket's handlers: started as requests need them, then kept.

Apart from `daemon.control` because it knows nothing of sockets: it runs jobs, at most `size` at
once, and the rest wait in order.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

import structlog

log = structlog.get_logger("fredica.control")


class HandlerThreads:
    """Up to `size` threads that run the handlers, started as requests need them, then kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.started = 0
        self._idle = 0
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._changed = threading.Condition()
        self._stopping = False

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue `job`; False if no thread will ever run it (not one could be started)."""
        with self._changed:
            if self._idle <= len(self._jobs) and self.started < self.size:  # no idle thread is left for it
                try:
                    threading.Thread(target=self._work, name="fredica-request", daemon=True).start()
                    self.started += 1
                except RuntimeError:  # no thread to be had now; the ones there are will do
                    if self.started == 0:
                        return False
            self._jobs.append(job)
            self._changed.notify()
        return True

    def stop(self) -> None:
        """Let the threads end once the queued jobs are done."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._idle += 1
                while not self._jobs and not self._stopping:
                    self._changed.wait()
                self._idle -= 1
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # jobs report their own failures; this keeps the thread alive
                log.exception("request_thread_failed")
