"""`/metrics` in Prometheus's text format, through prometheus-client.

Counts are read when Prometheus scrapes (`FredicaCollector`), from indexes and from what the
supervisor keeps in memory, rather than kept in gauges moved on every transition: a scrape every
15 s costs less than a write per task change. Only attempt durations need to be caught as they
happen: the supervisor calls `AttemptDurations.observe` after an attempt's outcome is committed.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterator

import structlog
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from daemon import faults
from daemon.store import db, live

log = structlog.get_logger("fredica.http")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: from a quick SHELL task to a transcode of hours.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)


class FredicaCollector:
    """What the daemon is doing, read at scrape time."""

    def __init__(self, supervisor: Any, changes: Any) -> None:
        self.sup = supervisor
        self.changes = changes  # the live feed (events.TaskChanges)
        self._reader = db.ThreadReaders(self.sup.settings.database)


    def _tallies(self) -> tuple[list[tuple[str, str, int]], dict[str, int]] | None:
        """The tasks by status and queue and the restart log by disposition; None while the
        database cannot be reached (a PostgreSQL server away), when a scrape must still say what
        the daemon knows in memory: that it rides a fault out, first of all."""
        try:
            return self._reader.read(lambda conn: (live.tasks_by_status_and_queue(conn),
                                                   live.restart_entries_by_disposition(conn)))
        except sqlite3.DatabaseError as exc:
            if faults.classify(exc) is faults.Kind.UNAVAILABLE:
                log.warning("metrics_database_unavailable", error=str(exc))
                return None
            raise faults.reader_refusal(exc, self.sup.report_corruption) from None

    def collect(self) -> Iterator[Metric]:
        sup = self.sup
        tallies = self._tallies()
        if tallies is not None:
            by_status = GaugeMetricFamily("fredica_tasks", "Tasks stored, by status and queue",
                                          labels=["status", "queue"])
            for status, queue, count in tallies[0]:
                by_status.add_metric([status, queue], count)
            yield by_status
        busy = sup.busy_by_queue()
        workers = GaugeMetricFamily("fredica_workers", "Worker slots, by queue", labels=["queue"])
        busy_workers = GaugeMetricFamily("fredica_busy_workers", "Workers running an attempt, by queue",
                                         labels=["queue"])
        for name in sup.queues.names:
            workers.add_metric([name], sup.queues.workers[name])
            busy_workers.add_metric([name], busy.get(name, 0))
        yield workers
        yield busy_workers
        finished = CounterMetricFamily("fredica_tasks_finished", "Tasks that ended since the daemon started, by status",
                                       labels=["status"])
        for status, count in sup.finished_counts.items():
            finished.add_metric([str(status)], count)
        yield finished
        if tallies is not None:
            restarts = GaugeMetricFamily("fredica_restart_log_entries", "Restart-log entries, by disposition",
                                         labels=["disposition"])
            for disposition, count in tallies[1].items():
                restarts.add_metric([disposition], count)
            yield restarts
        yield CounterMetricFamily("fredica_database_faults", "Database write faults ridden out since start",
                                  value=sup.database_faults)
        yield GaugeMetricFamily("fredica_database_fault_active", "1 while the database cannot be written",
                                value=0 if sup.fault is None else 1)
        yield GaugeMetricFamily("fredica_http_event_streams", "Open /api/v1/events streams",
                                value=self.changes.subscribers)
        yield CounterMetricFamily("fredica_http_event_looks", "Reads of the database for the event streams, all shared",
                                  value=self.changes.looks)
        yield GaugeMetricFamily("fredica_uptime_seconds", "Seconds since the daemon started",
                                value=sup.clock() - sup.started_at)


class Metrics:
    """The daemon's registry: the collector and the attempt-duration histogram."""

    def __init__(self, supervisor: Any, changes: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FredicaCollector(supervisor, changes))  # type: ignore[arg-type]
        self.durations = Histogram("fredica_attempt_duration_seconds", "How long attempts ran, by task type",
                                   ["type"], registry=self.registry, buckets=DURATION_BUCKETS)

    def observe_attempt(self, attempt: Any) -> None:
        """An attempt's outcome was committed (called on the supervisor's loop thread: cheap)."""
        if attempt.ended_at is not None:
            self.durations.labels(attempt.task.type).observe(max(0.0, attempt.ended_at - attempt.started_at))

    def text(self) -> bytes:
        return generate_latest(self.registry)
