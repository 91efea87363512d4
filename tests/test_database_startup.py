"""A database the daemon must not use stops it before recovery, with one line (SPEC §13).

Corrupt (real files with 4 KB overwritten), read-only (a read-only mount when run as root, as CI
is; file modes otherwise), or deleted while its write-ahead log is still there: the daemon exits
1 with one line naming the file and what to do, and every file is left exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from daemon.store import db, tasks
from daemon.submission import TaskSpec
from tests import mounts
from tests.daemon_harness import Daemon

PAGE = 4096


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file under `directory` by name, with a hash of its bytes; not the daemon's lock file,
    taken (and given its pid) before the database is looked at."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*")) if p.is_file() and p.suffix != ".lock"
    }


def fill(database: Path, count: int = 300) -> None:
    conn = db.open_database(database)
    tasks.submit(conn, [TaskSpec(type="ECHO", payload={"i": i, "pad": "x" * 200}) for i in range(count)], now=1.0)
    conn.close()  # the last connection checkpoints: every page is in the main file, no -wal left
    assert not Path(f"{database}-wal").exists()


def refused_start(d: Daemon) -> str:
    """Start the daemon, expect exit 1 and exactly one line of output; that line."""
    seen = d.output.stat().st_size if d.output.exists() else 0  # what an earlier start printed
    d.start(wait=False)
    assert d.process is not None
    assert d.process.wait(30) == 1
    lines = d.output.read_bytes()[seen:].decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fredica: "), lines
    return lines[0]


def overwrite_page(database: Path, page: int) -> None:
    data = bytearray(database.read_bytes())
    rng = random.Random(page)
    data[page * PAGE:(page + 1) * PAGE] = bytes(rng.randrange(256) for _ in range(PAGE))
    database.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["schema page", "middle page", "last page"])
def test_a_corrupt_database_stops_the_daemon_before_recovery(daemons, where: str) -> None:
    d = daemons()
    fill(d.database)
    pages = d.database.stat().st_size // PAGE
    assert pages > 10
    overwrite_page(d.database, {"schema page": 0, "middle page": pages // 2, "last page": pages - 1}[where])
    before = fingerprint(d.database.parent)
    line = refused_start(d)
    assert f"the database {d.database} is corrupt" in line and "restore it from a backup" in line, line
    assert fingerprint(d.database.parent) == before


def test_quick_check_finds_what_the_opening_alone_does_not(tmp_path: Path) -> None:
    """A damaged page in the middle opens fine and answers the first queries: only the check at
    start-up stops the daemon before it reports ready."""
    database = tmp_path / "fredica.db"
    fill(database)
    overwrite_page(database, database.stat().st_size // PAGE // 2)
    plain = sqlite3.connect(database)
    assert plain.execute("PRAGMA user_version").fetchone()[0] > 0  # opens, reads its header
    plain.close()
    with pytest.raises(db.DatabaseUnusable, match="is corrupt"):
        db.open_database(database)


def test_a_database_deleted_while_its_wal_remains_is_not_started_empty(daemons) -> None:
    d = daemons()
    d.start()
    ids = [d.submit("HANG") for _ in range(3)]
    d.kill9()  # its -wal stays, holding what was committed since the last checkpoint
    assert Path(f"{d.database}-wal").exists() and ids
    d.database.unlink()
    before = fingerprint(d.database.parent)
    line = refused_start(d)
    assert f"the database {d.database} is missing but its write-ahead log" in line, line
    assert fingerprint(d.database.parent) == before
    assert not d.database.exists()


@pytest.fixture
def read_only_state(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Makes a directory holding a database read-only: a read-only mount as root (file modes do not
    stop root), the modes otherwise."""
    mounted: list[Path] = []
    modes: list[Path] = []

    def make_read_only(directory: Path) -> None:
        if os.geteuid() == 0:
            saved = {p.name: p.read_bytes() for p in directory.iterdir()}
            for p in directory.iterdir():
                p.unlink()
            mounts.mount_tmpfs(directory, "64m")
            mounted.append(directory)
            for name, data in saved.items():
                (directory / name).write_bytes(data)
            subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        else:
            for p in [*directory.iterdir(), directory]:
                p.chmod(0o500 if p.is_dir() else 0o400)
                modes.append(p)

    yield make_read_only
    for directory in mounted:
        mounts.unmount(directory)
    for p in modes:
        p.chmod(0o700 if p.is_dir() else 0o600)


def test_a_read_only_database_stops_the_daemon_with_one_line(daemons, read_only_state) -> None:
    d = daemons()
    fill(d.database)
    (d.database.parent / "fredica.db.lock").touch()  # the lock file lives beside it, made by an earlier run
    read_only_state(d.database.parent)
    before = fingerprint(d.database.parent)
    line = refused_start(d)
    assert str(d.database) in line and "writable" in line, line
    assert fingerprint(d.database.parent) == before


def test_a_read_only_database_file_in_a_writable_directory(tmp_path: Path) -> None:
    """SQLite opens such a file read-only without a word; the write probe catches it (as root
    the modes stop nobody, so this case is shown by SQLite's own read-only opening)."""
    database = tmp_path / "fredica.db"
    fill(database)
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as caught:
        db._check_writable(conn, database)
    conn.close()
    assert db._unusable(database, caught.value).message.startswith(f"the database {database} cannot be written")
