"""`fredica export`: the tasks as CSV or JSON lines, straight from a real database, read-only."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from click.testing import CliRunner

from daemon import cli
from daemon.store import db, tasks
from daemon.submission import parse_spec
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
