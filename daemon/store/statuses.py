"""Task statuses as the store's SQL spells them: literals made from `daemon.models`' enums, the
one place their values are written.

Literals, not bound parameters: SQLite uses a partial index (`task_ready`, `task_delayed`,
`task_active_idempotency`, ...) only when the query's WHERE clause holds its terms as written,
and an upsert's conflict target must match the index's WHERE term by term. The migrations keep
their own spelling: each is the record of SQL that has already run.
"""

from __future__ import annotations

from typing import Iterable

from daemon.models import ACTIVE_STATUSES, IN_FLIGHT_STATUSES, WAITING_STATUSES, TaskStatus


def literal(status: TaskStatus) -> str:
    """`status` as an SQL string literal (`'pending'`)."""
    return f"'{status.value}'"


def literals(statuses: Iterable[TaskStatus]) -> str:
    """The statuses as a list for `IN (...)`, in the enum's order (as the indexes spell it)."""
    wanted = frozenset(statuses)
    return ", ".join(literal(status) for status in TaskStatus if status in wanted)


PENDING = literal(TaskStatus.PENDING)
CLAIMED = literal(TaskStatus.CLAIMED)
RUNNING = literal(TaskStatus.RUNNING)
ACTIVE = literals(ACTIVE_STATUSES)  # 'pending', 'claimed', 'running'
WAITING = literals(WAITING_STATUSES)  # 'pending', 'claimed': not started yet
IN_FLIGHT = literals(IN_FLIGHT_STATUSES)  # a supervisor's: what its death leaves
