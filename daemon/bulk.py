"""Acting on many tasks at once (SPEC §14 Bulk): which tasks a request names, and one result each.

Every acting operation (`cancel`, `pause`, `resume`, `hold`, `release`, `priority`, and the
restart log's `dismiss` and `recreate`) takes the same arguments: `ids` (whole ids or unique
prefixes), or the selectors `run`, `status` and `type`, combined (all must match). It replies

    {"results": [{"id": <full id, or the text given when it names nothing>, "ok": bool,
                  "message": "<one line>", ...extra}, ...]}

one entry per task (or entry) named, in the order given (a selector's in submission order). A
refused id does not stop the others; a selector that matches nothing refuses the whole request
(`NothingSelected`), since then there is nothing to report.

The targets are resolved here, on the request's thread with its read-only connection, the ids
alone and a chunk at a time: a selector over 50,000 tasks never holds their rows. Each chunk is
one hand-over to the supervisor's loop thread (`Supervisor.call`), which alone writes, where each
target is acted on through the store's guarded functions, in a savepoint of its own: a refusal
undoes only that target's part.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Callable, Iterable, Iterator, Sequence

import structlog

from daemon import models, protocol
from daemon.errors import FredicaError, NothingSelected, UnknownRestartEntry
from daemon.store import db, restarts
from daemon.store import ids as id_store
from daemon.store import selection as selection_store

log = structlog.get_logger("fredica.control")
CHUNK = 1000  # targets per hand-over to the loop: a bulk of 10,000 is ten


Result = protocol.Result
BulkReply = protocol.ResultsReply


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a bulk request names: ids, or selectors that all must match."""

    ids: tuple[str, ...] = ()
    run: str | None = None
    status: tuple[str, ...] = ()
    type: str | None = None

    @classmethod
    def of(cls, ids: Sequence[str] | None = None, run: str | None = None, status: str | Sequence[str] | None = None,
           type: str | None = None) -> Selection:
        """A selection from a request's arguments; refused (nothing done) when it names nothing,
        mixes ids with selectors, or names a status no task can have."""
        statuses = (status,) if isinstance(status, str) else tuple(status or ())
        for word in statuses:
            if word not in models.TASK_FILTER_WORDS:
                raise protocol.ProtocolError(f"unknown status {protocol.shown(word)}")
        chosen = cls(tuple(ids or ()), run, statuses, type)
        if chosen.ids and chosen.selectors:
            raise protocol.ProtocolError("give ids or selectors (run, status, type), not both")
        if not chosen.ids and not chosen.selectors:
            raise protocol.ProtocolError("give at least one id, or a selector (run, status, type)")
        return chosen

    @property
    def selectors(self) -> bool:
        return self.run is not None or bool(self.status) or self.type is not None

    def described(self) -> str:
        """The selectors as the CLI spells them: `--run 3c1d6ff8 --status held`."""
        words = [] if self.run is None else [f"--run {self.run}"]
        words += [f"--status {word}" for word in self.status]
        return " ".join(words + ([] if self.type is None else [f"--type {self.type}"]))


@dataclasses.dataclass(frozen=True)
class Target:
    """One thing a request names: a task or run by its full id, or what was given and why it names
    nothing (`refusal`)."""

    given: str
    id: str | None = None
    kind: str = "task"  # or "run", or "entry" (of the restart log)
    refusal: FredicaError | None = None


@dataclasses.dataclass(frozen=True)
class Reach:
    """What an operation's selectors reach: the tasks it can act on (`scope`, and `noun`, as a
    refusal says them: "no held task matches ...: nothing was released"), and in which order it
    acts on them."""

    op: str  # the operation, as the protocol names it
    done: str  # what was done to a task, for "nothing was cancelled"
    scope: selection_store.Scope
    noun: str
    kinds: tuple[id_store.Kind, ...] = ("task",)  # what an id may name
    newest_first: bool = False  # act on dependents before what they depend on (`newest_first`)


def targets(conn: sqlite3.Connection, chosen: Selection, reach: Reach) -> Iterator[list[Target]]:
    """The targets of `chosen`, a chunk at a time: each id as resolved (a repeat of one already
    named is skipped), or the tasks in the operation's reach that the selectors match, in
    submission order (or the newest first). NothingSelected when the selectors match no such
    task; UnknownRun when their run names none."""
    if chosen.ids:
        seen: set[str] = set()
        chunk: list[Target] = []
        for given in chosen.ids:
            try:
                named = id_store.resolve(conn, given, reach.kinds)
            except FredicaError as exc:
                chunk.append(Target(given, refusal=exc))
            else:
                if named.id in seen:
                    continue
                seen.add(named.id)
                chunk.append(Target(given, named.id, named.kind))
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
        return
    run_id = None if chosen.run is None else id_store.run_id(conn, chosen.run)
    found = False
    for ids in selection_store.task_ids(conn, scope=reach.scope, status=chosen.status, run_id=run_id,
                                        task_type=chosen.type, chunk=CHUNK, newest_first=reach.newest_first):
        found = True
        yield [Target(task_id, task_id) for task_id in ids]
    if not found:
        raise NothingSelected(f"no {reach.noun} task matches {chosen.described()}: nothing was {reach.done}")


def entry_targets(conn: sqlite3.Connection, ids: Sequence[str], *, every: bool = False, run: str | None = None
                  ) -> Iterator[list[Target]]:
    """The restart-log entries named: by id (a number), or every entry awaiting review (`every`),
    or those of a run. NothingSelected when `every` or `run` finds none awaiting review."""
    if ids and (every or run is not None):
        raise protocol.ProtocolError("give entry ids or a selector (all, run), not both")
    if not ids and not every and run is None:
        raise protocol.ProtocolError("give at least one entry id, or a selector (all, run)")
    if ids:
        named = [_entry(given) for given in dict.fromkeys(ids)]
        for start in range(0, len(named), CHUNK):
            yield named[start : start + CHUNK]
        return
    run_id = None if run is None else id_store.run_id(conn, run)
    found = [str(entry_id) for entry_id in restarts.entry_ids(conn, run_id=run_id)]
    if not found:
        raise NothingSelected("no restart-log entry awaits review" + ("" if run is None else f" in run {run_id}"))
    for start in range(0, len(found), CHUNK):
        yield [Target(entry_id, entry_id, "entry") for entry_id in found[start : start + CHUNK]]


def _entry(given: str) -> Target:
    text = given.strip()
    if not text.isdigit():
        return Target(given, refusal=FredicaError(f"restart-log entry ids are numbers, not {given!r}"))
    if int(text) >= 2**63:  # more than SQLite's integers hold: no entry has it
        return Target(given, refusal=UnknownRestartEntry(f"no restart-log entry has id {text}"))
    return Target(given, str(int(text)), "entry")


def act(
    op: str,
    chunks: Iterable[list[Target]],
    on_loop: Callable[[Callable[[], list[Result]]], list[Result]],
    apply: Callable[[list[Target]], list[Result]],
) -> BulkReply:
    """`apply` each chunk of targets (from `targets` or `entry_targets`) through `on_loop` (the
    supervisor's `call`): one result per target, in order; those that name nothing are refused
    here, without a hand-over. One log line says what `op` did."""
    results: list[Result] = []
    hand_overs = 0
    for chunk in chunks:
        named = [target for target in chunk if target.refusal is None]
        if named:
            hand_overs += 1
        applied = iter(on_loop(lambda: apply(named)) if named else [])
        for target in chunk:
            results.append(refused(target.given, target.refusal) if target.refusal is not None else next(applied))
    log.info("bulk_acted", op=op, targets=len(results), refused=sum(not r["ok"] for r in results),
             hand_overs=hand_overs)
    return {"results": results}


def each(conn: sqlite3.Connection, action: Callable[[Target], tuple[str, dict[str, Any]]],
         newest_first: bool = False) -> Callable[[list[Target]], list[Result]]:
    """A chunk's `apply` that acts on one target at a time, in a savepoint of its own (on the loop
    thread): `action` returns its message and extra keys, or raises a FredicaError to refuse it.
    `newest_first`: tasks are acted on the newest first (runs after them), reported in order."""

    def apply(chunk: list[Target]) -> list[Result]:
        if newest_first:
            order = selection_store.newest_first(conn, [t.id for t in chunk if t.kind == "task" and t.id])
            rank = {task_id: index for index, task_id in enumerate(order)}
            acting = sorted(chunk, key=lambda t: rank.get(t.id or "", len(rank)))
        else:
            acting = chunk
        done = {id(target): result for target, result in zip(acting, _each(acting))}
        return [done[id(target)] for target in chunk]

    def _each(chunk: list[Target]) -> list[Result]:
        results: list[Result] = []
        for target in chunk:
            assert target.id is not None
            try:
                with db.savepoint(conn):
                    message, extra = action(target)
            except FredicaError as exc:
                results.append(refused(target.id, exc))
            else:
                results.append({"id": target.id, "ok": True, "message": message, **extra})  # type: ignore[typeddict-item]
        return results

    return apply


def from_outcomes(chunk: Iterable[Target], outcomes: dict[str, str | None], done: str) -> list[Result]:
    """Results for a store function's outcomes (id → None when done, else why not): `done` is the
    message of each done, with `{id}` for its id."""
    results: list[Result] = []
    for target in chunk:
        assert target.id is not None
        why = outcomes[target.id]
        if why is None:
            results.append({"id": target.id, "ok": True, "message": done.format(id=target.id)})
        else:
            results.append({"id": target.id, "ok": False, "message": why, "kind": "InvalidTransition"})
    return results


def refused(given: str, exc: FredicaError) -> Result:
    """The result of a target refused with `exc`."""
    return {"id": given, "ok": False, "message": exc.message, "kind": exc.kind}
