"""What each request of the control protocol does: one handler per operation.

Reads use a read-only connection of the serving thread, so a long `ls` never stalls the loop;
mutations are handed to the supervisor's loop thread (`Supervisor.call`), which alone writes the
database. The read handlers (`Reads`) need only the settings and a connection, not the daemon:
with the daemon down the CLI runs the very same ones in its own process (`daemon.offline`). Every argument is checked against the protocol's table of operations
(`protocol.OPERATIONS`, which the client checks its requests against too) before the handler
runs, so that nothing of the wrong type reaches SQLite (which would answer with an internal error).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator, Mapping

from daemon import acting, faults, models, protocol
from daemon.errors import FredicaError, LogElsewhere
from daemon.models import RunStatus, TaskStatus
from daemon.engine import cleaning as engine_cleaning
from daemon.store import backend, cleaning, db, listing, restarts, runs, supervisors, task_reads, tasks
from daemon.store import ids as id_store
from daemon.store import queues as queue_store
from daemon.submission import parse_spec

if TYPE_CHECKING:  # not at run time: the CLI imports the reads, without the daemon's loop
    from daemon.config import Settings
    from daemon.supervisor import Supervisor
    from executors.registry import Registry


# The longest one `wait` request blocks: a client waiting longer asks again, so that its socket
# timeout never fires on a wait that goes well.
WAIT_SLICE = 10.0
# The longest one `clean` request works before it answers with what it has removed so far.
CLEAN_SLICE = 5.0


class Reads:
    """The handlers of the requests that only read: one method per request type, each returning
    the reply's data or raising a FredicaError. What only a running daemon knows (its pid, its
    busy workers, its executors) comes from the methods at the end, which `Handlers` overrides;
    as written here they say what is true with no daemon running."""

    def __init__(self, settings: Settings, reader: Callable[[], sqlite3.Connection]) -> None:
        """`reader`: the read-only connection of the calling thread."""
        self.settings = settings
        self._reader = reader

    def _checked(self, pages: Iterator[list[dict[str, Any]]]) -> Iterator[list[dict[str, Any]]]:
        """A streamed reply's pages, read later than the handler returns (`Handlers` meets their
        errors as those of `handle`)."""
        return pages

    # --- reads ----------------------------------------------------------------------------------

    def op_status(self) -> dict[str, Any]:
        daemon = self._daemon_facts()
        return {
            "pid": daemon["pid"],
            "uptime": daemon["uptime"],
            # Every queue's workers (the config's max_workers when no other queue is set).
            "max_workers": sum(self._queue_workers().values()),
            "busy_workers": daemon["busy_workers"],
            "queues": {row.pop("name"): row for row in self.op_queues()},
            "counts": task_reads.count_by_status(self._reader()),
            "database": backend.shown(self.settings.database),
            "socket": str(self.settings.socket),
            "log_dir": str(self.settings.log_dir),
            # While the database cannot be written: what the fault is (None: none).
            "database_fault": daemon["database_fault"],
            "database_faults": daemon["database_faults"],
            # A shared PostgreSQL queue's supervisors, every host's (SPEC §16); SQLite has its one.
            **({"supervisors": supervisors.overview(self._reader())}
               if backend.is_postgres(self.settings.database) else {}),
        }

    def op_ls(self, status: str | list[str] | None = None, run: str | None = None, type: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        _check_task_statuses(status)
        _check_limit(limit)
        conn = self._reader()
        run_id = None if run is None else id_store.run_id(conn, run)
        found = task_reads.list_tasks(conn, status=status, run_id=run_id, task_type=type, limit=limit)
        return [t.to_dict() for t in found]

    def op_ls_pages(self, status: str | list[str] | None = None, run: str | None = None, type: str | None = None,
                    limit: int | None = None, sort: str | None = None, since: float | None = None,
                    total: bool = False) -> protocol.Pages:
        """`ls` as a stream of pages (`protocol.Pages`), each read as the one before has gone out;
        with `total`, the last frame says how many tasks match (for the "N more" line)."""
        _check_task_statuses(status)
        _check_limit(limit)
        if sort is not None and sort not in listing.SORTS:
            raise protocol.ProtocolError(f"unknown sort {protocol.shown(sort)} (one of {', '.join(listing.SORTS)})")
        conn = self._reader()
        query = listing.TaskQuery(
            status=None if status is None else [status] if isinstance(status, str) else status,
            run_id=None if run is None else id_store.run_id(conn, run), task_type=type, since=since,
            sort=sort or listing.DEFAULT_SORT, now=time.time())
        matching = listing.count(conn, query) if total else None
        # Each page on the reader of the handler thread that makes its frame (not always the same).
        pages = ([t.to_dict() for t in found] for found in listing.tasks(_ThreadReader(self), query, limit))
        return protocol.Pages(self._checked(pages), (lambda: {"total": matching}) if total else dict)

    def op_runs(self, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        _check_statuses(status, RunStatus)
        _check_limit(limit)
        return [r.to_dict() for r in runs.list_runs(self._reader(), status=status, limit=limit)]

    def op_show(self, id: str, tasks_limit: int | None = None) -> protocol.ShowReply:
        """A task, or a run with its tasks: all of them, or its first `tasks_limit` with the counts
        of all by status (`task_counts`), as `show RUN` prints them."""
        _check_limit(tasks_limit)
        conn = self._reader()
        named = id_store.resolve(conn, id)
        if named.kind == "task":
            return {"kind": "task", "object": tasks.get(conn, named.id).to_dict()}
        obj = runs.get(conn, named.id).to_dict()
        obj["tasks"] = [t.to_dict() for t in task_reads.list_tasks(conn, run_id=named.id, limit=tasks_limit)]
        if tasks_limit is not None:
            obj["task_counts"] = listing.counts_by_display_status(conn, named.id)
        return {"kind": "run", "object": obj}

    def op_types(self) -> list[dict[str, Any]]:
        """The executor types (SPEC §14): pausable or not, one line of doc, payload keys."""
        registry = self._registry()
        found = []
        for name in registry:
            registration = registry.registration(name)
            cls = registration.cls
            found.append({"type": name, "pausable": cls.pausable, "doc": cls.summary(),
                          "payload_keys": list(cls.payload_keys), "event_loop": cls.runs_in_event_loop(),
                          "source": registration.source})
        return found

    def op_templates(self) -> list[dict[str, Any]]:
        """The configured templates: description, parameters (with their defaults) and tasks."""
        return [
            {"name": t.name, "description": t.description, "params": list(t.params), "defaults": dict(t.defaults),
             "tasks": [{"name": task.name, "type": task.spec.type} for task in t.tasks]}
            for t in sorted(self.settings.templates.values(), key=lambda t: t.name)
        ]

    def op_log_path(self, id: str | None = None) -> dict[str, Any]:
        if id is None:
            return {"path": str(self.settings.daemon_log), "active": True, "json_lines": True}
        conn = self._reader()
        task = tasks.get(conn, id_store.task_id(conn, id))
        self._refuse_a_log_elsewhere(conn, task)
        return {"path": str(self.settings.task_log(task.id)), "active": self._log_may_grow(task),
                "json_lines": False}

    def _refuse_a_log_elsewhere(self, conn: sqlite3.Connection, task: models.Task) -> None:
        """LogElsewhere, naming the host, for a task another supervisor of a shared PostgreSQL
        queue ran last: task logs stay on the host that ran the task (SPEC §16), and this host's
        log directory holds none of it. A task never claimed, or run here, passes."""
        if not backend.is_postgres(self.settings.database) or task.supervisor in (None, self.settings.name):
            return
        held = supervisors.find(conn, task.supervisor)
        where = (f"on host {held.host}" if held is not None
                 else "(its host is not known any more: it holds no lease now)")
        raise LogElsewhere(f"task {task.id} ran under supervisor {task.supervisor} {where}, which keeps its log: "
                           f"run `fredica logs {task.id}` on that host")

    def op_restarts(self, all: bool = False) -> list[dict[str, Any]]:
        return [e.to_dict() for e in restarts.list_entries(self._reader(), include_resolved=all)]

    def op_queues(self) -> list[dict[str, Any]]:
        workers = self._queue_workers()
        busy, paused = self._busy_by_queue(), self._paused_queues()
        conn = self._reader()
        waiting, held = queue_store.waiting(conn), queue_store.held(conn)
        configs = self.settings.all_queues
        # Held tasks show as held, as in `ls` (SPEC §14): not among the waiting.
        return [
            {"name": name, "workers": size, "busy": busy.get(name, 0),
             "waiting": waiting.get(name, 0) - held.get(name, 0), "held": held.get(name, 0), "paused": name in paused,
             "prefetch": configs[name].prefetch if name in configs else 0}
            for name, size in workers.items()
        ]

    # --- what a running daemon knows: as it is with none running --------------------------------

    def _daemon_facts(self) -> dict[str, Any]:
        """The daemon's process: its pid and uptime (None: none runs), busy workers, write faults."""
        return {"pid": None, "uptime": None, "busy_workers": 0, "database_fault": None, "database_faults": 0}

    def _queue_workers(self) -> Mapping[str, int]:
        """Each queue's size, in config order."""
        return {name: queue.workers for name, queue in self.settings.all_queues.items()}

    def _busy_by_queue(self) -> Mapping[str, int]:
        return {}

    def _paused_queues(self) -> Collection[str]:
        return queue_store.paused(self._reader())

    def _registry(self) -> Registry:
        from executors.registry import Registry  # only here: it imports the executors' modules

        return Registry.from_config(self.settings.executors)

    def _log_may_grow(self, task: models.Task) -> bool:
        """Whether something may still write the task's log: with no daemon, nothing does."""
        return False


class Handlers(acting.ActingHandlers, Reads):
    """Every request type of a running daemon: the reads, what only it knows, and the mutations (the
    acting operations, over many targets each, in `daemon.acting`)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self.readers = db.ThreadReaders(supervisor.settings.database)
        super().__init__(supervisor.settings, self.readers)

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        # Checked already by `protocol.parse_request`, against the same table.
        try:
            return getattr(self, f"op_{op}")(**args)
        except sqlite3.DatabaseError as exc:
            if not self._session_was_lost(exc):
                raise self._refusal(exc) from None
        # This thread's PostgreSQL session was lost (the server restarted since it last read): the
        # read, which wrote nothing, is made once more, on a new session (`db.ThreadReaders`).
        try:
            return getattr(self, f"op_{op}")(**args)
        except sqlite3.DatabaseError as exc:
            raise self._refusal(exc) from None

    def _session_was_lost(self, exc: sqlite3.DatabaseError) -> bool:
        return faults.classify(exc) is faults.Kind.UNAVAILABLE and self.readers.lost()

    def _refusal(self, exc: sqlite3.DatabaseError) -> Exception:
        return faults.reader_refusal(exc, self.sup.report_corruption)

    def _checked(self, pages: Iterator[list[dict[str, Any]]]) -> Iterator[list[dict[str, Any]]]:
        try:
            yield from pages
        except sqlite3.DatabaseError as exc:
            raise self._refusal(exc) from None

    # --- what the running daemon knows ------------------------------------------------------------

    def _daemon_facts(self) -> dict[str, Any]:
        sup = self.sup
        return {
            "pid": os.getpid(),
            "uptime": round(sup.clock() - sup.started_at, 3),
            "busy_workers": len(sup.running),
            "database_fault": None if (fault := sup.fault) is None else fault.summary(sup.clock()),
            "database_faults": sup.database_faults,
        }

    def _queue_workers(self) -> Mapping[str, int]:
        return {name: self.sup.queues.workers[name] for name in self.sup.queues.names}

    def _busy_by_queue(self) -> Mapping[str, int]:
        return self.sup.busy_by_queue()

    def _paused_queues(self) -> Collection[str]:
        return self.sup.queues.paused

    def _registry(self) -> Registry:
        return self.sup.registry

    def _log_may_grow(self, task: models.Task) -> bool:
        return not task.status.is_terminal

    # --- reads that wait for the loop's commits -------------------------------------------------

    def op_wait(self, ids: list[str], timeout: float | None = None) -> protocol.WaitReply:
        """The tasks named (a run's id names its tasks) once all have ended, or as they are when
        `timeout` (at most WAIT_SLICE) has passed. Waits on this handler thread, woken by the
        loop's commits: it holds neither the loop nor the database. A wake-up reads only the
        first task still active: the others need not be looked at before it has ended."""
        from daemon import handoff  # loaded by the daemon already; not for the CLI's reads

        limit = WAIT_SLICE if timeout is None else max(0.0, min(timeout, WAIT_SLICE))
        deadline = time.monotonic() + limit
        seen = self.sup.commits()  # before reading: a commit after the read wakes the wait
        found = self._tasks_named(ids)
        read_at = seen  # the commit count when found[position] was read
        position = 0  # tasks before it have ended (ended tasks never change again)
        conn = self._reader()
        while True:
            # Past the tasks that have ended, reading each again only once those before it have.
            while position < len(found):
                if not TaskStatus(found[position]["status"]).is_terminal:
                    seen = self.sup.commits()
                    if read_at == seen:
                        break  # read since the last commit: still active
                    now = tasks.find(conn, found[position]["id"])
                    found[position], read_at = (found[position] if now is None else now.to_dict()), seen
                    if not TaskStatus(found[position]["status"]).is_terminal:
                        break
                position += 1
                read_at = -1  # the next one was read before: read it again
            remaining = deadline - time.monotonic()
            if position == len(found) or remaining <= 0 or not handoff.requester_waiting():
                break
            # Capped: a client that hangs up is noticed within a second, not at the deadline.
            self.sup.wait_for_commit(seen, min(remaining, 1.0))
        for index in range(position, len(found)):  # the rest as they are now
            now = tasks.find(conn, found[index]["id"])
            if now is not None:
                found[index] = now.to_dict()
        return {"tasks": found, "ended": position == len(found)}

    def _tasks_named(self, targets: list[str]) -> list[dict[str, Any]]:
        conn = self._reader()
        found: list[dict[str, Any]] = []
        for target in targets:
            named = id_store.resolve(conn, target)
            if named.kind == "task":
                found.append(tasks.get(conn, named.id).to_dict())
            else:
                found += [t.to_dict() for t in task_reads.list_tasks(conn, run_id=named.id)]
        return found

    # --- mutations, run on the supervisor's loop thread -----------------------------------------

    def op_queue_pause(self, name: str) -> dict[str, Any]:
        return {"name": name, "changed": self.sup.set_queue_paused(name, True)}

    def op_queue_resume(self, name: str) -> dict[str, Any]:
        return {"name": name, "changed": self.sup.set_queue_paused(name, False)}

    def op_queue_workers(self, name: str, workers: int) -> dict[str, Any]:
        self.sup.set_queue_workers(name, workers)
        return {"name": name, "workers": workers}

    def op_submit(self, tasks: Any, template: str = "adhoc", material_id: str | None = None) -> protocol.SubmitReply:
        if not isinstance(tasks, list):
            raise FredicaError("tasks must be a list of task objects")
        specs = []
        for number, item in enumerate(tasks, start=1):
            try:
                specs.append(parse_spec(item))
            except FredicaError as exc:
                prefix = f"task {number}: " if len(tasks) > 1 else ""
                raise type(exc)(prefix + exc.message) from None
        submission = self.sup.submit(specs, template=template, material_id=material_id)
        return {
            "run_id": submission.run_id,
            "tasks": [{"id": t.id, "created": t.created} for t in submission.tasks],
        }

    def op_run(self, template: str, material_id: str | None = None, params: Any = None) -> protocol.SubmitReply:
        known = self.settings.templates
        if not known:
            raise FredicaError("no workflow templates are configured")
        if template not in known:
            raise FredicaError(f"unknown template {template!r}; configured: {', '.join(sorted(known))}")
        params = params or {}
        if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
            raise FredicaError("params must map names to strings")
        specs = known[template].instantiate(params)
        submission = self.sup.submit(specs, template=template, material_id=material_id)
        return {
            "run_id": submission.run_id,
            "tasks": [{"id": t.id, "created": t.created} for t in submission.tasks],
        }

    def op_clean(self, older_than: float, status: str | None = None, dry_run: bool = False) -> protocol.CleanReply:
        """Remove the runs finished more than `older_than` seconds ago (SPEC §14), a chunk at a
        time on the loop, each chunk's logs once it is committed; for at most CLEAN_SLICE
        seconds, then `done` is False and the client asks again."""
        if older_than < 0:
            raise protocol.ProtocolError("older_than must be 0 or more seconds")
        if status is not None and status not in cleaning.FINISHED:
            raise protocol.ProtocolError(
                f"unknown status {protocol.shown(status)}: runs are cleaned when {', '.join(cleaning.FINISHED)}")
        sup = self.sup
        cutoff = sup.clock() - older_than
        if dry_run:
            found = cleaning.preview(self._reader(), cutoff=cutoff, status=status)
            logs = sum(any(os.path.exists(f"{path}{end}") for end in ("", ".1"))
                       for path in map(self.settings.task_log, found.task_ids))
            return {"runs": found.runs, "tasks": found.tasks, "logs": logs, "done": True}
        from daemon import handoff  # as in op_wait: not for the CLI's reads

        deadline = time.monotonic() + CLEAN_SLICE
        runs_removed = tasks_removed = logs = 0
        while True:
            removed = sup.call(lambda: cleaning.remove_chunk(sup.conn, cutoff=cutoff, status=status,
                                                             limit=cleaning.CHUNK))
            runs_removed, tasks_removed = runs_removed + removed.runs, tasks_removed + removed.tasks
            logs += engine_cleaning.remove_logs(self.settings.task_log, removed.task_ids)
            if not removed.more or time.monotonic() >= deadline or not handoff.requester_waiting():
                return {"runs": runs_removed, "tasks": tasks_removed, "logs": logs, "done": not removed.more}


class _ThreadReader:
    """The handlers' read connection of whichever thread runs a query: a streamed reply's frames
    are made by whichever handler thread is free, and a connection stays on its own thread."""

    def __init__(self, handlers: Reads) -> None:
        self._handlers = handlers

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self._handlers._reader().execute(sql, params)


def _check_task_statuses(status: str | list[str] | None) -> None:
    for name in [status] if isinstance(status, str) else status or ():
        if name not in models.TASK_FILTER_WORDS:
            raise protocol.ProtocolError(f"unknown status {protocol.shown(name)}")


def _check_statuses(status: str | list[str] | None, kind: type[RunStatus]) -> None:
    for name in [status] if isinstance(status, str) else status or ():
        if name not in {member.value for member in kind}:
            raise protocol.ProtocolError(f"unknown status {protocol.shown(name)}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise protocol.ProtocolError("limit must be a non-negative integer")
