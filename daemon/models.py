"""Domain types: task and run statuses, the allowed transitions, and frozen row snapshots."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Callable, Mapping


class TaskStatus(enum.StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class DisplayStatus(enum.StrEnum):
    """The words people see for a task besides its stored status (SPEC §3); never stored."""

    WAITING = "waiting"  # pending or claimed: not started yet
    PAUSED = "paused"  # running, and paused
    HELD = "held"  # pending, and held: never claimed until released (SPEC §14)


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({TaskStatus.PENDING, TaskStatus.CLAIMED, TaskStatus.RUNNING})
IN_FLIGHT_STATUSES = (TaskStatus.CLAIMED, TaskStatus.RUNNING)  # held by a supervisor: what its death leaves
WAITING_STATUSES = frozenset({TaskStatus.PENDING, TaskStatus.CLAIMED})
# The words a task filter (`ls --status`) takes: the stored statuses and those people see
# (SPEC §14).
TASK_FILTER_WORDS = (*(status.value for status in TaskStatus), *(word.value for word in DisplayStatus))
# The orders `ls --sort` takes (`daemon.store.listing.SORTS` spells each in SQL).
TASK_SORTS = ("submitted", "priority", "status", "type", "duration")


def in_order(statuses: frozenset[TaskStatus]) -> list[str]:
    """The values of `statuses` in the enum's order, as the wire and the CLI list them."""
    return [status.value for status in TaskStatus if status in statuses]


def display_status(status: str, is_paused: bool, is_held: bool = False) -> str:
    """A task's status as people see it (SPEC §3, §14): a held pending task is held, pending and
    claimed are waiting, a paused running task is paused; any other is its stored status
    (`status` as stored or sent)."""
    if status == TaskStatus.PENDING and is_held:
        return DisplayStatus.HELD.value
    if status in WAITING_STATUSES:
        return DisplayStatus.WAITING.value
    if status == TaskStatus.RUNNING and is_paused:
        return DisplayStatus.PAUSED.value
    return str(status)

# SPEC §3, as data: the only status changes the store will make. The terminal states have no entry,
# so nothing ever leaves them.
ALLOWED_TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.PENDING: frozenset({TaskStatus.CLAIMED, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    TaskStatus.CLAIMED: frozenset(
        {
            TaskStatus.RUNNING,
            TaskStatus.COMPLETED,
            TaskStatus.PENDING,
            TaskStatus.CANCELLED,
            TaskStatus.FAILED,
        }
    ),
    TaskStatus.RUNNING: frozenset(
        {TaskStatus.COMPLETED, TaskStatus.PENDING, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
}


_SOURCES = {
    target: frozenset(src for src, targets in ALLOWED_TRANSITIONS.items() if target in targets)
    for target in TaskStatus
}


def sources_of(target: TaskStatus) -> frozenset[TaskStatus]:
    """The statuses from which a task may move to `target` (read once: every transition asks)."""
    return _SOURCES[target]


# Error types with a fixed meaning (SPEC §6). Any other error type is retryable.
CANCELLED = "CANCELLED"
AWAITING_CREDENTIAL = "AWAITING_CREDENTIAL"
PAYLOAD_ERROR = "PAYLOAD_ERROR"
NO_EXECUTOR = "NO_EXECUTOR"
EXCEPTION = "EXCEPTION"
CRASHED = "CRASHED"
TIMEOUT = "TIMEOUT"
INTERRUPTED = "INTERRUPTED"
ORPHANED = "ORPHANED"
DEPENDENCY_FAILED = "DEPENDENCY_FAILED"
# A result that is not a JSON object or JSON text, or is larger than max_result_bytes (SPEC §13):
# the same code would return the same result again.
BAD_RESULT = "BAD_RESULT"
NEVER_RETRIED = frozenset({CANCELLED, AWAITING_CREDENTIAL, PAYLOAD_ERROR, NO_EXECUTOR, BAD_RESULT})


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """A snapshot of one `task` row; `payload` and `result` are parsed JSON."""

    seq: int
    id: str
    type: str
    workflow_run_id: str
    material_id: str | None
    status: TaskStatus
    priority: int
    depends_on: tuple[str, ...]
    payload: dict[str, Any]
    result: Any
    error: str | None
    error_type: str | None
    idempotency_key: str | None
    retry_count: int
    max_retries: int
    progress: int
    status_text: str | None
    is_paused: bool
    is_pausable: bool
    timeout: float | None
    not_before: float
    executor_pid: int | None
    executor_started_at: float | None
    created_at: float
    claimed_at: float | None
    started_at: float | None
    completed_at: float | None
    heartbeat_at: float | None
    payload_refs: bool = False  # the payload names dependencies' results, filled in at dispatch
    queue: str = "default"  # the queue that claims it (SPEC §15)
    queue_explicit: bool = False  # named by the submitter, not routed by type
    is_held: bool = False  # a pending task a user holds: never claimed until released (SPEC §14)
    supervisor: str | None = None  # the supervisor that claimed it last, kept after it ends (SPEC §16)
    attempt: int = 0  # how many times it was claimed: with `supervisor`, what fences an attempt's writes

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Task":
        # Made at every transition that returns its rows (claims, starts, endings: three a task),
        # so it is made the fast way: the row read once into a dict (a `sqlite3.Row` looks a
        # name up by a case-insensitive scan of its columns: 14 us for these 33), the empty
        # JSON of most rows not parsed, and the fields set through their slots' own setters
        # (a frozen dataclass's __init__ goes through object.__setattr__ for each): 25 us -> 11 us.
        values = row if isinstance(row, dict) else dict(zip(row.keys(), row))
        task = _new_task(cls)
        for name, convert, setter in _FROM_ROW:
            value = values[name]
            setter(task, value if convert is None else convert(value))
        return task

    def but(self, **changes: Any) -> "Task":
        """This snapshot with `changes`: `dataclasses.replace`, for the loop's hot path (made at
        every start; replace's generic way took 20 us, this 4)."""
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Task has no field {sorted(unknown)[0]!r}")
        task = _new_task(Task)
        for name, _, setter in _FROM_ROW:
            setter(task, changes[name] if name in changes else getattr(self, name))
        return task

    @property
    def display_status(self) -> str:
        """The status as people see it (SPEC §3): waiting, paused, or the stored status."""
        return display_status(self.status, self.is_paused, self.is_held)

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready values, keyed by column name. The payload and result are
        this snapshot's own (parsed for it alone), not copies: `dataclasses.asdict`'s deep copy
        was 18 times slower, most of a 50,000-task `ls --json`'s time in the daemon."""
        data = {name: getattr(self, name) for name in _TASK_FIELDS}
        data["status"] = self.status.value
        data["depends_on"] = list(self.depends_on)
        return data


_TASK_FIELDS = tuple(field.name for field in dataclasses.fields(Task))
_FIELD_NAMES = frozenset(_TASK_FIELDS)
_STATUSES = {status.value: status for status in TaskStatus}


def _status(value: str) -> TaskStatus:
    return _STATUSES.get(value) or TaskStatus(value)  # an unknown one: TaskStatus's own error


def _depends_on(text: str | None) -> tuple[str, ...]:
    return () if not text or text == "[]" else tuple(json.loads(text))


def _payload(text: str | None) -> dict[str, Any]:
    return {} if not text or text == "{}" else json.loads(text)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "status": _status, "depends_on": _depends_on, "payload": _payload, "result": _loads,
    **{name: bool for name in ("is_paused", "is_pausable", "payload_refs", "queue_explicit", "is_held")},
}
# (column, how its value becomes the field's, the field's slot setter), for `Task.from_row`.
_FROM_ROW = tuple((name, _CONVERTERS.get(name), Task.__dict__[name].__set__) for name in _TASK_FIELDS)
_new_task = object.__new__


@dataclasses.dataclass(frozen=True, slots=True)
class RunCounts:
    """How many of a run's tasks are in each status."""

    pending: int = 0
    claimed: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return (
            self.pending + self.claimed + self.running + self.completed + self.failed + self.cancelled
        )

    @property
    def active(self) -> int:
        return self.pending + self.claimed + self.running


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRun:
    """A snapshot of one `workflow_run` row."""

    id: str
    material_id: str | None
    template: str
    status: RunStatus
    total_tasks: int
    done_tasks: int
    counts: RunCounts
    created_at: float
    completed_at: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "WorkflowRun":
        return cls(
            id=row["id"],
            material_id=row["material_id"],
            template=row["template"],
            status=RunStatus(row["status"]),
            total_tasks=row["total_tasks"],
            done_tasks=row["done_tasks"],
            counts=RunCounts(
                pending=row["pending_tasks"],
                claimed=row["claimed_tasks"],
                running=row["running_tasks"],
                completed=row["done_tasks"],
                failed=row["failed_tasks"],
                cancelled=row["cancelled_tasks"],
            ),
            created_at=row["created_at"],
            completed_at=row["completed_at"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "material_id": self.material_id,
            "template": self.template,
            "status": self.status.value,
            "total_tasks": self.total_tasks,
            "done_tasks": self.done_tasks,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RestartEntry:
    """A row of `restart_task_log`: a task that a restart interrupted, and what became of it."""

    id: int
    session_id: str
    task_id: str
    task_type: str
    workflow_run_id: str | None
    material_id: str | None
    status_at_restart: str
    payload: dict[str, Any]
    progress: int
    disposition: str
    new_workflow_run_id: str | None
    created_at: float
    resolved_at: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "RestartEntry":
        values = {field.name: row[field.name] for field in dataclasses.fields(cls)}
        values["payload"] = json.loads(row["payload"] or "{}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
