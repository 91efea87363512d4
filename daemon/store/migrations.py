"""Versioned, append-only schema migrations, tracked in `PRAGMA user_version`.

Never edit a migration that has shipped: add a new one. Each runs in one transaction together with
the bump of `user_version`, so a crash mid-migration leaves the previous version intact.
"""

from __future__ import annotations

import dataclasses
import sqlite3

from daemon.errors import MigrationError


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


# 1: the seed's three tables with the seed's column names. `seq` is an explicit INTEGER PRIMARY KEY
# (unlike a bare rowid, VACUUM never renumbers it) that records strict submission order.
SEED_TABLES = Migration(
    1,
    "seed tables",
    (
        """
        CREATE TABLE workflow_run (
            id TEXT PRIMARY KEY,
            material_id TEXT,
            template TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            total_tasks INTEGER NOT NULL DEFAULT 0,
            done_tasks INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            completed_at REAL
        )
        """,
        """
        CREATE TABLE task (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL,
            workflow_run_id TEXT NOT NULL REFERENCES workflow_run(id),
            material_id TEXT,
            status TEXT NOT NULL DEFAULT 'pending',
            priority INTEGER NOT NULL DEFAULT 0,
            depends_on TEXT NOT NULL DEFAULT '[]',
            payload TEXT NOT NULL DEFAULT '{}',
            result TEXT,
            error TEXT,
            error_type TEXT,
            idempotency_key TEXT,
            retry_count INTEGER NOT NULL DEFAULT 0,
            max_retries INTEGER NOT NULL DEFAULT 0,
            progress INTEGER NOT NULL DEFAULT 0,
            is_paused INTEGER NOT NULL DEFAULT 0,
            is_pausable INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            claimed_at REAL,
            started_at REAL,
            completed_at REAL,
            heartbeat_at REAL
        )
        """,
        "CREATE INDEX task_by_run ON task(workflow_run_id, status)",
        "CREATE INDEX task_by_status ON task(status)",
        """
        CREATE TABLE restart_task_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            task_type TEXT NOT NULL,
            workflow_run_id TEXT,
            material_id TEXT,
            status_at_restart TEXT NOT NULL,
            payload TEXT,
            progress INTEGER NOT NULL DEFAULT 0,
            disposition TEXT NOT NULL DEFAULT 'pending_review',
            new_workflow_run_id TEXT,
            created_at REAL NOT NULL,
            resolved_at REAL
        )
        """,
        "CREATE INDEX restart_task_log_by_disposition ON restart_task_log(disposition)",
    ),
)

# 2: what the scheduler needs to stay cheap however many tasks wait.
# - `task_dependency` holds the edges of `depends_on` (JSON stays the seed's record of them) and
#   `unmet_deps` counts a task's dependencies that are not completed yet, so claiming reads only
#   the partial index of ready tasks and never scans blocked ones.
# - per-status counters on `workflow_run` let a run's status follow every task change in O(1).
# - the partial unique index makes idempotency atomic: two active tasks cannot share a key.
SCHEDULING = Migration(
    2,
    "scheduling: dependency edges, ready index, run counters, active idempotency keys",
    (
        "ALTER TABLE task ADD COLUMN status_text TEXT",
        "ALTER TABLE task ADD COLUMN timeout REAL",
        "ALTER TABLE task ADD COLUMN not_before REAL NOT NULL DEFAULT 0",
        "ALTER TABLE task ADD COLUMN executor_pid INTEGER",
        "ALTER TABLE task ADD COLUMN executor_started_at REAL",
        "ALTER TABLE task ADD COLUMN unmet_deps INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_run ADD COLUMN pending_tasks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_run ADD COLUMN claimed_tasks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_run ADD COLUMN running_tasks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_run ADD COLUMN failed_tasks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_run ADD COLUMN cancelled_tasks INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TABLE task_dependency (
            depends_on_seq INTEGER NOT NULL REFERENCES task(seq),
            task_seq INTEGER NOT NULL REFERENCES task(seq),
            PRIMARY KEY (depends_on_seq, task_seq)
        ) WITHOUT ROWID
        """,
        """
        INSERT OR IGNORE INTO task_dependency (depends_on_seq, task_seq)
        SELECT upstream.seq, task.seq
        FROM task, json_each(task.depends_on) AS dep
        JOIN task AS upstream ON upstream.id = dep.value
        """,
        """
        UPDATE task SET unmet_deps = (
            SELECT count(*) FROM task_dependency AS d JOIN task AS upstream ON upstream.seq = d.depends_on_seq
            WHERE d.task_seq = task.seq AND upstream.status != 'completed'
        )
        """,
        """
        UPDATE workflow_run SET
            total_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id),
            pending_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'pending'),
            claimed_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'claimed'),
            running_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'running'),
            done_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'completed'),
            failed_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'failed'),
            cancelled_tasks = (SELECT count(*) FROM task WHERE workflow_run_id = workflow_run.id AND status = 'cancelled')
        """,
        # The seed checked idempotency keys before inserting, so two active tasks may share one.
        # Both were already queued; keep them, but leave the key only on the older one so the
        # unique index below can exist.
        """
        UPDATE task SET idempotency_key = NULL
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'claimed', 'running')
          AND seq > (SELECT min(seq) FROM task AS older
                     WHERE older.idempotency_key = task.idempotency_key
                       AND older.status IN ('pending', 'claimed', 'running'))
        """,
        # Claim order: priority DESC, then submission order. Only ready tasks are in this index.
        "CREATE INDEX task_ready ON task(priority DESC, seq) WHERE status = 'pending' AND unmet_deps = 0",
        """
        CREATE UNIQUE INDEX task_active_idempotency ON task(idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'claimed', 'running')
        """,
        "CREATE INDEX workflow_run_by_status ON workflow_run(status)",
    ),
)

# 3: tasks waiting out a retry delay leave the ready index. Claiming used to filter them out while
# walking the index in priority order, so thousands of delayed tasks of high priority made every
# claim slow. Now a delayed task sits in `task_delayed` until its time comes, when claiming
# promotes it (`not_before` back to 0) into `task_ready`.
DELAYED_RETRIES = Migration(
    3,
    "delayed retries out of the ready index",
    (
        "DROP INDEX task_ready",
        "CREATE INDEX task_ready ON task(priority DESC, seq) WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0",
        "CREATE INDEX task_delayed ON task(not_before) WHERE status = 'pending' AND not_before > 0",
    ),
)

# 4: the boot time each boot's process start times are counted from (daemon/processes.py), kept so
# that a change of the wall clock, or a restart of the daemon after one, moves none of them.
BOOT_TIMES = Migration(
    4,
    "boot times of recorded process starts",
    ("CREATE TABLE boot (boot_id TEXT PRIMARY KEY, boot_time REAL NOT NULL)",),
)

# 5: whether a task's payload names its dependencies' results ("{@0.output}", from a template),
# to fill in at dispatch. Before, every payload was searched, so a task submitted with such text
# of its own (or a template parameter holding it) failed, or read another task's result. Active
# tasks that may hold template placeholders keep having them filled.
PAYLOAD_REFS = Migration(
    5,
    "payloads that name upstream results",
    (
        "ALTER TABLE task ADD COLUMN payload_refs INTEGER NOT NULL DEFAULT 0",
        "UPDATE task SET payload_refs = 1 WHERE status IN ('pending', 'claimed', 'running')"
        " AND depends_on != '[]' AND instr(payload, '{@') > 0",
    ),
)

# 6: a restart used to supersede every entry still awaiting review, so the restart log emptied
# itself after two restarts. Now an entry is superseded only by a newer one for the same task
# (SPEC §9 step 4); the entries the old rule superseded, whose task has no newer entry, come back.
RESTART_LOG_KEPT = Migration(
    6,
    "restart-log entries kept until reviewed",
    (
        "CREATE INDEX restart_task_log_by_task ON restart_task_log(task_id, id)",
        """
        UPDATE restart_task_log SET disposition = 'pending_review', resolved_at = NULL
        WHERE disposition = 'superseded' AND NOT EXISTS (
            SELECT 1 FROM restart_task_log AS newer
            WHERE newer.task_id = restart_task_log.task_id AND newer.id > restart_task_log.id
        )
        """,
    ),
)

# 7: queues (SPEC §15). A task's queue is resolved when it is submitted (its `--queue`, else the
# queue its type is routed to) and stored, so that each queue's claim is a lookup in the ready
# index by queue, never a walk past other queues' tasks; `queue_explicit` says whether the
# submitter named it (a start with another config re-routes only the others, and those whose
# queue is gone). Tasks stored before go to `default` (re-routed at the next start).
# `queue_state` keeps which queues a user paused, across restarts.
QUEUES = Migration(
    7,
    "queues: each task's queue, the ready index by queue, paused queues",
    (
        "ALTER TABLE task ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE task ADD COLUMN queue_explicit INTEGER NOT NULL DEFAULT 0",
        "DROP INDEX task_ready",
        "CREATE INDEX task_ready ON task(queue, priority DESC, seq)"
        " WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0",
        # `fredica queues` and `status` count each queue's waiting tasks from this index alone.
        "CREATE INDEX task_waiting_by_queue ON task(queue) WHERE status IN ('pending', 'claimed')",
        "CREATE TABLE queue_state (name TEXT PRIMARY KEY, paused INTEGER NOT NULL, changed_at REAL NOT NULL)",
    ),
)

# 8: removing finished runs (`fredica clean`, `keep_finished`, daemon/store/cleaning.py). Their
# dependency edges are found by the dependent's end too (the primary key serves only the upstream
# end), and the runs old enough by their finish time, oldest first, without a scan of every run.
CLEANING = Migration(
    8,
    "cleaning: dependency edges by dependent, runs by finish time",
    (
        "CREATE INDEX task_dependency_by_task ON task_dependency(task_seq)",
        "CREATE INDEX workflow_run_finished ON workflow_run(completed_at) WHERE completed_at IS NOT NULL",
    ),
)

# 9: held tasks (SPEC §14). "Held" is a flag of a pending task, as "paused" is of a running one,
# not a status of its own: the run's status, the transitions and the counters stay as they are. A
# held task leaves the ready index, as a delayed retry does, so claiming never walks past held
# tasks however many there are; releasing it puts it back.
HELD_TASKS = Migration(
    9,
    "held tasks out of the ready index",
    (
        "ALTER TABLE task ADD COLUMN is_held INTEGER NOT NULL DEFAULT 0",
        "DROP INDEX task_ready",
        "CREATE INDEX task_ready ON task(queue, priority DESC, seq)"
        " WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0 AND is_held = 0",
        # `status` counts them, and `--status held` selects them, without reading every pending task.
        "CREATE INDEX task_held ON task(seq) WHERE status = 'pending' AND is_held = 1",
    ),
)

# 10: supervisors and their leases (SPEC §16). A task's row names the supervisor that claimed it
# (`supervisor`, kept after it ends) and counts its claims (`attempt`): every write about an
# attempt names both, so that a late write from a supervisor presumed dead, whose task was
# rescued and claimed again, changes nothing. `supervisor` holds one row per live supervisor of a
# shared (PostgreSQL) database, its lease renewed with the database's clock; on SQLite the one
# daemon is its file lock's owner, and the table stays empty. The partial index finds one
# supervisor's tasks in flight (a rescue, a start's recovery) without reading the others'.
SUPERVISORS = Migration(
    10,
    "supervisors, their leases, and the claimer and attempt of each task",
    (
        """
        CREATE TABLE supervisor (
            name TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            pid_started_at REAL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL,
            lease_timeout REAL NOT NULL
        )
        """,
        "ALTER TABLE task ADD COLUMN supervisor TEXT",
        "ALTER TABLE task ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX task_in_flight_by_supervisor ON task(supervisor) WHERE status IN ('claimed', 'running')",
    ),
)

# 11: a pause or resume asked of the supervisor that runs a task, by another one sharing its
# (PostgreSQL) database (SPEC §16): 1 pause, 0 resume, NULL nothing asked. The owner reads it when
# woken, acts on it as on its own user's request, and clears it; a start clears what an earlier
# attempt left unanswered. One column, not a table of requests: only the latest wish matters.
PAUSE_WANTED = Migration(
    11,
    "a pause or resume asked of another supervisor",
    ("ALTER TABLE task ADD COLUMN pause_wanted INTEGER",),
)

MIGRATIONS: tuple[Migration, ...] = (
    SEED_TABLES, SCHEDULING, DELAYED_RETRIES, BOOT_TIMES, PAYLOAD_REFS, RESTART_LOG_KEPT, QUEUES, CLEANING,
    HELD_TASKS, SUPERVISORS, PAUSE_WANTED,
)
LATEST = MIGRATIONS[-1].version


def current_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, target: int = LATEST) -> int:
    """Apply every migration above the database's version up to `target`; return the new version."""
    version = current_version(conn)
    if version > LATEST:
        raise MigrationError(
            f"the database has schema version {version}, newer than this fredica-worker "
            f"understands ({LATEST}): upgrade fredica-worker"
        )
    for migration in MIGRATIONS:
        if version < migration.version <= target:
            _apply(conn, migration)
            version = migration.version
    return version


def _apply(conn: sqlite3.Connection, migration: Migration) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another process may have migrated while we waited for it.
        if current_version(conn) >= migration.version:
            conn.execute("ROLLBACK")
            return
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {migration.version}")
    except sqlite3.Error as exc:
        conn.execute("ROLLBACK")
        raise MigrationError(f"migration {migration.version} ({migration.name}) failed: {exc}") from exc
    conn.execute("COMMIT")
