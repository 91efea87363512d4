"""This supervisor's lease on a shared PostgreSQL queue, and the rescue of others' (SPEC §16).

The lease is a database's single-owner lock where a file lock cannot reach (several hosts): taken
at start before anything else (`take`: a second live supervisor of the same name is refused with
one line), renewed by the loop every heartbeat_interval in its tick's transaction (`Lease.tick`),
given up at a graceful stop. Twice a second (RESCUE_LOOK_INTERVAL) the loop also looks for leases
that have expired, and rescues their supervisors' tasks (`store.supervisors.rescue`): a dead
supervisor's tasks are taken up within a second of its lease's end, not at the next renewal
(5 s by default), for one SELECT of the small supervisor table.

After a lost connection (a server restart) everyone's lease may have run out meanwhile: a
supervisor that has just reconnected rescues no one for one lease_timeout, so that the others,
reconnecting too, have the time to renew theirs before they are taken for dead.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import uuid

import structlog

from daemon import faults, processes
from daemon.config import Settings
from daemon.errors import AlreadyRunning
from daemon.store import db, supervisors

log = structlog.get_logger("fredica.leases")

HOST = socket.gethostname()
RESCUE_LOOK_INTERVAL = 0.5  # seconds between looks for expired leases (at most heartbeat_interval)


def _gone(row: supervisors.SupervisorRow) -> bool:
    """Whether the process a supervisor row names is known dead: only a process of this host can
    be looked at (by pid and start time, as recovery finds leftover executors)."""
    if row.host != HOST:
        return False
    if row.pid == os.getpid():
        return True  # this very process, taking its name again after its lease was lost
    return row.pid_started_at is None or processes.find_leftover(row.pid, row.pid_started_at) is None


def _register(conn: sqlite3.Connection, settings: Settings) -> None:
    supervisors.register(
        conn, settings.name, host=HOST, pid=os.getpid(), pid_started_at=processes.start_time(os.getpid()),
        lease_timeout=settings.lease_timeout, gone=_gone,
    )


def take(settings: Settings) -> None:
    """At start, before the control socket is bound: the lease of `settings.name` on its
    database (migrated first), on a connection of its own. AlreadyRunning if another live
    supervisor holds it."""
    conn = db.open_database(settings.database)
    try:
        processes.anchor_to(conn)  # the start time it records is counted as recovery counts them
        _register(conn, settings)
    finally:
        conn.close()


class Lease:
    """The loop's side of the lease: when to renew it and look for expired ones next, and the
    rescues each look does."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.next_at = 0.0  # the first tick renews it (the earlier of the two below)
        self._renew_at = 0.0
        self._look_at = 0.0
        self.rescue_from = 0.0  # no rescue before (the grace after a reconnection)

    def tick(self, conn: sqlite3.Connection, now: float) -> list[supervisors.Rescue]:
        """Renew the lease if due; look for expired leases if due and rescue their supervisors;
        inside the loop's transaction. A database fault is raised (the tick is rolled back and
        retried); a bug of ours is logged, and tried again a heartbeat_interval later."""
        if now < self.next_at:
            return []
        heartbeat = self.settings.heartbeat_interval
        renew = now >= self._renew_at
        if renew:
            self._renew_at = now + heartbeat
        self._look_at = now + min(RESCUE_LOOK_INTERVAL, heartbeat)
        self.next_at = min(self._renew_at, self._look_at)
        failed = "lease_renewal_failed"
        try:
            if renew:
                with db.savepoint(conn):
                    self._renew(conn)
            failed = "lease_look_failed"
            if now < self.rescue_from:
                return []
            return self._rescue_expired(conn, now)
        except Exception as exc:
            if faults.classify(exc) is not None:
                raise
            # Not twice a second: a bug's traceback once a heartbeat, as before the looks.
            log.exception(failed, supervisor=self.settings.name)
            self._look_at = now + heartbeat
            self.next_at = min(self._renew_at, self._look_at)
            return []

    def _renew(self, conn: sqlite3.Connection) -> None:
        name = self.settings.name
        if supervisors.renew(conn, name, host=HOST, pid=os.getpid()):
            return
        # Taken for dead (the database was out of reach longer than the lease): its tasks were
        # rescued, and the late writes of their attempts are refused (fenced). It goes on.
        try:
            _register(conn, self.settings)
        except AlreadyRunning as exc:
            log.error("lease_held_by_another", supervisor=name, error=exc.message)
            return
        log.warning("lease_lost", supervisor=name, action="taken again; tasks rescued meanwhile stay as rescued")

    def _rescue_expired(self, conn: sqlite3.Connection, now: float) -> list[supervisors.Rescue]:
        rescued = []
        for name in supervisors.expired(conn, besides=self.settings.name):
            with db.savepoint(conn):  # one rescue, whole or not at all
                rescue = supervisors.rescue(conn, name, now=now, session_id=str(uuid.uuid4()))
            if rescue is None:
                continue  # renewed meanwhile, or being rescued by another supervisor
            log.warning("supervisor_rescued", supervisor=name, by=self.settings.name,
                        interrupted=[t.id for t in rescue.interrupted], requeued=[t.id for t in rescue.requeued])
            rescued.append(rescue)
        return rescued

    def rolled_back(self) -> None:
        """The tick's transaction was rolled back, and its renewal with it: renew at the next."""
        self.next_at = self._renew_at = 0.0

    def reconnected(self, now: float) -> None:
        """A new session after a lost one: renew at once, rescue no one for a lease_timeout."""
        self.next_at = self._renew_at = 0.0
        self.rescue_from = now + self.settings.lease_timeout

    def release(self, conn: sqlite3.Connection) -> None:
        """At a graceful stop: give the lease up (kept while tasks of ours are still in flight)."""
        with contextlib.suppress(sqlite3.Error):
            supervisors.release(conn, self.settings.name, host=HOST, pid=os.getpid())
