"""What `fredica submit` turns into task specs: one task's options, or a JSON-lines batch.

Checked here, before anything is sent, with one clear line naming the option or the line.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from daemon import protocol
from daemon.errors import FredicaError

# submit's options for the fields of one task spec, by spec field.
SPEC_FLAGS = {
    "payload": "--payload",
    "priority": "--priority",
    "depends_on": "--depends-on",
    "max_retries": "--max-retries",
    "idempotency_key": "--idempotency-key",
    "material_id": "--material",
    "timeout": "--timeout",
    "queue": "--queue",
    "hold": "--hold",
}


def spec_from_options(task_type: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task spec `fredica submit TYPE` describes with its options."""
    spec: dict[str, Any] = {"type": task_type}
    if options["payload"] is not None:
        try:
            spec["payload"] = json.loads(options["payload"])
        except ValueError as exc:
            raise FredicaError(f"--payload is not valid JSON: {exc}") from None
        except RecursionError:
            raise FredicaError("--payload is nested too deeply") from None
        if not isinstance(spec["payload"], dict):
            raise FredicaError("--payload must be a JSON object, like '{\"url\": \"...\"}'")
    for field in ("priority", "max_retries", "idempotency_key", "material_id", "timeout", "queue"):
        if options[field] is not None:
            spec[field] = options[field]
    if options["depends_on"]:
        spec["depends_on"] = list(options["depends_on"])
    if options.get("hold"):
        spec["hold"] = True
    for field, value in spec.items():
        _check_text(value, "TYPE" if field == "type" else SPEC_FLAGS[field])
    return spec


def batch_line_error(exc: FredicaError, numbers: Sequence[int]) -> FredicaError:
    """The daemon's `task N: ...` refusal of a batch as `batch line L: ...` (SPEC §14); any
    other refusal as it is."""
    match = re.match(r"task (\d+)(?: \([^)]*\))?: ", exc.message)
    if match is None or not 1 <= int(match.group(1)) <= len(numbers):
        return exc
    # Printed by the CLI as one error line: the kind need not travel further.
    return FredicaError(f"batch line {numbers[int(match.group(1)) - 1]}: {exc.message[match.end():]}")


def _check_text(value: Any, name: str, prefix: str = "") -> None:
    """Refuse what the daemon would refuse anyway, naming where it is: a string that is not text
    (bytes of an argument that are not UTF-8, a lone surrogate escape in JSON)."""
    where = protocol.non_text(value, root=name)
    if where is not None:
        raise protocol.NotText(f"{prefix}{where} ({protocol.NOT_TEXT})")


def read_batch(stream: Any) -> list[dict[str, Any]]:
    """The task specs of a JSON-lines batch; refuses the whole batch, naming the line, if one is bad."""
    return read_numbered_batch(stream)[0]


def read_numbered_batch(stream: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """`read_batch`, with the line number of each spec (blank lines are skipped), so that what
    the daemon refuses as `task N` can be told as `batch line L`."""
    from daemon import submission

    try:
        text = stream.read()
    except UnicodeDecodeError as exc:
        raise FredicaError(f"the batch is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    specs = []
    numbers: list[int] = []
    # Lines end at "\n" only: splitlines() would also cut at U+2028 and friends, which JSON
    # strings may hold as they are.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            spec = json.loads(line)
        except ValueError as exc:
            raise FredicaError(f"batch line {number} is not valid JSON: {exc}") from None
        except RecursionError:
            raise FredicaError(f"batch line {number} is nested too deeply") from None
        if not isinstance(spec, dict):
            raise FredicaError(f"batch line {number} is not a JSON object")
        _check_text(spec, "", prefix=f"batch line {number}: ")
        try:
            submission.parse_spec(spec)
        except FredicaError as exc:
            raise FredicaError(f"batch line {number}: {exc.message}") from None
        specs.append(spec)
        numbers.append(number)
    if not specs:
        raise FredicaError("the batch has no tasks")
    return specs, numbers
