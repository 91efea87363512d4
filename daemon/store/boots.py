"""The boot time the process start times of each boot are counted from (daemon/processes.py)."""

from __future__ import annotations

import sqlite3

from daemon.store.db import write


def boot_time(conn: sqlite3.Connection, boot_id: str, now_reckoned: float) -> float:
    """The boot time kept for boot `boot_id`; `now_reckoned` (the kernel's, as of now) is kept
    and returned if this is the first time this boot is seen."""
    with write(conn):
        row = conn.execute("SELECT boot_time FROM boot WHERE boot_id = ?", (boot_id,)).fetchone()
        if row is not None:
            return float(row[0])
        conn.execute("INSERT INTO boot (boot_id, boot_time) VALUES (?, ?)", (boot_id, now_reckoned))
        return now_reckoned
