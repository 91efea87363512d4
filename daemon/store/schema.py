"""The schema at the latest migration, for each backend, written out whole in one place to read.

Databases are never built from this: they are built by the migrations (`migrations.py` for SQLite,
`postgres/migrations.py` for PostgreSQL), which is how an existing database gets there too. A test
(tests/test_schema.py) builds a database from these statements and one by the migrations and
checks that the two have the same tables, columns, keys and indexes: a migration that forgets a
column, an index or a default, or a schema change made without a migration, is found there.
Each migration that changes the schema changes this file in the same commit, and
`SCHEMA_VERSION` with it.
"""

from __future__ import annotations

SCHEMA_VERSION = 11

SQLITE: tuple[str, ...] = (
    """
    CREATE TABLE workflow_run (
        id TEXT PRIMARY KEY,
        material_id TEXT,
        template TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',
        total_tasks INTEGER NOT NULL DEFAULT 0,
        done_tasks INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        completed_at REAL,
        pending_tasks INTEGER NOT NULL DEFAULT 0,
        claimed_tasks INTEGER NOT NULL DEFAULT 0,
        running_tasks INTEGER NOT NULL DEFAULT 0,
        failed_tasks INTEGER NOT NULL DEFAULT 0,
        cancelled_tasks INTEGER NOT NULL DEFAULT 0
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
        heartbeat_at REAL,
        status_text TEXT,
        timeout REAL,
        not_before REAL NOT NULL DEFAULT 0,
        executor_pid INTEGER,
        executor_started_at REAL,
        unmet_deps INTEGER NOT NULL DEFAULT 0,
        payload_refs INTEGER NOT NULL DEFAULT 0,
        queue TEXT NOT NULL DEFAULT 'default',
        queue_explicit INTEGER NOT NULL DEFAULT 0,
        is_held INTEGER NOT NULL DEFAULT 0,
        supervisor TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        pause_wanted INTEGER
    )
    """,
    """
    CREATE TABLE task_dependency (
        depends_on_seq INTEGER NOT NULL REFERENCES task(seq),
        task_seq INTEGER NOT NULL REFERENCES task(seq),
        PRIMARY KEY (depends_on_seq, task_seq)
    ) WITHOUT ROWID
    """,
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
    "CREATE TABLE boot (boot_id TEXT PRIMARY KEY, boot_time REAL NOT NULL)",
    "CREATE TABLE queue_state (name TEXT PRIMARY KEY, paused INTEGER NOT NULL, changed_at REAL NOT NULL)",
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
    "CREATE INDEX task_by_run ON task(workflow_run_id, status)",
    "CREATE INDEX task_by_status ON task(status)",
    "CREATE INDEX task_ready ON task(queue, priority DESC, seq)"
    " WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0 AND is_held = 0",
    "CREATE INDEX task_delayed ON task(not_before) WHERE status = 'pending' AND not_before > 0",
    "CREATE INDEX task_waiting_by_queue ON task(queue) WHERE status IN ('pending', 'claimed')",
    """
    CREATE UNIQUE INDEX task_active_idempotency ON task(idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'claimed', 'running')
    """,
    "CREATE INDEX workflow_run_by_status ON workflow_run(status)",
    "CREATE INDEX restart_task_log_by_disposition ON restart_task_log(disposition)",
    "CREATE INDEX restart_task_log_by_task ON restart_task_log(task_id, id)",
    "CREATE INDEX task_dependency_by_task ON task_dependency(task_seq)",
    "CREATE INDEX workflow_run_finished ON workflow_run(completed_at) WHERE completed_at IS NOT NULL",
    "CREATE INDEX task_held ON task(seq) WHERE status = 'pending' AND is_held = 1",
    "CREATE INDEX task_in_flight_by_supervisor ON task(supervisor) WHERE status IN ('claimed', 'running')",
)

POSTGRESQL: tuple[str, ...] = (
    "CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """
    CREATE TABLE workflow_run (
        id TEXT PRIMARY KEY,
        material_id TEXT,
        template TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',
        total_tasks INTEGER NOT NULL DEFAULT 0,
        done_tasks INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        completed_at DOUBLE PRECISION,
        pending_tasks INTEGER NOT NULL DEFAULT 0,
        claimed_tasks INTEGER NOT NULL DEFAULT 0,
        running_tasks INTEGER NOT NULL DEFAULT 0,
        failed_tasks INTEGER NOT NULL DEFAULT 0,
        cancelled_tasks INTEGER NOT NULL DEFAULT 0
    )
    """,
    """
    CREATE TABLE task (
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
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
        created_at DOUBLE PRECISION NOT NULL,
        claimed_at DOUBLE PRECISION,
        started_at DOUBLE PRECISION,
        completed_at DOUBLE PRECISION,
        heartbeat_at DOUBLE PRECISION,
        status_text TEXT,
        timeout DOUBLE PRECISION,
        not_before DOUBLE PRECISION NOT NULL DEFAULT 0,
        executor_pid INTEGER,
        executor_started_at DOUBLE PRECISION,
        unmet_deps INTEGER NOT NULL DEFAULT 0,
        payload_refs INTEGER NOT NULL DEFAULT 0,
        queue TEXT NOT NULL DEFAULT 'default',
        queue_explicit INTEGER NOT NULL DEFAULT 0,
        is_held INTEGER NOT NULL DEFAULT 0,
        supervisor TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        pause_wanted INTEGER
    )
    """,
    """
    CREATE TABLE task_dependency (
        depends_on_seq BIGINT NOT NULL REFERENCES task(seq),
        task_seq BIGINT NOT NULL REFERENCES task(seq),
        PRIMARY KEY (depends_on_seq, task_seq)
    )
    """,
    """
    CREATE TABLE restart_task_log (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
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
        created_at DOUBLE PRECISION NOT NULL,
        resolved_at DOUBLE PRECISION
    )
    """,
    "CREATE TABLE boot (boot_id TEXT PRIMARY KEY, boot_time DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE queue_state (name TEXT PRIMARY KEY, paused INTEGER NOT NULL, changed_at DOUBLE PRECISION NOT NULL)",
    """
    CREATE TABLE supervisor (
        name TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_started_at DOUBLE PRECISION,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL,
        lease_timeout DOUBLE PRECISION NOT NULL
    )
    """,
    "CREATE INDEX task_by_run ON task(workflow_run_id, status)",
    "CREATE INDEX task_by_status ON task(status)",
    "CREATE INDEX task_ready ON task(queue, priority DESC, seq)"
    " WHERE status = 'pending' AND unmet_deps = 0 AND not_before = 0 AND is_held = 0",
    "CREATE INDEX task_delayed ON task(not_before) WHERE status = 'pending' AND not_before > 0",
    "CREATE INDEX task_waiting_by_queue ON task(queue) WHERE status IN ('pending', 'claimed')",
    """
    CREATE UNIQUE INDEX task_active_idempotency ON task(idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'claimed', 'running')
    """,
    "CREATE INDEX workflow_run_by_status ON workflow_run(status)",
    "CREATE INDEX restart_task_log_by_disposition ON restart_task_log(disposition)",
    "CREATE INDEX restart_task_log_by_task ON restart_task_log(task_id, id)",
    "CREATE INDEX task_dependency_by_task ON task_dependency(task_seq)",
    "CREATE INDEX workflow_run_finished ON workflow_run(completed_at) WHERE completed_at IS NOT NULL",
    "CREATE INDEX task_held ON task(seq) WHERE status = 'pending' AND is_held = 1",
    "CREATE INDEX task_in_flight_by_supervisor ON task(supervisor) WHERE status IN ('claimed', 'running')",
)
