"""Queues (SPEC §15): which queue a task type goes to, and how many attempts each runs at once.

`[queues.NAME]` with `workers = N` and `types = [...]`; the queue `default` takes every type no
other queue names and has `[daemon] max_workers` workers. `[queues.default]` may be given, but
takes only the event-loop keys and `prefetch`: its size is `[daemon] max_workers` (one place to
say it), and its types are whatever the others leave.

The configured values are frozen here (`QueueConfig`); what the daemon changes while it runs
(`fredica queue workers`, `fredica queue pause`) lives in `Queues`, owned by the supervisor's
loop thread.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Protocol

from daemon.errors import QueueError, SubmissionRefused

DEFAULT = "default"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Attempts at once. Past SYNC_WORKERS each would be a process of its own: only a queue of event-loop
# executors, whose attempts share `processes` processes, may be that big (`check_task_types`).
MAX_WORKERS = 100_000
SYNC_WORKERS = 1024
MAX_PROCESSES = 64
# Tasks each worker may hold claimed behind the one it runs: a few are enough for the next to start
# without a round trip; more only keep tasks from workers that free first.
MAX_PREFETCH = 64
QUEUE_KEYS = {"workers", "types", "processes", "loop_block_limit", "prefetch"}
DEFAULT_KEYS = {"processes", "loop_block_limit", "prefetch"}  # `[queues.default]`: its size is [daemon] max_workers


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """One `[queues.NAME]` table, checked."""

    name: str
    workers: int
    types: tuple[str, ...] = ()
    processes: int = 1  # event-loop executor processes sharing its workers
    loop_block_limit: float = 10.0  # seconds an event-loop process's loop may be blocked
    prefetch: int = 0  # claimed tasks each worker holds, sent ahead, behind the one it runs


def check_name(name: Any) -> str:
    """A queue name as the config and `--queue` take it; QueueError otherwise."""
    if not isinstance(name, str):
        raise QueueError(f"a queue name must be a string, not {name!r}")
    if not NAME.fullmatch(name):
        raise QueueError(
            f"bad queue name {name!r}: letters, digits, '-' and '_', starting with a letter or digit, "
            "at most 64 characters"
        )
    return name


def check_workers(where: str, value: Any) -> int:
    """A queue's size: an integer from 1 to MAX_WORKERS; QueueError (saying `where`) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueueError(f"{where} workers must be an integer, not {value!r}")
    if not 1 <= value <= MAX_WORKERS:
        raise QueueError(f"{where} workers must be between 1 and {MAX_WORKERS}, not {value!r}")
    return value


def parse(data: Any) -> dict[str, QueueConfig]:
    """The queues of the `[queues]` table other than `default` (whose size is `[daemon]
    max_workers`: `with_default`); QueueError names the problem."""
    if not isinstance(data, Mapping):
        raise QueueError("[queues] must be a table of queues, like [queues.media]")
    found: dict[str, QueueConfig] = {}
    owner: dict[str, str] = {}  # task type -> the queue that names it
    for name, body in data.items():
        check_name(name)
        where = f"[queues.{name}]"
        if not isinstance(body, Mapping):
            raise QueueError(f"{where} must be a table")
        unknown = sorted(set(body) - QUEUE_KEYS)
        if unknown:
            raise QueueError(f"{where} unknown key(s) {', '.join(repr(k) for k in unknown)}")
        processes, block_limit = _event_loop_options(where, body)
        prefetch = _prefetch(where, body)
        if name == DEFAULT:
            if "workers" in body:
                raise QueueError(f"{where} takes no workers: set [daemon] max_workers")
            if "types" in body:
                raise QueueError(f"{where} takes no types: it runs every type no other queue names")
            found[name] = QueueConfig(name, 0, (), processes, block_limit, prefetch)  # sized by `with_default`
            continue
        if "workers" not in body:
            raise QueueError(f"{where} needs workers = N")
        workers = check_workers(where, body["workers"])
        types = body.get("types", [])
        if not isinstance(types, list) or not all(isinstance(t, str) and t.strip() for t in types):
            raise QueueError(f"{where} types must be a list of task types, like [\"TRANSCODE_MP4\"]")
        for task_type in types:
            if task_type in owner:
                raise QueueError(f"task type {task_type} is routed to two queues: {owner[task_type]} and {name}")
            owner[task_type] = name
        found[name] = QueueConfig(name, workers, tuple(types), processes, block_limit, prefetch)
    return found


def _event_loop_options(where: str, body: Mapping[str, Any]) -> tuple[int, float]:
    processes = body.get("processes", 1)
    if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= MAX_PROCESSES:
        raise QueueError(f"{where} processes must be an integer from 1 to {MAX_PROCESSES}, not {processes!r}")
    limit = body.get("loop_block_limit", 10.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0.1 <= limit <= 3600:
        raise QueueError(f"{where} loop_block_limit must be a number of seconds from 0.1 to 3600, not {limit!r}")
    return processes, float(limit)


def _prefetch(where: str, body: Mapping[str, Any]) -> int:
    prefetch = body.get("prefetch", 0)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= MAX_PREFETCH:
        raise QueueError(f"{where} prefetch must be an integer from 0 to {MAX_PREFETCH}, not {prefetch!r}")
    return prefetch


def with_default(queues: Mapping[str, QueueConfig], max_workers: int) -> dict[str, QueueConfig]:
    """Every queue: `default` (first, with `max_workers` workers), then the configured ones."""
    default = dataclasses.replace(queues.get(DEFAULT, QueueConfig(DEFAULT, 0)), workers=max_workers)
    return {DEFAULT: default, **{n: q for n, q in queues.items() if n != DEFAULT}}


class KnowsExecutors(Protocol):
    def __contains__(self, task_type: object) -> bool: ...
    def runs_in_event_loop(self, task_type: str) -> bool: ...


def check_task_types(queues: Mapping[str, QueueConfig], registry: KnowsExecutors) -> None:
    """Refuse a queue naming a task type no executor handles (known once executors are loaded),
    and one of more than SYNC_WORKERS workers that would run a plain (not event-loop) executor."""
    for queue in queues.values():
        for task_type in queue.types:
            if task_type not in registry:
                raise QueueError(f"[queues.{queue.name}] types: no executor for type {task_type}")
        check_size(queue.name, queue.workers, queue.types, registry)


def check_size(name: str, workers: int, types: Iterable[str], registry: KnowsExecutors) -> None:
    """Past SYNC_WORKERS, a queue must run event-loop executors only (and name its types: the
    default queue runs whatever else there is)."""
    if workers <= SYNC_WORKERS:
        return
    plain = [t for t in types if not registry.runs_in_event_loop(t)]
    if name == DEFAULT or not types or plain:
        what = f"type {plain[0]} is not an event-loop executor" if plain else "it may run any executor"
        raise QueueError(f"[queues.{name}] workers: more than {SYNC_WORKERS} only for event-loop executors "
                         f"({what}: each of its attempts would be a process)")


def routing(queues: Mapping[str, QueueConfig]) -> dict[str, str]:
    """Task type → the queue its tasks go to (types not listed go to `default`)."""
    return {task_type: queue.name for queue in queues.values() for task_type in queue.types}


class Queues:
    """The queues of a running daemon: their sizes (changeable at runtime) and which are paused.

    Loop thread only for changes; other threads may read (`snapshot`).
    """

    def __init__(self, configs: Mapping[str, QueueConfig], paused: Iterable[str] = ()) -> None:
        self.configs = dict(configs)
        self.routes = routing(configs)
        self.workers = {name: config.workers for name, config in configs.items()}
        self.paused = {name for name in paused if name in configs}

    @property
    def names(self) -> list[str]:
        return list(self.configs)

    @property
    def total_workers(self) -> int:
        return sum(self.workers.values())

    def route(self, task_type: str) -> str:
        return self.routes.get(task_type, DEFAULT)

    def require(self, name: str) -> str:
        """`name` if it is a configured queue; else QueueError listing the configured ones."""
        if name not in self.configs:
            raise QueueError(self._unknown(name))
        return name

    def check_specs(self, specs: Iterable[Any]) -> None:
        """Refuse a submission naming a queue that is not configured (nothing is stored)."""
        specs = list(specs)
        for number, spec in enumerate(specs, start=1):
            if spec.queue is not None and spec.queue not in self.configs:
                prefix = f"task {number}: " if len(specs) > 1 else ""
                raise SubmissionRefused(prefix + self._unknown(spec.queue))

    def _unknown(self, name: str) -> str:
        return f"unknown queue {name!r}; configured: {', '.join(self.configs)}"

    def claimable(self) -> list[str]:
        """The queues that may claim now (not paused), in config order."""
        return [name for name in self.configs if name not in self.paused]

    def state(self) -> tuple[dict[str, int], frozenset[str]]:
        """What a rolled-back tick restores (`restore`)."""
        return dict(self.workers), frozenset(self.paused)

    def restore(self, state: tuple[dict[str, int], frozenset[str]]) -> None:
        self.workers, self.paused = dict(state[0]), set(state[1])
