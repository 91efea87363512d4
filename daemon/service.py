"""`fredica daemon`: config, single-owner lock, recovery, control socket, then the supervisor loop.

Order matters (SPEC §9): the socket is bound and listening before recovery, so clients that
connect meanwhile queue up and wait, but it answers nothing until recovery has finished.

The single-owner lock is a file lock beside a SQLite database; on PostgreSQL, where supervisors
of several hosts share the database, it is this supervisor's lease (`daemon.leases`), which is
refused to a second live supervisor of the same name, and recovery then touches only the tasks
of this name (SPEC §16).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import IO, Iterator

import structlog

from daemon import config, logs, paths
from daemon.store import backend
from daemon.errors import FredicaError, AlreadyRunning, CannotStart  # noqa: F401 (re-exported: this module's errors live in the catalogue)

log = structlog.get_logger("fredica.daemon")




@contextlib.contextmanager
def _starting(what: str, *, database: Path | str | None = None) -> Iterator[None]:
    """Turn what the system says about a step of the start into CannotStart("<what>: <why>");
    for a step that opens the database, a SQLite error says so, naming `database`."""
    try:
        yield
    except sqlite3.Error as exc:
        if database is None:
            raise CannotStart(f"{what}: {exc}") from None
        raise CannotStart(f"cannot open the database {backend.shown(database)}: {exc}") from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise CannotStart(f"{what}: {why}" + (f" ({exc.filename})" if exc.filename else "")) from None
    except ValueError as exc:
        raise CannotStart(f"{what}: {exc}") from None


class DatabaseLock:
    """An exclusive flock on `<database>.lock`, holding the owner's pid for the refusal message.

    The kernel drops the lock when the process dies, however it dies, so a kill -9 never leaves
    a stale lock behind.
    """

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".lock")
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        paths.private_dir(self.path.parent)
        try:
            handle = open(self.path, "a+")
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            database = self.path.with_suffix("")
            raise CannotStart(
                f"the database {database} cannot be written ({exc.strerror}: {self.path}): make it, its "
                f"lock file and the directory {self.path.parent} writable for the daemon's user"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise AlreadyRunning(
                f"another fredica daemon (pid {owner}) already owns the database {self.path.with_suffix('')}"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def main(config_path: str | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT; the process exit status."""
    try:
        settings = config.load(config_path)
    except FredicaError as exc:
        print(f"fredica: {exc.message}", file=sys.stderr)
        return 1
    shared = backend.is_postgres(settings.database)
    lock = None if shared else DatabaseLock(Path(settings.database))
    try:
        with _starting(f"cannot write the daemon log in {settings.log_dir}"):
            logs.configure(settings.daemon_log)
        if lock is not None:
            with _starting(f"cannot lock the database {settings.database}"):
                lock.acquire()
        else:
            from daemon import leases

            with _starting("cannot take this supervisor's lease", database=settings.database):
                leases.take(settings)
    except FredicaError as exc:
        print(f"fredica: {exc.message}", file=sys.stderr)
        return 1
    try:
        return _serve(settings)
    except FredicaError as exc:
        print(f"fredica: {exc.message}", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.release()


def _children_skip_the_cli() -> None:
    """Keep multiprocessing from running the `fredica` console script again in every executor
    process it starts.

    multiprocessing runs the parent's main script again, as __mp_main__, in each child it starts
    with "forkserver" or "spawn", unless that script is a package's __main__ module. Started as
    the console script, that would import the whole CLI (click, the config, the renderer) into
    every launcher, and each attempt's fork of it pays for those pages: ~0.3 ms of CPU per fork
    here (benchmarks/fork_floor.py, "launcher" against "executor"). The console script is
    `python -m daemon` in all but name (daemon/__main__.py runs the same `main`), so it is given
    that module's spec. A script of one's own keeps its behaviour (its children may need what it
    defines): only a main module that holds nothing but the installer's template is touched.
    """
    from daemon import cli

    main_module = sys.modules.get("__main__")
    if main_module is None or getattr(main_module, "__spec__", None) is not None:
        return  # `python -m daemon` (skipped already), or started some other way
    names = {name for name in vars(main_module) if not name.startswith("__")}
    # pip's console script: `import re, sys; from daemon.cli import main; sys.exit(main())`.
    if getattr(main_module, "main", None) is cli.main and names <= {"re", "sys", "main"}:
        main_module.__spec__ = importlib.util.find_spec("daemon.__main__")


def _serve(settings: config.Settings) -> int:
    # Imported here: `fredica status` and friends import this module's package but never need these.
    from daemon import control, faults, operations, recovery
    from daemon.notify import Notifier
    from daemon.engine.requests import CALL_TIMEOUT
    from daemon.supervisor import Supervisor

    _children_skip_the_cli()
    server = control.ControlServer(settings.socket, lambda op, args: handlers.handle(op, args),
                                   request_timeout=settings.request_timeout)
    with _starting(f"cannot listen on {settings.socket}"):
        server.bind()
    http = None
    supervisor: Supervisor | None = None

    def supervisor_ended_corrupt() -> bool:
        return supervisor is not None and supervisor.exit_status != 0  # 1 only after corruption

    try:
        notifier = Notifier()
        with _starting("cannot start the supervisor", database=settings.database):
            supervisor = Supervisor(settings, notifier=notifier)
        handlers = operations.Handlers(supervisor)
        if settings.http_listen is not None:
            from daemon.web.server import HttpServer  # its libraries only when it is on

            with _starting(f"cannot start the HTTP server on {settings.http_listen[0]}:{settings.http_listen[1]}"):
                http = HttpServer(settings, handlers.handle, supervisor)

        def on_signal(signum: int, _frame: object) -> None:
            # Only set flags (the loop does the work); a second signal does not shorten the grace.
            supervisor.request_stop()

        # Before recovery: a SIGTERM that arrives during it ends the daemon cleanly right after.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        with _starting(f"startup recovery could not write the database {backend.shown(settings.database)}"):
            report = recovery.recover(supervisor.conn, now=time.time(), kill_grace=settings.cancel_grace,
                                      supervisor=settings.name if supervisor.lease is not None else None)
        recovery.undo_interrupted(supervisor.registry, report.interrupted_tasks)
        with _starting(f"re-routing waiting tasks could not write the database {backend.shown(settings.database)}"):
            supervisor.reroute_waiting(time.time())  # after recovery: the tasks it put back too

        # Clients that connected during recovery are answered from now on: their requests must
        # wait for the loop below, never run on their own threads while it starts.
        supervisor.bind_loop_thread()
        server.writes_to_loop(supervisor.hand_over, CALL_TIMEOUT)
        server.serve(driven=True)  # its I/O on the loop's thread: a write request costs no thread switch
        supervisor.attach_io(server)
        if http is not None:
            http.serve()
        notifier.ready(
            f"ready: recovered {report.interrupted} interrupted and {report.requeued} claimed tasks; "
            + supervisor.summary()
        )
        log.info("daemon_ready", pid=os.getpid(), socket=str(settings.socket), database=backend.shown(settings.database),
                 max_workers=settings.max_workers, supervisor=settings.name)
        supervisor.run()
    finally:
        if http is not None:
            http.close()
        # Ended by corruption: a request arriving now is told so, not that the daemon stops.
        server.close(faults.refusal(faults.Kind.CORRUPT) if supervisor_ended_corrupt() else None)
    assert supervisor is not None  # a failed start raised out of the try
    log.info("daemon_stopped", exit_status=supervisor.exit_status)
    return supervisor.exit_status
