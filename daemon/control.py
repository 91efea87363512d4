"""The control socket: a Unix socket server with one handler per request type.

The socket lives in a private directory (created 0700) and is itself 0600; on top of that every
connection's peer credentials are checked, so only the daemon's own user and root are answered.
Each connection is served by its own thread: one request, one reply, close. Mutations are handed
to the supervisor's loop thread (`Supervisor.call`), which alone writes the database; reads use a
read-only connection of the serving thread, so a long `ls` never stalls the loop.
"""

from __future__ import annotations

import inspect
import os
import select
import socket
import sqlite3
import stat
import struct
import threading
from pathlib import Path
from typing import Any, Callable

import structlog

from daemon import handoff, paths, protocol, recovery
from daemon.errors import FredicaError, UnknownTask
from daemon.store import db, restarts, runs, tasks
from daemon.submission import parse_spec
from daemon.supervisor import Supervisor

log = structlog.get_logger("fredica.control")
READ_TIMEOUT = 10.0  # a client that sends half a frame and stalls is dropped after this long
MAX_CLIENTS = 64  # connections served at once (a thread each)
ACCEPT_BACKOFF = 0.1  # seconds to wait after accept() failed (EMFILE: no descriptor left)
PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return uid


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
        _check_argument_types(op, args)
        return getattr(self, f"op_{op}")(**args)

    # --- reads ----------------------------------------------------------------------------------

    def op_status(self) -> dict[str, Any]:
        sup = self.sup
        return {
            "pid": os.getpid(),
            "uptime": round(sup.clock() - sup.started_at, 3),
            "max_workers": self.settings.max_workers,
            "busy_workers": len(sup.running),
            "counts": tasks.count_by_status(self._reader()),
            "database": str(self.settings.database),
            "socket": str(self.settings.socket),
            "log_dir": str(self.settings.log_dir),
        }

    def op_ls(self, status: Any = None, run: str | None = None, type: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        if limit is not None and limit < 0:
            raise FredicaError("limit must be a non-negative integer")
        found = tasks.list_tasks(self._reader(), status=status, run_id=run, task_type=type, limit=limit)
        return [t.to_dict() for t in found]

    def op_runs(self, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
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
        return [e.to_dict() for e in restarts.list_entries(self._reader(), include_resolved=bool(all))]

    # --- mutations, run on the supervisor's loop thread -----------------------------------------

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
        submission = self.sup.submit(specs, template=str(template), material_id=material_id)
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
        submission = sup.call(lambda: recovery.recreate(sup.conn, id, now=sup.clock()))
        sup.wake()
        return {"run_id": submission.run_id, "tasks": [t.id for t in submission.tasks]}


def _argument_types() -> dict[str, dict[str, tuple[str, tuple[type, ...]]]]:
    """For each op, its arguments' JSON types, read once from its handler's annotations (strings:
    `from __future__ import annotations`); "Any" is left to the handler. An annotation this does
    not know fails here, at import, not on a client's request."""
    known = {"str": (str,), "int": (int,), "bool": (bool,), "None": (type(None),)}
    table: dict[str, dict[str, tuple[str, tuple[type, ...]]]] = {}
    for name, handler in vars(Handlers).items():
        if name.startswith("op_"):
            table[name[3:]] = {
                argument: (str(p.annotation), tuple(t for part in str(p.annotation).split("|")
                                                    for t in known[part.strip()]))
                for argument, p in inspect.signature(handler).parameters.items()
                if argument != "self" and p.annotation != "Any"
            }
    return table


ARGUMENT_TYPES = _argument_types()


def _check_argument_types(op: str, args: dict[str, Any]) -> None:
    """Refuse an argument of the wrong JSON type with one clear line, before it reaches SQLite
    (which would answer with an internal error) or is stored as the text of a list."""
    expected = ARGUMENT_TYPES.get(op, {})
    for name, value in args.items():
        if name not in expected:
            continue  # "Any", or an unknown name, which the call itself refuses
        shown_type, allowed = expected[name]
        wrong = not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)
        if wrong or (isinstance(value, int) and not -(2**63) <= value < 2**63):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise protocol.ProtocolError(f"bad arguments for {op}: {name} must be {shown_type}, not {shown}")


def _still_connected(conn: socket.socket) -> bool:
    """Whether the client is still there, waiting for its answer: not if it has closed its socket
    (it gave up). One that only shut down its sending side (socat, `nc -N`) still reads the
    answer. A poll, never a read: the socket has a timeout, and a read would wait it out."""
    poller = select.poll()
    poller.register(conn.fileno(), 0)  # POLLHUP and POLLERR are always reported
    return not any(mask & (select.POLLHUP | select.POLLERR) for _, mask in poller.poll(0))


def _answers(path: Path) -> bool:
    """Whether something may be listening on the Unix socket at `path`: only a refused connection
    (or no socket any more) says it is stale. A full backlog (EAGAIN), a permission error or a
    timeout say someone is there."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


class ControlServer:
    """Listens on the control socket and serves each connection on a thread of its own."""

    def __init__(self, path: Path, handle: Callable[[str, dict[str, Any]], Any]) -> None:
        self.path = Path(path)
        self.handle = handle
        self.allowed_uids = {os.getuid(), 0}
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def bind(self) -> None:
        """Create the socket (listening, so clients queue while recovery runs); `serve` answers them."""
        directory = self.path.parent
        if not directory.exists():
            paths.private_dir(directory)
        elif stat.S_IMODE(directory.stat().st_mode) & 0o077:
            # Not fatal: the socket is 0600 and peers are checked. Changing the mode of a directory
            # the user chose (their home, /tmp) would be worse.
            log.warning("socket_directory_not_private", directory=str(directory))
        if self.path.exists() or self.path.is_symlink():
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise FredicaError(f"{self.path} exists and is not a socket: refusing to replace it")
            # The database lock says no daemon owns our database; one on another database may
            # still listen here (two configs naming one socket).
            if _answers(self.path):
                raise FredicaError(f"another daemon is listening on {self.path}: refusing to take its socket")
            self.path.unlink()  # stale: left by a daemon that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600, with no window where it is wider
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(128)
        self._sock = sock

    def serve(self) -> None:
        """Start answering in a background thread."""
        self._thread = threading.Thread(target=self._accept_loop, name="fredica-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        try:
            if self.path.exists() and stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(5)

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            # At most MAX_CLIENTS served at once; the others wait in the listen backlog.
            self._slots.acquire()
            try:
                conn, _ = self._sock.accept()
            except OSError:
                self._slots.release()
                if self._closing.is_set():
                    return
                # Out of file descriptors or memory: wait rather than spin on accept.
                self._closing.wait(ACCEPT_BACKOFF)
                continue
            try:
                threading.Thread(target=self._serve_one, args=(conn,), name="fredica-client", daemon=True).start()
            except RuntimeError:  # no thread to be had: drop this client, keep accepting
                conn.close()
                self._slots.release()
                log.warning("client_dropped", reason="cannot start a thread")
                self._closing.wait(ACCEPT_BACKOFF)

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                reply = self._reply_for(conn)
                protocol.write_frame(conn, reply, protocol.MAX_REPLY)
            except protocol.FrameTooLarge as exc:
                self._send_quietly(conn, protocol.error("ProtocolError", f"the reply is too large: {exc.message}"))
            except OSError:
                pass  # the client went away; nothing to tell it
            except Exception:  # a bug of ours: into the daemon's log, never its stderr
                log.exception("client_failed")
            finally:
                self._slots.release()

    def _reply_for(self, conn: socket.socket) -> dict[str, Any]:
        uid = peer_uid(conn)
        conn.settimeout(READ_TIMEOUT)
        if uid not in self.allowed_uids:
            log.warning("client_refused", uid=uid)
            # Let the client finish sending (its request is read, never acted on): closing first
            # would fail its write with EPIPE before it could read why it was refused.
            try:
                protocol.read_frame(conn, protocol.MAX_REQUEST)
            except (protocol.ProtocolError, OSError):
                pass
            return protocol.error("PermissionDenied", f"user {uid} may not control this daemon")
        try:
            message = protocol.read_frame(conn, protocol.MAX_REQUEST)
            op, args = protocol.parse_request(message)
        except socket.timeout:
            return protocol.error("ProtocolError", "incomplete request: timed out waiting for the rest")
        except protocol.ProtocolError as exc:
            log.warning("bad_request", error=exc.message)
            return protocol.error(type(exc).__name__, exc.message)
        try:
            with handoff.on_behalf_of(lambda: _still_connected(conn)):
                return protocol.ok(self.handle(op, args))
        except FredicaError as exc:
            return protocol.error(type(exc).__name__, exc.message)
        except TypeError as exc:  # arguments of the wrong shape for the handler
            return protocol.error("ProtocolError", f"bad arguments for {op}: {exc}")
        except Exception as exc:  # a bug of ours: report it, keep serving
            log.exception("request_failed", op=op)
            return protocol.error("InternalError", f"{op} failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _send_quietly(conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            protocol.write_frame(conn, reply, protocol.MAX_REPLY)
        except OSError:
            pass
