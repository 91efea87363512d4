"""What a submission may contain: parsing and validating task specs before anything is stored.

Structural checks live here (pure, no database); checks against stored tasks (unknown or finished
dependencies) happen in the store, inside the submitting transaction.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from daemon import queues
from daemon.errors import PayloadRefused, SubmissionRefused

if TYPE_CHECKING:
    from executors.registry import Registry

MAX_PRIORITY = 1_000_000
MAX_RETRIES = 1_000
SPEC_FIELDS = frozenset(
    {
        "id",
        "key",
        "type",
        "payload",
        "priority",
        "depends_on",
        "max_retries",
        "idempotency_key",
        "material_id",
        "timeout",
        "queue",
        "hold",
    }
)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task to submit. `depends_on` names task ids, or the `key` or `id` of an earlier spec."""

    type: str
    payload: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    priority: int = 0
    depends_on: tuple[str, ...] = ()
    max_retries: int = 0
    idempotency_key: str | None = None
    material_id: str | None = None
    timeout: float | None = None
    queue: str | None = None  # named by the submitter; None: routed by type (daemon/queues.py)
    key: str | None = None
    id: str | None = None
    hold: bool = False  # stored held: never claimed until a user releases it (SPEC §14)
    # Set by templates only, never from a request: the payload names dependencies' results by
    # position ("{@0-download.output}", braces of its own doubled), to fill in at dispatch.
    payload_refs: bool = False


def _int(value: Any, name: str, low: int, high: int) -> int:
    # bool is an int in Python; `"priority": true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SubmissionRefused(f"{name} must be an integer, not {json.dumps(value)}")
    if not low <= value <= high:
        raise SubmissionRefused(f"{name} must be between {low} and {high}, not {value}")
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SubmissionRefused(f"{name} must be true or false, not {json.dumps(value)}")
    return value


def _optional_text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SubmissionRefused(f"{name} must be a non-empty string")
    return value


def parse_payload(value: Any) -> dict[str, Any]:
    """A payload given as a dict or as JSON text; it must be a JSON object."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise SubmissionRefused(f"payload is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise SubmissionRefused(f"payload must be a JSON object, not {type(value).__name__}")
    try:
        # Round-trip now so that a payload that cannot be stored is refused before anything is.
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SubmissionRefused(f"payload cannot be stored as JSON: {exc}") from None


def parse_spec(data: Mapping[str, Any]) -> TaskSpec:
    """A TaskSpec from a mapping (a batch line, a socket request); refuses unknown or bad fields."""
    if not isinstance(data, Mapping):
        raise SubmissionRefused(f"a task must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - SPEC_FIELDS)
    if unknown:
        raise SubmissionRefused(f"unknown field(s): {', '.join(unknown)}")
    task_type = data.get("type")
    if not isinstance(task_type, str) or not task_type.strip():
        raise SubmissionRefused("type must be a non-empty string")
    depends_on = data.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) and d for d in depends_on):
        raise SubmissionRefused("depends_on must be a list of task ids or keys")
    timeout = data.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise SubmissionRefused("timeout must be a number of seconds")
        try:
            timeout = float(timeout)  # an integer too large for a float raises here
        except OverflowError:
            raise SubmissionRefused("timeout is too large") from None
        if not (math.isfinite(timeout) and timeout > 0):
            raise SubmissionRefused("timeout must be a positive number of seconds")
    queue = data.get("queue")
    if queue is not None:
        try:
            queues.check_name(queue)
        except queues.QueueError as exc:
            raise SubmissionRefused(exc.message) from None
    task_id = _optional_text(data.get("id"), "id")
    if task_id is not None:
        try:
            task_id = str(uuid.UUID(task_id))
        except ValueError:
            raise SubmissionRefused(f"id must be a UUID, not {task_id!r}") from None
    return TaskSpec(
        type=task_type,
        payload=parse_payload(data.get("payload", {})),
        priority=_int(data.get("priority", 0), "priority", -MAX_PRIORITY, MAX_PRIORITY),
        # Keep the order given, drop repeats: listing a dependency twice means the same thing.
        depends_on=tuple(dict.fromkeys(depends_on)),
        max_retries=_int(data.get("max_retries", 0), "max_retries", 0, MAX_RETRIES),
        idempotency_key=_optional_text(data.get("idempotency_key"), "idempotency_key"),
        material_id=_optional_text(data.get("material_id"), "material_id"),
        timeout=timeout,
        queue=queue,
        key=_optional_text(data.get("key"), "key"),
        id=task_id,
        hold=_flag(data.get("hold", False), "hold"),
    )


def check_executors(specs: Sequence[TaskSpec], registry: Registry) -> None:
    """Refuse a spec whose type has no executor, or whose payload its executor's `validate`
    refuses (SPEC §14), before anything is stored; a batch's error names the task (`task N:`).

    A template's payload that names an upstream result (`payload_refs`) is only known in part
    until dispatch: its keys are checked (against the executor's `payload_keys`), its values by
    the executor at run time.
    """
    # Here, not at the top: the CLI imports this module too, and `fredica status` must start fast.
    from executors.base import check_keys

    for number, spec in enumerate(specs, start=1):
        where = f"task {number}: " if len(specs) > 1 else ""
        if spec.key is not None and len(specs) > 1:
            where = f"task {number} ({spec.key}): "
        executor = registry.get(spec.type)
        if executor is None:
            known = ", ".join(registry) or "none"
            raise SubmissionRefused(f"{where}unknown task type {spec.type!r} (known: {known})")
        try:
            if not spec.payload_refs:
                executor.validate(spec.payload)
            elif executor.payload_keys:
                check_keys(spec.payload, executor.payload_keys)
        except Exception as exc:  # a third-party validate may raise anything: a refusal, not a crash
            detail = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise PayloadRefused(f"{where}PAYLOAD_ERROR: {spec.type} payload: {detail}") from None


def _canonical_id(ref: str) -> str:
    """A task id as stored (a lower-case UUID), if `ref` is one in any spelling; else `ref`."""
    try:
        return str(uuid.UUID(ref))
    except ValueError:
        return ref


@dataclasses.dataclass(frozen=True)
class ResolvedDependency:
    """A dependency of a spec: an earlier spec of the batch (by index) or a stored task (by id)."""

    batch_index: int | None = None
    task_id: str | None = None


def resolve_batch(specs: Sequence[TaskSpec]) -> list[list[ResolvedDependency]]:
    """Resolve each spec's dependencies against earlier specs of the batch; the rest are task ids.

    Refuses self-dependencies, references to a later line, and repeated keys or ids.
    """
    if not specs:
        raise SubmissionRefused("the submission has no tasks")
    names: dict[str, int] = {}
    for index, spec in enumerate(specs):
        for name in {spec.key, spec.id} - {None}:
            if name in names:
                raise SubmissionRefused(f"task {index + 1} repeats the key or id {name!r}")
            names[name] = index
    resolved: list[list[ResolvedDependency]] = []
    for index, spec in enumerate(specs):
        deps = []
        for ref in spec.depends_on:
            target = names.get(ref)
            if target is None:
                ref = _canonical_id(ref)  # ids are stored as lower-case UUIDs, whatever the case given
                target = names.get(ref)
            if target is None:
                deps.append(ResolvedDependency(task_id=ref))
            elif target == index:
                raise SubmissionRefused(f"task {index + 1} depends on itself ({ref})")
            elif target > index:
                raise SubmissionRefused(
                    f"task {index + 1} depends on {ref}, which comes later in the batch: "
                    "list dependencies first"
                )
            else:
                deps.append(ResolvedDependency(batch_index=target))
        resolved.append(deps)
    return resolved
