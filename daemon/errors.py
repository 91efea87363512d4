"""Every error fredica-worker reports: one base class, one subclass per kind of refusal.

This is the one catalogue. Each class's `kind` (its name) is what a refusal says on the control
socket, and `by_kind` turns that word back into the class, so that a client raises what the
daemon raised (`UnknownTask`, `InvalidTransition`, ...) with the daemon's message. The modules
that raise these errors import them from here (and some re-export them under their old names).

Each subclass's docstring is its default message, so `raise UnknownTask()` still says something
useful; callers usually pass a precise message instead.
"""

from __future__ import annotations

from typing import ClassVar

_CATALOGUE: dict[str, type[FredicaError]] = {}


class FredicaError(Exception):
    """fredica-worker refused the request."""

    kind: ClassVar[str] = "FredicaError"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__
        _CATALOGUE[cls.kind] = cls

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__class__.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])

    @classmethod
    def from_wire(cls, message: str) -> FredicaError:
        """The error as a client raises it again from a refusal's message."""
        return cls(message)


_CATALOGUE[FredicaError.kind] = FredicaError


def by_kind(kind: str) -> type[FredicaError] | None:
    """The class whose refusals carry `kind` on the wire; None for a kind this catalogue lacks."""
    return _CATALOGUE.get(kind)


# --- requests refused ---------------------------------------------------------------------------


class SubmissionRefused(FredicaError):
    """The submission is invalid; nothing of it was stored."""


class PayloadRefused(SubmissionRefused):
    """An executor's `validate` refused a task's payload (SPEC §14); nothing was stored."""


class UnknownTask(FredicaError):
    """No task has that id."""


class UnknownRun(FredicaError):
    """No workflow run has that id."""


class IdTooShort(FredicaError):
    """An id prefix must have at least 4 characters."""


class AmbiguousId(FredicaError):
    """The id prefix matches more than one task or workflow run: give more of it."""


class UnknownRestartEntry(FredicaError):
    """No restart-log entry has that id."""


class NothingSelected(FredicaError):
    """The selectors of a bulk request match nothing; nothing was done."""


class InvalidTransition(FredicaError):
    """The task is not in a state that allows this change; nothing was changed."""

    def __init__(self, task_id: str | None, current: str | None, target: str | None,
                 message: str | None = None) -> None:
        self.task_id = task_id
        self.current = current
        self.target = target
        super().__init__(message or f"task {task_id} is {current}: it cannot become {target}")

    @classmethod
    def from_wire(cls, message: str) -> FredicaError:
        # The wire carries the sentence, not its parts.
        return cls(None, None, None, message)


class StaleAttempt(InvalidTransition):
    """A write about an attempt that is no longer its task's current one (a supervisor presumed
    dead, whose task was rescued and may run elsewhere now, SPEC §16); nothing was changed."""


class NotPausable(FredicaError):
    """The task cannot be paused or resumed now."""


class BadDuration(FredicaError):
    """A length of time is not written as a number and a unit (90s, 30m, 12h, 7d, 2w)."""


class QueueError(FredicaError):
    """The queue configuration is invalid, or a request names no configured queue."""


class TemplateError(FredicaError):
    """The template is invalid or cannot be started with these parameters."""


class LogElsewhere(FredicaError):
    """The task ran under another supervisor of the queue: its log is on that supervisor's host."""


class PermissionDenied(FredicaError):
    """This user may not control the daemon."""


# --- the daemon cannot take the request now -----------------------------------------------------


class ShuttingDown(FredicaError):
    """The daemon is shutting down and takes no more requests."""


class LoopBusy(FredicaError):
    """The loop did not take a request in time; the request was withdrawn, nothing was done."""


class RequesterGone(FredicaError):
    """Whoever made the request stopped waiting for it before the loop took it: not done."""


class Busy(FredicaError):
    """The daemon cannot answer now: try again."""


class DatabaseFault(FredicaError):
    """The database cannot be written now; nothing was changed."""


class InternalError(FredicaError):
    """The daemon failed on the request (a bug: its log says more)."""


# --- the control protocol -----------------------------------------------------------------------


class ProtocolError(FredicaError):
    """The message does not follow the control protocol."""


class FrameTooLarge(ProtocolError):
    """The message is larger than the protocol allows."""


class ConnectionClosed(ProtocolError):
    """The other side closed the connection before a whole message arrived."""


class NotText(ProtocolError):
    """A string of the message is not text: undecodable bytes (as Python keeps them from a command
    line) or a lone surrogate, neither of which UTF-8 can carry."""


# --- the client's side --------------------------------------------------------------------------


class DaemonUnreachable(FredicaError):
    """The daemon is not running or does not answer."""


class DaemonNotRunning(DaemonUnreachable):
    """No daemon is running: no socket file, or nothing listening on it (not one that is slow,
    or another user's). Read commands then answer from the database (`daemon.offline`)."""


class WaitTimedOut(FredicaError, TimeoutError):
    """The tasks waited for had not all ended when the wait's timeout came."""

    def __init__(self, message: str | None = None, tasks: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.tasks = tasks or []  # as they were then


class RemoteError(FredicaError):
    """The daemon refused the request with a kind of error this client does not know."""

    def __init__(self, kind: str, message: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # the wire's word, which names no class here


# --- starting the daemon ------------------------------------------------------------------------


class ConfigError(FredicaError):
    """The configuration is invalid."""


class ExecutorConfigError(FredicaError):
    """An executor reference is invalid."""


class AlreadyRunning(FredicaError):
    """Another daemon owns this database."""


class CannotStart(FredicaError):
    """A path the daemon cannot use or a database it cannot open: one line, not a traceback."""


class DatabaseUnusable(FredicaError):
    """The database cannot be used as it is; nothing was changed."""


class ExportFailed(FredicaError):
    """The tasks could not be exported (`fredica export`)."""


class MigrationError(FredicaError):
    """The database schema cannot be brought to this version."""


class CopyRefused(FredicaError):
    """The queue cannot be copied to PostgreSQL (`fredica db copy`); nothing was written."""
