"""What each request of the control protocol does: one handler per operation.

Reads use a read-only connection of the serving thread, so a long `ls` never stalls the loop;
mutations are handed to the supervisor's loop thread (`Supervisor.call`), which alone writes the
database. Every argument is checked against its handler's annotation before the handler runs, so
that nothing of the wrong type reaches SQLite (which would answer with an internal error).
"""

from __future__ import annotations

import inspect
import os
import sqlite3
import threading
from typing import Any, Callable

from daemon import faults, protocol, recovery
from daemon.errors import FredicaError, UnknownTask
from daemon.models import RunStatus, TaskStatus
from daemon.store import db, restarts, runs, tasks
from daemon.store import queues as queue_store
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor


class Handlers:
    """One method per request type; each returns the reply's data or raises a FredicaError."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self.settings = supervisor.settings
        self._local = threading.local()

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = db.connect(self.settings.database)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
        return conn

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        check_arguments(op, args)
        try:
            return getattr(self, f"op_{op}")(**args)
        except sqlite3.DatabaseError as exc:
            if faults.classify(exc) is not faults.Kind.CORRUPT:
                raise
            # A reader met it first: the daemon must not go on answering while tasks run on a
            # database it can no longer trust (SPEC §13).
            self.sup.report_corruption(exc)
            raise faults.refusal(faults.Kind.CORRUPT) from None

    # --- reads ----------------------------------------------------------------------------------

    def op_status(self) -> dict[str, Any]:
        sup = self.sup
        return {
            "pid": os.getpid(),
            "uptime": round(sup.clock() - sup.started_at, 3),
            # Every queue's workers (the config's max_workers when no other queue is set).
            "max_workers": sup.queues.total_workers,
            "busy_workers": len(sup.running),
            "queues": {row.pop("name"): row for row in self.op_queues()},
            "counts": tasks.count_by_status(self._reader()),
            "database": str(self.settings.database),
            "socket": str(self.settings.socket),
            "log_dir": str(self.settings.log_dir),
            # While the database cannot be written: what the fault is (None: none).
            "database_fault": None if (fault := sup.fault) is None else fault.summary(sup.clock()),
            "database_faults": sup.database_faults,
        }

    def op_ls(self, status: str | list[str] | None = None, run: str | None = None, type: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        _check_statuses(status, TaskStatus)
        _check_limit(limit)
        found = tasks.list_tasks(self._reader(), status=status, run_id=run, task_type=type, limit=limit)
        return [t.to_dict() for t in found]

    def op_runs(self, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        _check_statuses(status, RunStatus)
        _check_limit(limit)
        return [r.to_dict() for r in runs.list_runs(self._reader(), status=status, limit=limit)]

    def op_show(self, id: str) -> dict[str, Any]:
        conn = self._reader()
        task = tasks.find(conn, id)
        if task is not None:
            return {"kind": "task", "object": task.to_dict()}
        run = runs.find(conn, id)
        if run is None:
            raise UnknownTask(f"no task or workflow run has id {id}")
        obj = run.to_dict()
        obj["tasks"] = [t.to_dict() for t in tasks.list_tasks(conn, run_id=id)]
        return {"kind": "run", "object": obj}

    def op_log_path(self, id: str | None = None) -> dict[str, Any]:
        if id is None:
            return {"path": str(self.settings.daemon_log), "active": True, "json_lines": True}
        task = tasks.get(self._reader(), id)
        return {"path": str(self.settings.task_log(task.id)), "active": not task.status.is_terminal,
                "json_lines": False}

    def op_restarts(self, all: bool = False) -> list[dict[str, Any]]:
        return [e.to_dict() for e in restarts.list_entries(self._reader(), include_resolved=all)]

    def op_queues(self) -> list[dict[str, Any]]:
        sup = self.sup
        busy = sup.busy_by_queue()
        waiting = queue_store.waiting(self._reader())
        return [
            {"name": name, "workers": sup.queues.workers[name], "busy": busy.get(name, 0),
             "waiting": waiting.get(name, 0), "paused": name in sup.queues.paused}
            for name in sup.queues.names
        ]

    # --- mutations, run on the supervisor's loop thread -----------------------------------------

    def op_queue_pause(self, name: str) -> dict[str, Any]:
        return {"name": name, "changed": self.sup.set_queue_paused(name, True)}

    def op_queue_resume(self, name: str) -> dict[str, Any]:
        return {"name": name, "changed": self.sup.set_queue_paused(name, False)}

    def op_queue_workers(self, name: str, workers: int) -> dict[str, Any]:
        self.sup.set_queue_workers(name, workers)
        return {"name": name, "workers": workers}

    def op_submit(self, tasks: Any, template: str = "adhoc", material_id: str | None = None) -> dict[str, Any]:
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

    def op_run(self, template: str, material_id: str | None = None, params: Any = None) -> dict[str, Any]:
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

    def op_cancel(self, id: str) -> dict[str, Any]:
        report = self.sup.cancel(id)
        return {"cancelled": list(report.cancelled), "stopping": list(report.stopping)}

    def op_pause(self, id: str) -> dict[str, Any]:
        return self.sup.pause(id).to_dict()

    def op_resume(self, id: str) -> dict[str, Any]:
        return self.sup.resume(id).to_dict()

    def op_restarts_dismiss(self, id: int) -> dict[str, Any]:
        sup = self.sup
        return sup.call(lambda: restarts.resolve(sup.conn, id, "dismissed", now=sup.clock())).to_dict()

    def op_restarts_recreate(self, id: int) -> dict[str, Any]:
        sup = self.sup
        submission = sup.call(lambda: recovery.recreate(sup.conn, id, now=sup.clock(), routes=sup.queues.routes,
                                                        queue_names=sup.queues.names))
        sup.wake()
        return {"run_id": submission.run_id, "tasks": [t.id for t in submission.tasks]}


def _check_statuses(status: str | list[str] | None, kind: type[TaskStatus] | type[RunStatus]) -> None:
    for name in [status] if isinstance(status, str) else status or ():
        if name not in {member.value for member in kind}:
            raise protocol.ProtocolError(f"unknown status {protocol.shown(name)}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise protocol.ProtocolError("limit must be a non-negative integer")


def _integer(value: Any) -> bool:
    # bool is an int in Python, and SQLite binds only 64-bit integers.
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


# The JSON types an annotation may name, each with its test.
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda value: isinstance(value, str),
    "int": _integer,
    "bool": lambda value: isinstance(value, bool),
    "None": lambda value: value is None,
    "list[str]": lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value),
}


class _Argument:
    """What one handler argument may be: its annotation's JSON types, and whether it is required."""

    def __init__(self, parameter: inspect.Parameter) -> None:
        self.annotation = str(parameter.annotation)  # a string: `from __future__ import annotations`
        self.required = parameter.default is inspect.Parameter.empty
        parts = self.annotation.split("|")
        self.tests = None if self.annotation == "Any" else [_JSON_TYPES[part.strip()] for part in parts]

    def accepts(self, value: Any) -> bool:
        return self.tests is None or any(test(value) for test in self.tests)


def _argument_table() -> dict[str, dict[str, _Argument]]:
    """For each op, its handler's arguments, read once from the annotations; an annotation this
    does not know fails here, at import, not on a client's request."""
    return {
        name[3:]: {argument: _Argument(p) for argument, p in inspect.signature(handler).parameters.items()
                   if argument != "self"}
        for name, handler in vars(Handlers).items()
        if name.startswith("op_")
    }


ARGUMENTS = _argument_table()


def check_arguments(op: str, args: dict[str, Any]) -> None:
    """Refuse an unknown or missing argument, or one of the wrong JSON type, with one clear line."""
    expected = ARGUMENTS[op]
    for name, argument in expected.items():
        if argument.required and name not in args:
            raise protocol.ProtocolError(f"bad arguments for {op}: {name} is required")
    for name, value in args.items():
        argument = expected.get(name)
        if argument is None:
            raise protocol.ProtocolError(f"{op} does not take {protocol.shown(name)}")
        if not argument.accepts(value):
            raise protocol.ProtocolError(
                f"bad arguments for {op}: {name} must be {argument.annotation}, not {protocol.described(value)}"
            )
