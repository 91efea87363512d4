"""`fredica export`: the tasks as CSV or JSON lines, straight from a real database, read-only: a SQLite
file, and the same queue moved to PostgreSQL exported alike."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from daemon import cli
from daemon import export as exporting
from daemon.store import db, tasks
from daemon.store import export as export_store
from daemon.submission import parse_spec
from tests.postgres_cluster import url  # noqa: F401 (a migrated PostgreSQL database of each test's own)
from tests.store_steps import claim_next

T0 = 1_700_000_000.0


def config_for(tmp_path: Path) -> Path:
    path = tmp_path / "fredica.toml"
    path.write_text(f'[daemon]\ndatabase = "{tmp_path}/fredica.db"\nsocket = "{tmp_path}/s.sock"\n'
                    f'log_dir = "{tmp_path}/logs"\n')
    return path


def three_tasks(tmp_path: Path) -> list[str]:
    conn = db.open_database(tmp_path / "fredica.db")
    try:
        run = tasks.submit(conn, [parse_spec({"type": "ECHO", "payload": {"n": n}}) for n in range(3)], now=T0)
        claimed = claim_next(conn, T0 + 1)
        assert claimed is not None
        tasks.start(conn, claimed.id, now=T0 + 1, known=claimed)
        tasks.complete(conn, claimed.id, {"echo": "done, ünïcode"}, now=T0 + 2)
        return [t.id for t in run.tasks]
    finally:
        conn.close()


def test_jsonl_has_every_task_in_order_with_payload_and_result_as_json(tmp_path: Path) -> None:
    ids = three_tasks(tmp_path)
    before = (tmp_path / "fredica.db").stat().st_mtime_ns
    result = CliRunner().invoke(cli.main, ["--config", str(config_for(tmp_path)), "export"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == ids
    assert rows[0]["status"] == "completed" and rows[0]["result"] == {"echo": "done, ünïcode"}
    assert [r["payload"] for r in rows] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert result.stderr.strip() == "3 tasks exported"
    assert (tmp_path / "fredica.db").stat().st_mtime_ns == before  # read-only


def test_csv_with_a_status_filter_to_a_file(tmp_path: Path) -> None:
    ids = three_tasks(tmp_path)
    out = tmp_path / "pending.csv"
    result = CliRunner().invoke(
        cli.main, ["--config", str(config_for(tmp_path)), "export", "--format", "csv", "--status", "pending",
                   "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["id"] for r in rows] == ids[1:] and {r["status"] for r in rows} == {"pending"}
    assert rows[0]["payload"] == '{"n": 1}'


def test_bad_requests_are_one_line_and_write_no_rows(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    missing = CliRunner().invoke(cli.main, ["--config", str(config), "export", "--format", "csv"])
    assert missing.exit_code == 1 and missing.stdout == ""
    assert missing.stderr.strip() == f"error: no database at {tmp_path}/fredica.db"
    three_tasks(tmp_path)
    wrong = CliRunner().invoke(cli.main, ["--config", str(config), "export", "--status", "nope"])
    assert wrong.exit_code == 1 and wrong.stdout == "" and "unknown status 'nope'" in wrong.stderr
    (tmp_path / "other.db").write_bytes(b"")
    os.replace(tmp_path / "other.db", tmp_path / "fredica.db")
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"fredica.db{suffix}").unlink(missing_ok=True)
    empty = CliRunner().invoke(cli.main, ["--config", str(config), "export"])
    assert empty.exit_code == 1 and "not a fredica database" in empty.stderr


def test_a_run_is_named_by_a_prefix_an_unknown_one_refused_and_no_file_is_left(tmp_path: Path) -> None:
    ids = three_tasks(tmp_path)
    conn = db.open_database(tmp_path / "fredica.db")
    run_id = tasks.get(conn, ids[0]).workflow_run_id
    conn.close()  # the last connection: the -wal and -shm files go with it
    config = config_for(tmp_path)
    before = sorted(os.listdir(tmp_path))
    by_prefix = CliRunner().invoke(cli.main, ["--config", str(config), "export", "--run", run_id[:6]])
    assert by_prefix.exit_code == 0, by_prefix.output
    assert [json.loads(line)["id"] for line in by_prefix.stdout.splitlines()] == ids
    unknown = CliRunner().invoke(cli.main, ["--config", str(config), "export", "--run", "nope"])
    assert (unknown.exit_code, unknown.stdout, unknown.stderr) == (1, "", "error: no workflow run has id nope\n")
    assert sorted(os.listdir(tmp_path)) == before  # mode=ro alone would leave a -wal and a -shm


def test_status_takes_the_words_ls_takes(tmp_path: Path) -> None:
    ids = three_tasks(tmp_path)  # the first completed, the others pending
    config = str(config_for(tmp_path))
    waiting = CliRunner().invoke(cli.main, ["--config", config, "export", "--status", "waiting"])
    assert waiting.exit_code == 0, waiting.output
    assert [json.loads(line)["id"] for line in waiting.stdout.splitlines()] == ids[1:]
    both = CliRunner().invoke(cli.main, ["--config", config, "export", "--status", "waiting", "--status", "completed"])
    assert [json.loads(line)["id"] for line in both.stdout.splitlines()] == ids


def test_a_held_task_says_so(tmp_path: Path) -> None:
    conn = db.open_database(tmp_path / "fredica.db")
    try:
        tasks.submit(conn, [parse_spec({"type": "ECHO", "hold": True}), parse_spec({"type": "ECHO"})], now=T0)
    finally:
        conn.close()
    result = CliRunner().invoke(cli.main, ["--config", str(config_for(tmp_path)), "export"])
    assert [(r["status"], r["is_held"]) for r in map(json.loads, result.stdout.splitlines())] == [
        ("pending", 1), ("pending", 0)]


def test_pages_of_several_statuses_are_read_in_seq_order_not_sorted_each_time(tmp_path: Path) -> None:
    # Each page sorting every match after it would make an export quadratic in its matches.
    three_tasks(tmp_path)
    conn = db.connect_read_only(tmp_path / "fredica.db")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    assert len(list(export_store.rows(conn, statuses=["waiting", "completed"], page=2))) == 3
    conn.set_trace_callback(None)
    [page, *_] = [sql for sql in statements if sql.startswith("SELECT seq")]
    plan = " / ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + page))
    conn.close()
    assert "INTEGER PRIMARY KEY" in plan and "TEMP B-TREE" not in plan, plan


# --- PostgreSQL: the same rows, the same output -------------------------------------------------


def varied_queue(path: Path) -> dict[str, str]:
    """A SQLite queue of two runs whose tasks ended every way, or wait, held or not; by name."""
    conn = db.open_database(path)
    try:
        first = tasks.submit(conn, [parse_spec({"type": "ECHO", "payload": {"n": n, "text": "ünï \"q\", \\ %"}})
                                    for n in range(4)], now=T0)
        second = tasks.submit(conn, [parse_spec({"type": "SHELL", "hold": True, "material_id": "m-1"}),
                                     parse_spec({"type": "ECHO", "priority": 3, "idempotency_key": "k"})], now=T0 + 1)
        done = claim_next(conn, T0 + 2)
        assert done is not None and done.id == second.tasks[1].id
        tasks.start(conn, done.id, now=T0 + 2.5, known=done)
        tasks.complete(conn, done.id, {"echo": "done, ünïcode", "list": [1, 2.5, None]}, now=T0 + 3.125)
        failed = claim_next(conn, T0 + 4)
        assert failed is not None and failed.id == first.tasks[0].id
        tasks.start(conn, failed.id, now=T0 + 4, known=failed)
        tasks.fail(conn, failed.id, error='boom\nsecond line, "quoted"', error_type="EXCEPTION", now=T0 + 5)
        return {"first_run": str(first.run_id), "second_run": str(second.run_id)}
    finally:
        conn.close()


def postgres_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "postgres.toml"
    path.write_text(f'[daemon]\ndatabase = "{url}"\nsocket = "{tmp_path}/pg.sock"\nlog_dir = "{tmp_path}/pg-logs"\n')
    return path


def export(config: Path, *args: str) -> Result:
    return CliRunner().invoke(cli.main, ["--config", str(config), "export", *args])


FILTERS = [(), ("--status", "waiting"), ("--status", "failed", "--status", "held"), ("--run", "RUN"),
           ("--run", "RUN", "--status", "completed"), ("--status", "cancelled")]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_postgresql_queue_exports_as_its_sqlite_original_did(
    tmp_path: Path, url: str, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Moved with `fredica db copy`: the same rows on both backends, no daemon running on either.
    made = varied_queue(tmp_path / "fredica.db")
    copied = CliRunner().invoke(cli.main, ["db", "copy", str(tmp_path / "fredica.db"), url])
    assert copied.exit_code == 0, copied.output
    monkeypatch.setattr(export_store, "PAGE", 2)  # 6 tasks: page boundaries inside every export
    sqlite, postgres = config_for(tmp_path), postgres_config(tmp_path, url)
    seen = set()
    for given in FILTERS:
        args = ["--format", fmt, *(made["second_run"][:8] if arg == "RUN" else arg for arg in given)]
        expected, exported = export(sqlite, *args), export(postgres, *args)
        assert expected.exit_code == 0, expected.output
        assert (exported.exit_code, exported.stdout, exported.stderr) == (0, expected.stdout, expected.stderr), given
        seen.add(expected.stdout)
    assert len(seen) == len(FILTERS)  # each filter kept other tasks
    everything = export(postgres, "--format", fmt)
    assert everything.stderr == "6 tasks exported\n"


def test_a_postgresql_export_reads_one_snapshot_a_page_at_a_time(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = db.open_database(url)
    try:
        tasks.submit(writer, [parse_spec({"type": "ECHO", "payload": {"n": n}}) for n in range(5)], now=T0)
        monkeypatch.setattr(export_store, "PAGE", 2)
        found = exporting.rows(url)
        first = next(found)
        # Submitted after the export's first page: a later page must not show it.
        tasks.submit(writer, [parse_spec({"type": "ECHO", "payload": {"n": 99}})], now=T0 + 1)
        rest = list(found)
    finally:
        writer.close()
    assert [json.loads(row["payload"])["n"] for row in [first, *rest]] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("given,expected", [
    (("--status", "nope"), "error: unknown status 'nope': one of "),
    (("--run", "nope"), "error: no workflow run has id nope"),
])
def test_bad_requests_of_a_postgresql_export_are_one_line(tmp_path: Path, url: str, given: tuple[str, ...],
                                                          expected: str) -> None:
    result = export(postgres_config(tmp_path, url), *given)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1, result.stderr


def test_an_unreachable_postgresql_server_is_one_line(tmp_path: Path) -> None:
    result = export(postgres_config(tmp_path, "postgresql:///queue?host=/nonexistent/socket/dir"))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "cannot connect to the database" in result.stderr
