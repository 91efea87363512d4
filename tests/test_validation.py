"""Validation at submit (SPEC §14): executors' `validate`, refusals through the real daemon, and
`fredica types` / `fredica templates`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executors.base import PayloadError, TaskExecutor, check_keys
from executors.download import DownloadExecutor
from executors.http_request import HttpRequestExecutor
from executors.shell import ShellExecutor
from executors.transcode import TranscodeExecutor
from tests.daemon_harness import Daemon


def test_check_keys_suggests_the_close_match():
    with pytest.raises(PayloadError, match=r"unknown key 'progress_patern' \(did you mean 'progress_pattern'\?\)"):
        ShellExecutor.validate({"argv": ["true"], "progress_patern": "(\\d+)%"})
    with pytest.raises(PayloadError, match="unknown key 'zzz'; known keys: a, b"):
        check_keys({"a": 1, "zzz": 2}, ("a", "b"))


@pytest.mark.parametrize(
    ("executor", "payload", "message"),
    [
        (ShellExecutor, {}, "argv .* or command"),
        (ShellExecutor, {"command": "ls"}, "shell: true"),
        (DownloadExecutor, {"url": "ftp://x/y", "output": "/tmp/o"}, "http"),
        (DownloadExecutor, {"url": "http://x/y", "output": "/tmp/o", "sha": "ab"}, "did you mean 'sha256'"),
        (TranscodeExecutor, {"input": "rel.mkv", "output": "/tmp/o.mp4"}, "absolute"),
        (HttpRequestExecutor, {"url": "http://x/", "methd": "GET"}, "did you mean 'method'"),
    ],
)
def test_builtins_refuse_bad_payloads(executor: type[TaskExecutor], payload: dict[str, Any], message: str):
    with pytest.raises(PayloadError, match=message):
        executor.validate(payload)


def test_builtins_accept_what_only_exists_at_run_time(tmp_path: Path):
    # A cwd or an input an upstream task makes is not there yet at submit.
    ShellExecutor.validate({"argv": ["true"], "cwd": str(tmp_path / "later")})
    TranscodeExecutor.validate({"input": str(tmp_path / "later.mkv"), "output": str(tmp_path / "o.mp4")})
    DownloadExecutor.validate({"url": "https://x/y", "output": str(tmp_path / "o"), "size": 3})
    HttpRequestExecutor.validate({"url": "http://x/", "method": "POST", "body": "b"})


def test_the_default_validate_accepts_and_the_summary_is_the_class_docstring():
    class Plain(TaskExecutor):
        task_type = "PLAIN"

    class Documented(TaskExecutor):
        """First line.

        More."""

        task_type = "DOC"

    Plain.validate({"anything": 1})
    assert Plain.summary() == ""  # not the base class's docstring
    assert Documented.summary() == "First line."


TEMPLATE = """
[templates.fetch]
description = "download then list"
params = ["url"]
defaults = { dir = "/tmp" }

[templates.fetch.tasks.get]
type = "DOWNLOAD"
payload = { url = "{url}", output = "{dir}/f" }

[templates.fetch.tasks.ls]
type = "SHELL"
depends_on = ["get"]
payload = { argv = ["ls", "{get.output}"], {KEY} = true }
"""

def _daemon(tmp_path: Path, key: str = "pausable") -> Daemon:
    return Daemon(tmp_path / "d", extra_toml=TEMPLATE.replace("{KEY}", key)).start()


def _ls(daemon: Daemon) -> list[Any]:
    return daemon.data("ls")


def test_submit_refusals_store_nothing(tmp_path: Path):
    daemon = _daemon(tmp_path)
    try:
        reply = daemon.request("submit", tasks=[{"type": "NOPE_TYPE"}])
        assert not reply["ok"] and "unknown task type 'NOPE_TYPE'" in reply["error"]["message"]
        reply = daemon.request("submit", tasks=[{"type": "SHELL", "payload": {}}])
        assert reply["error"]["kind"] == "PayloadRefused"
        assert reply["error"]["message"].startswith("PAYLOAD_ERROR: SHELL payload: argv")
        reply = daemon.request("submit", tasks=[{"type": "SHELL", "payload": {"argv": ["true"]}},
                                                {"type": "SHELL", "payload": {"argv": ["true"], "progress_patern": "x"}}])
        assert reply["error"]["message"].startswith("task 2: PAYLOAD_ERROR: SHELL payload: unknown key 'progress_patern'")
        assert _ls(daemon) == []
        assert daemon.submit("SHELL", payload={"argv": ["true"]})  # a good one still goes in
        assert len(_ls(daemon)) == 1
    finally:
        daemon.stop()


def test_cli_batch_errors_name_the_line(tmp_path: Path):
    from click.testing import CliRunner

    from daemon import cli

    daemon = _daemon(tmp_path)
    try:
        batch = tmp_path / "b.jsonl"
        batch.write_text('{"type": "SHELL", "payload": {"argv": ["true"]}}\n\n{"type": "SHELL", "payload": {"argx": 1}}\n')
        result = CliRunner().invoke(cli.main, ["--config", str(daemon.config), "submit", "--batch", str(batch)])
        assert result.exit_code == 1
        assert "error: batch line 3: PAYLOAD_ERROR: SHELL payload: unknown key 'argx' (did you mean 'argv'?)" in result.output
        result = CliRunner().invoke(cli.main, ["--config", str(daemon.config), "submit", "NOPE_TYPE"])
        assert result.exit_code == 1 and "unknown task type 'NOPE_TYPE'" in result.output
        assert _ls(daemon) == []
    finally:
        daemon.stop()


def test_templates_are_validated_with_references_checked_by_key(tmp_path: Path):
    daemon = _daemon(tmp_path)
    try:
        reply = daemon.request("run", template="fetch", params={"url": "gopher://x"})
        assert "task 1 (get): PAYLOAD_ERROR: DOWNLOAD payload: url must be an http(s) URL" in reply["error"]["message"]
        assert _ls(daemon) == []
        assert daemon.data("run", template="fetch", params={"url": "http://127.0.0.1:9/f"})["run_id"]
    finally:
        daemon.stop()
    daemon = _daemon(tmp_path / "2", key="pausible")
    try:
        reply = daemon.request("run", template="fetch", params={"url": "http://127.0.0.1:9/f"})
        assert "task 2 (ls): PAYLOAD_ERROR: SHELL payload: unknown key 'pausible'" in reply["error"]["message"]
        assert _ls(daemon) == []
    finally:
        daemon.stop()


def test_types_and_templates_are_listed(tmp_path: Path):
    from click.testing import CliRunner

    from daemon import cli

    daemon = _daemon(tmp_path)
    try:
        types = {t["type"]: t for t in daemon.data("types")}
        assert types["SHELL"]["pausable"] is True and "progress_pattern" in types["SHELL"]["payload_keys"]
        assert types["HTTP_REQUEST"]["event_loop"] is True
        result = CliRunner().invoke(cli.main, ["--config", str(daemon.config), "types"])
        assert result.exit_code == 0
        header, *rows = result.output.splitlines()
        assert header.split()[:3] == ["TYPE", "PAUSABLE", "PAYLOAD"]
        shell = next(row for row in rows if row.startswith("SHELL "))
        assert " yes " in shell and "argv, command" in shell and "Runs a command" in shell
        result = CliRunner().invoke(cli.main, ["--config", str(daemon.config), "templates"])
        assert result.exit_code == 0
        assert "fetch" in result.output and "url, dir=/tmp" in result.output and "download then list" in result.output
        result = CliRunner().invoke(cli.main, ["--config", str(daemon.config), "templates", "--json"])
        assert '"params": [' in result.output and '"defaults": {' in result.output
    finally:
        daemon.stop()
