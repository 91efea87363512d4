"""The errors fredica-worker reports: one base class, one subclass per kind of refusal.

Each subclass's docstring is its default message, so `raise UnknownTask()` still says something
useful; callers usually pass a precise message instead.
"""

from __future__ import annotations


class FredicaError(Exception):
    """fredica-worker refused the request."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__class__.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class SubmissionRefused(FredicaError):
    """The submission is invalid; nothing of it was stored."""


class UnknownTask(FredicaError):
    """No task has that id."""


class UnknownRun(FredicaError):
    """No workflow run has that id."""


class InvalidTransition(FredicaError):
    """The task is not in a state that allows this change; nothing was changed."""

    def __init__(self, task_id: str, current: str, target: str, message: str | None = None) -> None:
        self.task_id = task_id
        self.current = current
        self.target = target
        super().__init__(message or f"task {task_id} is {current}: it cannot become {target}")


class NotPausable(FredicaError):
    """The task cannot be paused or resumed now."""


class MigrationError(FredicaError):
    """The database schema cannot be brought to this version."""
