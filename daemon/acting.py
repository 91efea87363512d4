"""The acting operations of the control protocol, each over many targets (SPEC §14 Bulk).

`cancel`, `pause`, `resume`, `hold`, `release`, `priority`, `restarts_dismiss` and
`restarts_recreate`: what each does to one target and the line it reports, on top of `daemon.bulk`
(which resolves the targets and hands them to the loop a chunk at a time). `operations.Handlers`
takes these methods in.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, Callable, Iterable

import structlog

from daemon import bulk
from daemon.bulk import BulkReply, Result, Selection, Target
from daemon.errors import ProtocolError
from daemon.store import cancels, db, restarts, waiting
from daemon.store.selection import Scope
from daemon.submission import MAX_PRIORITY

if TYPE_CHECKING:  # not at run time: `operations` is imported by the CLI's reads too
    from daemon import retry
    from daemon.engine.requests import CancelReport
    from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.control")

# What each operation's selectors reach (`bulk.Reach`).
CANCEL = bulk.Reach("cancel", "cancelled", Scope.UNFINISHED, "unfinished", kinds=("task", "run"), newest_first=True)
PAUSE = bulk.Reach("pause", "paused", Scope.UNPAUSED, "running, unpaused")
RESUME = bulk.Reach("resume", "resumed", Scope.PAUSED, "paused")
HOLD = bulk.Reach("hold", "held", Scope.NOT_HELD, "waiting")
RELEASE = bulk.Reach("release", "released", Scope.HELD, "held")
PRIORITY = bulk.Reach("priority", "changed", Scope.PENDING, "waiting or held")
RETRY = bulk.Reach("retry", "retried", Scope.ENDED_UNDONE, "failed or cancelled")


def cancel_message(report: CancelReport) -> str:
    """One line for what cancelling one task or run did: cancelled now, and still stopping."""
    cancelled, stopping, dependents = report.cancelled, report.stopping, report.dependents
    if not cancelled and not stopping:
        return "nothing to cancel: no task was waiting or running"
    tasks_that_depend = f"{dependents} task{'s' * (dependents != 1)} that depend{'s' * (dependents == 1)} on it"
    if len(cancelled) + len(stopping) == 1 and not report.run:
        if cancelled:
            return f"cancelled {cancelled[0]}" + (f", and the {tasks_that_depend}" if dependents else "")
        line = f"stopping {stopping[0]} (cancel sent to the running task)"
        verb = "is" if dependents == 1 else "are"
        return line + (f"; the {tasks_that_depend} {verb} cancelled once it stops" if dependents else "")
    parts = []
    if cancelled:
        parts.append(f"cancelled {len(cancelled)} task{'s' * (len(cancelled) != 1)}")
    if stopping:
        parts.append(f"stopping {len(stopping)} running task{'s' * (len(stopping) != 1)}")
    return (f"run {report.run}: " if report.run else "") + ", ".join(parts)


class ActingHandlers:
    """The `op_` methods of the acting operations (a part of `operations.Handlers`)."""

    sup: Supervisor
    _reader: Callable[[], sqlite3.Connection]

    def _act(self, chosen: Selection, reach: bulk.Reach, apply: Callable[[list[Target]], list[Result]]) -> BulkReply:
        reply = bulk.act(reach.op, bulk.targets(self._reader(), chosen, reach), self.sup.call, apply)
        self.sup.wake()  # a release or a priority may have made a task claimable
        return reply

    def op_cancel(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                  type: str | None = None) -> BulkReply:
        """Cancel each task, or every unfinished task of each run (SPEC §7)."""
        def cancel_one(target: Target) -> tuple[str, dict[str, Any]]:
            assert target.id is not None
            report = self.sup.cancel(target.id)
            extra = {"cancelled": list(report.cancelled), "stopping": list(report.stopping),
                     "dependents": report.dependents}
            return cancel_message(report), extra

        one_by_one = bulk.each(self.sup.conn, cancel_one, newest_first=True)

        def apply(chunk: list[Target]) -> list[Result]:
            # The waiting tasks, which no attempt of ours runs, in one transition; the others
            # (running tasks, runs, refusals) one by one, through the supervisor.
            sup = self.sup
            ours = set(sup.running) | {rt.task.id for rt in sup.unrecorded}
            with db.savepoint(sup.conn):
                done = cancels.cancel_waiting(sup.conn, [t.id for t in chunk if t.kind == "task" and t.id
                                                       and t.id not in ours], now=sup.clock())
            if done:
                log.info("tasks_cancelled", by="user", count=len(done), task_ids=list(done))
            rest = iter(one_by_one([t for t in chunk if t.id not in done]))
            return [_cancelled(t.id, done[t.id]) if t.id in done else next(rest) for t in chunk]

        return self._act(Selection.of(ids, run, status, type), CANCEL, apply)

    def op_pause(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                 type: str | None = None) -> BulkReply:
        """Pause each running, pausable task."""
        return self._pause_or_resume(Selection.of(ids, run, status, type), PAUSE)

    def op_resume(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                  type: str | None = None) -> BulkReply:
        """Resume each paused task."""
        return self._pause_or_resume(Selection.of(ids, run, status, type), RESUME)

    def _pause_or_resume(self, chosen: Selection, reach: bulk.Reach) -> BulkReply:
        paused = reach is PAUSE

        def one(target: Target) -> tuple[str, dict[str, Any]]:
            assert target.id is not None
            task = self.sup.pause(target.id) if paused else self.sup.resume(target.id)
            owner = self.sup.owner_elsewhere(task)
            if owner is not None:  # asked of it (SPEC §16): it acts on it within a second
                return (f"{'pause' if paused else 'resume'} of {task.id} asked of supervisor {owner}",
                        {"is_paused": task.is_paused, "asked_of": owner})
            return f"{'paused' if paused else 'resumed'} {task.id}", {"is_paused": task.is_paused}

        return self._act(chosen, reach, bulk.each(self.sup.conn, one))

    def op_hold(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                type: str | None = None) -> BulkReply:
        """Hold each waiting task: never claimed until released (SPEC §14)."""
        sup = self.sup
        return self._act(Selection.of(ids, run, status, type), HOLD, lambda chunk: bulk.from_outcomes(
            chunk, waiting.hold(sup.conn, _ids(chunk)), "held {id}"))

    def op_release(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                   type: str | None = None) -> BulkReply:
        """Release each held task: claimable again."""
        sup = self.sup
        return self._act(Selection.of(ids, run, status, type), RELEASE, lambda chunk: bulk.from_outcomes(
            chunk, waiting.release(sup.conn, _ids(chunk)), "released {id}"))

    def op_priority(self, priority: int, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                    type: str | None = None) -> BulkReply:
        """Give each waiting task (held or not) `priority`: the next claim honours it."""
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise ProtocolError(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, not {priority}")
        sup = self.sup
        return self._act(Selection.of(ids, run, status, type), PRIORITY, lambda chunk: bulk.from_outcomes(
            chunk, waiting.set_priority(sup.conn, _ids(chunk), priority), f"priority {priority}: {{id}}"))

    def op_restarts_dismiss(self, ids: list[str] | None = None, all: bool = False, run: str | None = None
                            ) -> BulkReply:
        """Mark each restart-log entry as reviewed, without running its task again."""
        sup = self.sup

        def dismiss_one(target: Target) -> tuple[str, dict[str, Any]]:
            entry = restarts.resolve(sup.conn, _entry_id(target), "dismissed", now=sup.clock())
            return f"dismissed {entry.id}", {"task_id": entry.task_id}

        chunks = bulk.entry_targets(self._reader(), ids or (), every=all, run=run)
        return bulk.act("restarts_dismiss", chunks, sup.call, bulk.each(sup.conn, dismiss_one))

    def op_restarts_recreate(self, ids: list[str] | None = None, all: bool = False, run: str | None = None
                             ) -> BulkReply:
        """Run the tasks of restart-log entries again (`daemon.retry`): those from one original
        run make one new run, so all the entries named go to the loop together."""
        from daemon import retry  # loaded by the daemon already; not for the CLI's reads

        chunks = bulk.entry_targets(self._reader(), ids or (), every=all, run=run)
        return self._rerun("restarts_recreate", chunks, retry.recreate_entries)

    def op_retry(self, ids: list[str] | None = None, run: str | None = None, status: Any = None,
                 type: str | None = None) -> BulkReply:
        """Run failed or cancelled tasks again as new tasks, with the tasks their failure
        cancelled (`daemon.retry`): tasks of one run make one new run, so all go together."""
        from daemon import retry  # as above

        return self._rerun("retry", bulk.targets(self._reader(), Selection.of(ids, run, status, type), RETRY),
                           retry.retry_tasks)

    def _rerun(self, op: str, chunks: Iterable[list[Target]],
               how: Callable[..., list[retry.Result]]) -> BulkReply:
        # One chunk of them all (ids only): copies of one run's tasks must be one new run.
        sup = self.sup
        everything = [target for chunk in chunks for target in chunk]

        def apply(named: list[Target]) -> list[Result]:
            done = how(sup.conn, [t.id for t in named if t.id is not None], now=sup.clock(),
                       routes=sup.queues.routes, queue_names=sup.queues.names)
            return [result.to_dict() for result in done]

        reply = bulk.act(op, [everything], sup.call, apply)
        sup.wake()
        return reply


def _cancelled(task_id: str, dependents: int) -> Result:
    from daemon.engine.requests import CancelReport  # loaded by the daemon already

    report = CancelReport((task_id,), (), dependents)
    return {"id": task_id, "ok": True, "message": cancel_message(report), "cancelled": [task_id], "stopping": [],
            "dependents": dependents}


def _ids(chunk: list[Target]) -> list[str]:
    return [target.id for target in chunk if target.id is not None]


def _entry_id(target: Target) -> int:
    assert target.id is not None
    return int(target.id)  # a number SQLite can hold (`bulk.entry_targets`)
