"""The `fredica` CLI against a fake daemon: a real Unix socket that speaks the control protocol,
records every request and answers canned data. Checks what each command sends, what it prints and
its exit status."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from daemon import cli, client, config, models, protocol, render

TASK_COLUMNS = [field.name for field in dataclasses.fields(models.Task)]
ACTIVE = ["pending", "claimed", "running"]
ID_A = "aaaaaaaa-0000-4000-8000-000000000001"
ID_B = "bbbbbbbb-0000-4000-8000-000000000002"
RUN = "rrrrrrrr-0000-4000-8000-000000000009"


class Refuse(Exception):
    """Raised by a fake handler to make the fake daemon send an error reply."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class FakeDaemon:
    """A control socket served from a thread: records (op, args) and replies `handlers[op]`.

    A handler is the reply data, or a callable that takes the args and returns it (or raises Refuse).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.handlers: dict[str, Any] = {}
        self.failures: list[BaseException] = []
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            with conn:
                if self._stopping.is_set():
                    return
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        op, args = protocol.parse_request(protocol.read_frame(conn, protocol.MAX_REQUEST))
        self.requests.append((op, args))
        handler = self.handlers.get(op, Refuse("UnknownOp", f"the fake has no reply for {op}"))
        try:
            if isinstance(handler, Refuse):
                raise handler
            reply = protocol.ok(handler(args) if callable(handler) else handler)
        except Refuse as exc:
            reply = protocol.error(exc.kind, exc.message)
        except BaseException as exc:  # a bug in the test's handler: make it visible
            self.failures.append(exc)
            reply = protocol.error("FakeFailure", repr(exc))
        conn.sendall(protocol.encode(reply, protocol.MAX_REPLY))

    def close(self) -> None:
        self._stopping.set()
        # Wake the blocking accept() with one last connection instead of polling.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waker:
            waker.connect(str(self.path))
        self._thread.join(timeout=10)
        self._listener.close()

    @property
    def ops(self) -> list[str]:
        return [op for op, _ in self.requests]


def task(task_id: str = ID_A, **fields: Any) -> dict[str, Any]:
    """A task dict with every column, as the daemon's Task.to_dict() sends it."""
    base: dict[str, Any] = {name: None for name in TASK_COLUMNS}
    base.update(
        seq=1,
        id=task_id,
        type="SHELL",
        workflow_run_id=RUN,
        status="pending",
        priority=0,
        depends_on=[],
        payload={},
        retry_count=0,
        max_retries=0,
        progress=0,
        is_paused=False,
        is_pausable=False,
        not_before=0.0,
        created_at=1_700_000_000.0,
    )
    base.update(fields)
    return base


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No config of the machine or of the user may leak in.
    monkeypatch.delenv("FREDICA_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(config, "SYSTEM_CONFIG", tmp_path / "etc" / "fredica" / "config.toml")
    monkeypatch.setattr(cli, "_sleep", lambda seconds: None)
    monkeypatch.setattr(cli, "FOLLOW_RECHECK", 0.0)


@pytest.fixture
def fake(tmp_path: Path):
    daemon = FakeDaemon(tmp_path / "control.sock")
    yield daemon
    daemon.close()
    assert not daemon.failures


def write_config(tmp_path: Path, socket_path: Path) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f'[daemon]\nsocket = "{socket_path}"\n')
    return str(path)


@pytest.fixture
def cfg(tmp_path: Path, fake: FakeDaemon) -> str:
    return write_config(tmp_path, fake.path)


@pytest.fixture
def fredica(cfg: str) -> Callable[..., Any]:
    def invoke(*args: str, input: str | None = None) -> Any:
        return CliRunner().invoke(cli.main, ["--config", cfg, *args], input=input)

    return invoke


# --- submit -------------------------------------------------------------------------------------


def test_submit_sends_one_spec_with_the_given_fields_and_prints_the_id(fake, fredica):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    result = fredica(
        "submit", "DOWNLOAD", "--payload", '{"url": "http://x/y"}', "--priority", "5",
        "--depends-on", ID_B, "--depends-on", "k2", "--max-retries", "3", "--idempotency-key", "dl-1",
        "--material", "m1", "--timeout", "90",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{ID_A}\n"
    assert fake.requests == [
        (
            "submit",
            {
                "tasks": [
                    {
                        "type": "DOWNLOAD",
                        "payload": {"url": "http://x/y"},
                        "priority": 5,
                        "depends_on": [ID_B, "k2"],
                        "max_retries": 3,
                        "idempotency_key": "dl-1",
                        "material_id": "m1",
                        "timeout": 90.0,
                    }
                ],
                "material_id": "m1",  # the one task's run is about that material too
            },
        )
    ]


def test_submit_leaves_out_unset_fields(fake, fredica):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    assert fredica("submit", "SHELL").exit_code == 0
    assert fake.requests == [("submit", {"tasks": [{"type": "SHELL"}]})]


def test_duplicate_idempotency_key_prints_the_existing_id_and_says_so(fake, fredica):
    fake.handlers["submit"] = {"run_id": None, "tasks": [{"id": ID_B, "created": False}]}
    result = fredica("submit", "SHELL", "--idempotency-key", "k")
    assert result.exit_code == 0
    assert result.stdout == f"{ID_B}\n"
    assert result.stderr == f'task {ID_B} already active with idempotency key "k" (not submitted again)\n'


def test_a_batch_names_the_key_of_each_task_already_active(fake, fredica, tmp_path):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}, {"id": ID_B, "created": False}]}
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"type": "SHELL", "idempotency_key": "new"}\n{"type": "SHELL", "idempotency_key": "old"}\n')
    result = fredica("submit", "--batch", str(batch))
    assert result.exit_code == 0 and result.stdout == f"{ID_A}\n{ID_B}\n"
    assert result.stderr == f'task {ID_B} already active with idempotency key "old" (not submitted again)\n'


@pytest.mark.parametrize(
    "payload, message",
    [("{not json", "--payload is not valid JSON"), ("[1, 2]", "--payload must be a JSON object")],
)
def test_bad_payload_is_refused_locally_and_nothing_is_sent(fake, fredica, payload, message):
    result = fredica("submit", "SHELL", "--payload", payload)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {message}")
    assert result.stderr.count("\n") == 1
    assert fake.requests == []


@pytest.mark.parametrize(
    "args",
    [
        ["submit"],  # neither TYPE nor --batch
        ["submit", "SHELL", "--batch", "-"],  # both
        ["submit", "--batch", "-", "--priority", "3"],  # a single-task option with --batch
        ["submit", "SHELL", "--priority", "high"],
        ["run", "T", "--set", "novalue"],
        ["ls", "--status", "bogus"],
        ["restarts", "dismiss", "not-a-number"],
        ["show"],
    ],
)
def test_usage_errors_exit_2_and_send_nothing(fake, fredica, args):
    result = fredica(*args, input="")
    assert result.exit_code == 2, result.output
    assert fake.requests == []


def test_batch_from_a_file_is_one_submission_and_prints_the_ids_in_order(fake, fredica, tmp_path):
    lines = [
        {"type": "DOWNLOAD", "key": "dl", "payload": {"url": "u"}},
        {"type": "TRANSCODE_MP4", "depends_on": ["dl"], "priority": 2},
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps(lines[0]) + "\n\n   \n" + json.dumps(lines[1]) + "\n")
    fake.handlers["submit"] = {
        "run_id": RUN,
        "tasks": [{"id": ID_A, "created": True}, {"id": ID_B, "created": True}],
    }
    result = fredica("submit", "--batch", str(batch))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [ID_A, ID_B]
    assert fake.requests == [("submit", {"tasks": lines})]


def test_batch_from_stdin(fake, fredica):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    result = fredica("submit", "--batch", "-", input='{"type": "SHELL", "payload": {"argv": ["true"]}}\n')
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{ID_A}\n"
    assert fake.requests == [("submit", {"tasks": [{"type": "SHELL", "payload": {"argv": ["true"]}}]})]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("[1, 2]", "batch line 3 is not a JSON object"),
        ("{oops", "batch line 3 is not valid JSON"),
        ('{"type": "SHELL", "colour": "red"}', "batch line 3: unknown field(s): colour"),
    ],
)
def test_a_bad_batch_line_refuses_the_whole_batch_naming_the_line(fake, fredica, bad_line, message):
    batch = '{"type": "A"}\n\n' + bad_line + '\n{"type": "B"}\n'
    result = fredica("submit", "--batch", "-", input=batch)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {message}")
    assert fake.requests == []


@pytest.mark.parametrize(
    "batch, message",
    [
        (b'{"type": "A"}\n{"type": "B", "payload": {"name": "\xff"}}\n', "the batch is not UTF-8 text"),
        (b'{"type": "A"}\n' + b"[" * 5000 + b"]" * 5000 + b"\n", "batch line 2 is nested too deeply"),
    ],
)
def test_a_batch_that_is_not_json_text_is_one_clear_error(fake, fredica, tmp_path, batch, message):
    path = tmp_path / "batch.jsonl"
    path.write_bytes(batch)
    result = fredica("submit", "--batch", str(path))
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
    assert fake.requests == []


def test_a_batch_line_may_hold_unicode_line_separators_in_its_strings(fake, fredica):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    line = json.dumps({"type": "SHELL", "payload": {"title": "one\u2028two\x85three"}}, ensure_ascii=False)
    result = fredica("submit", "--batch", "-", input=line + "\n")
    assert result.exit_code == 0, result.output
    assert fake.requests[0][1]["tasks"][0]["payload"] == {"title": "one\u2028two\x85three"}


def test_run_of_tasks_all_already_active_prints_their_ids(fake, fredica):
    # No new run was made: each task is an active one with the same idempotency key.
    fake.handlers["run"] = {"run_id": None, "tasks": [{"id": ID_A, "created": False}]}
    result = fredica("run", "dl_and_mp4")
    assert (result.exit_code, result.stdout) == (0, f"{ID_A}\n")
    assert "no new run" in result.stderr and f"task {ID_A} already active" in result.stderr


def test_an_empty_batch_is_refused(fake, fredica):
    result = fredica("submit", "--batch", "-", input="\n\n")
    assert result.exit_code == 1
    assert "no tasks" in result.stderr
    assert fake.requests == []


# --- run ----------------------------------------------------------------------------------------


def test_run_sends_template_material_and_params_and_prints_the_run_id(fake, fredica):
    fake.handlers["run"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    result = fredica("run", "dl_and_mp4", "--material", "m7", "--set", "url=http://a?b=c", "--set", "q=1")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{RUN}\n"
    assert fake.requests == [
        ("run", {"template": "dl_and_mp4", "material_id": "m7", "params": {"url": "http://a?b=c", "q": "1"}})
    ]


def test_run_without_material_or_params(fake, fredica):
    fake.handlers["run"] = {"run_id": RUN, "tasks": []}
    assert fredica("run", "t").exit_code == 0
    assert fake.requests == [("run", {"template": "t", "material_id": None, "params": {}})]


def test_an_error_reply_exits_1_with_its_message_on_one_line(fake, fredica):
    fake.handlers["run"] = Refuse("UnknownTemplate", "no template named 'nope' in the config")
    result = fredica("run", "nope")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == "error: no template named 'nope' in the config\n"


# --- ls, runs, show -----------------------------------------------------------------------------


def test_ls_json_prints_the_tasks_with_every_column(fake, fredica):
    tasks = [task(ID_A, status="running", progress=42), task(ID_B, seq=2)]
    fake.handlers["ls_pages"] = {"items": tasks}
    result = fredica("ls", "--json")
    assert result.exit_code == 0
    printed = json.loads(result.stdout)
    assert printed == tasks
    assert all(set(TASK_COLUMNS) <= set(row) for row in printed)
    assert fake.requests == [("ls_pages", {})]  # every task, without the count


@pytest.mark.parametrize(
    "args, sent",
    [
        (["--status", "running"], {"status": "running", "limit": 50, "total": True}),
        (
            ["--status", "pending", "--status", "failed", "--run", RUN, "--type", "SHELL", "--limit", "5"],
            {"status": ["pending", "failed"], "run": RUN, "type": "SHELL", "limit": 5, "total": True},
        ),
        (["--sort", "priority", "--all"], {"sort": "priority", "total": True}),
    ],
)
def test_ls_sends_only_the_filters_given(fake, fredica, args, sent):
    fake.handlers["ls_pages"] = {"items": [], "total": 0}
    result = fredica("ls", *args)
    assert result.exit_code == 0
    assert result.stdout == "no tasks\n"
    assert fake.requests == [("ls_pages", sent)]


def test_ls_table_shows_8_character_ids_and_display_statuses(fake, fredica):
    fake.handlers["ls_pages"] = {"items": [
        task(ID_A, status="running", is_paused=True, progress=42, priority=3, retry_count=1, max_retries=2),
        task(ID_B, seq=2, type="DOWNLOAD", status="claimed"),
        task("cccccccc-0000-4000-8000-000000000003", seq=3, status="failed", error_type="EXCEPTION"),
        task("dddddddd-0000-4000-8000-000000000004", seq=4, status="completed", progress=100),
    ], "total": 4}
    result = fredica("ls")
    assert result.exit_code == 0
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "RUN", "TYPE", "STATUS", "PROGRESS", "PRI", "RETRIES", "AGE", "TIME", "STATUS",
                              "TEXT"]
    assert rows[0].split()[:7] == [ID_A[:8], RUN[:8], "SHELL", "paused", "42%", "3", "1/2"]
    assert rows[1].split()[:4] == [ID_B[:8], RUN[:8], "DOWNLOAD", "waiting"]
    assert rows[2].split()[3] == "failed" and rows[2].split()[-1] == "EXCEPTION"
    assert rows[3].split()[3:5] == ["completed", "100%"]
    assert " 42%" in rows[0]
    assert len(rows) == 4  # all of them shown: no "more" line


def test_runs_json_and_table(fake, fredica):
    run = {
        "id": RUN, "material_id": "m1", "template": "adhoc", "status": "running",
        "total_tasks": 3, "done_tasks": 1, "created_at": 1_700_000_000.0, "completed_at": None,
    }
    fake.handlers["runs"] = [run]
    as_json = fredica("runs", "--json", "--status", "running", "--limit", "10")
    assert json.loads(as_json.stdout) == [run]
    assert fake.requests == [("runs", {"status": "running", "limit": 10})]
    header, row = fredica("runs").stdout.splitlines()
    assert header.split() == ["ID", "TEMPLATE", "STATUS", "DONE", "MATERIAL", "AGE"]
    assert row.split()[:5] == [RUN[:8], "adhoc", "running", "1/3", "m1"]


def test_show_task(fake, fredica):
    shown = task(ID_A, status="running", is_paused=True, progress=30, payload={"url": "u"}, depends_on=[ID_B])
    fake.handlers["show"] = {"kind": "task", "object": shown}
    assert json.loads(fredica("show", ID_A, "--json").stdout) == shown
    assert fake.requests == [("show", {"id": ID_A})]
    lines = fredica("show", ID_A).stdout.splitlines()
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines}
    assert set(fields) == set(TASK_COLUMNS)
    assert fields["id"] == ID_A
    assert fields["status"] == "paused (running)"
    assert fields["payload"] == '{"url": "u"}'
    assert fields["depends_on"] == ID_B
    assert fields["completed_at"] == "-"
    assert fields["created_at"].startswith("2023-11-1")


def test_show_run_lists_its_tasks(fake, fredica):
    run = {
        "id": RUN, "material_id": None, "template": "adhoc", "status": "running", "total_tasks": 2,
        "done_tasks": 1, "created_at": 1_700_000_000.0, "completed_at": None,
        "tasks": [task(ID_A, status="completed", progress=100), task(ID_B, seq=2, status="running")],
    }
    fake.handlers["show"] = {"kind": "run", "object": run}
    printed = json.loads(fredica("show", RUN, "--json").stdout)
    assert printed == run and all(set(TASK_COLUMNS) <= set(t) for t in printed["tasks"])
    fake.handlers["show"] = {"kind": "run", "object": dict(run, task_counts={"completed": 1, "running": 1})}
    out = fredica("show", RUN).stdout
    head, tasks = out.split("\n\n")
    assert head.splitlines()[0].split() == ["id:", RUN]
    assert head.splitlines()[-1] == "tasks: 2 (1 running, 1 completed)"  # the counts, not the task objects
    assert [line.split()[0] for line in tasks.splitlines()] == ["ID", ID_A[:8], ID_B[:8]]
    assert fake.requests[-1] == ("show", {"id": RUN, "tasks_limit": 50})


def test_show_unknown_id_exits_1(fake, fredica):
    fake.handlers["show"] = Refuse("UnknownTask", "no task or run has id nope")
    result = fredica("show", "nope")
    assert (result.exit_code, result.stderr) == (1, "error: no task or run has id nope\n")


# --- cancel, pause, resume ----------------------------------------------------------------------


def ok_result(target: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"id": target, "ok": True, "message": message, **extra}


def refused_result(target: str, message: str, kind: str = "InvalidTransition") -> dict[str, Any]:
    return {"id": target, "ok": False, "message": message, "kind": kind}


def test_cancel_prints_the_daemons_line_for_each_id(fake, fredica):
    fake.handlers["cancel"] = {"results": [
        ok_result(ID_A, f"cancelled {ID_A}, and the 9999 tasks that depend on it", dependents=9999),
        ok_result(RUN, f"run {RUN}: cancelled 2 tasks, stopping 1 running task"),
    ]}
    result = fredica("cancel", ID_A, RUN[:6])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [f"cancelled {ID_A}, and the 9999 tasks that depend on it",
                                          f"run {RUN}: cancelled 2 tasks, stopping 1 running task"]
    assert fake.requests == [("cancel", {"ids": [ID_A, RUN[:6]]})]


def test_a_refused_id_is_an_error_line_and_exit_1_and_the_others_are_still_reported(fake, fredica):
    fake.handlers["hold"] = {"results": [
        ok_result(ID_A, f"held {ID_A}"),
        refused_result("nope", "no task has id nope", "UnknownTask"),
        refused_result(ID_B, f"task {ID_B} is running: only a waiting task can be held"),
    ]}
    result = fredica("hold", ID_A, "nope", ID_B)
    assert result.exit_code == 1
    assert result.stdout == f"held {ID_A}\n"
    assert result.stderr.splitlines() == ["error: no task has id nope",
                                          f"error: task {ID_B} is running: only a waiting task can be held"]


def test_pause_and_resume(fake, fredica):
    fake.handlers["pause"] = {"results": [ok_result(ID_A, f"paused {ID_A}", is_paused=True)]}
    fake.handlers["resume"] = {"results": [ok_result(ID_A, f"resumed {ID_A}", is_paused=False)]}
    assert fredica("pause", ID_A).stdout == f"paused {ID_A}\n"
    assert fredica("resume", ID_A).stdout == f"resumed {ID_A}\n"
    assert fake.requests == [("pause", {"ids": [ID_A]}), ("resume", {"ids": [ID_A]})]


def test_pausing_what_cannot_be_paused_exits_1(fake, fredica):
    fake.handlers["pause"] = {"results": [refused_result(ID_A, f"task {ID_A} is not pausable", "NotPausable")]}
    result = fredica("pause", ID_A)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"error: task {ID_A} is not pausable\n")


@pytest.mark.parametrize("command", ["cancel", "pause", "resume", "hold", "release"])
def test_the_selectors_are_sent_combined(fake, fredica, command):
    fake.handlers[command] = {"results": [ok_result(ID_A, "done")]}
    result = fredica(command, "--run", RUN[:8], "--status", "held", "--status", "waiting", "--type", "echo")
    assert (result.exit_code, result.stdout) == (0, "done\n")
    assert fake.requests == [(command, {"run": RUN[:8], "type": "echo", "status": ["held", "waiting"]})]


def test_priority_takes_a_negative_number_before_the_ids_or_selectors(fake, fredica):
    fake.handlers["priority"] = {"results": [ok_result(ID_A, f"priority -5: {ID_A}")]}
    assert fredica("priority", "-5", ID_A).stdout == f"priority -5: {ID_A}\n"
    assert fredica("priority", "7", "--status", "held").exit_code == 0
    assert fake.requests == [("priority", {"ids": [ID_A], "priority": -5}),
                             ("priority", {"status": ["held"], "priority": 7})]


def test_a_selector_that_matches_nothing_is_one_line_and_exit_1(fake, fredica):
    fake.handlers["release"] = Refuse("NothingSelected", "no task matches --status held")
    result = fredica("release", "--status", "held")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", "error: no task matches --status held\n")


@pytest.mark.parametrize("args", [
    ["hold"],  # neither ids nor selectors
    ["cancel", ID_A, "--run", RUN],  # both
    ["priority", "high", ID_A],
    ["priority"],
    ["release", "--status", "asleep"],
    ["restarts", "recreate"],
    ["restarts", "dismiss", "3", "--all"],
])
def test_bulk_usage_errors_exit_2_and_send_nothing(fake, fredica, args):
    result = fredica(*args)
    assert result.exit_code == 2, result.output
    assert fake.requests == []


# --- reaching the daemon, config ----------------------------------------------------------------


def test_missing_socket_file_exits_3_naming_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "control.sock"
    result = CliRunner().invoke(cli.main, ["status", "--config", write_config(tmp_path, missing)])
    assert result.exit_code == 3
    assert str(missing) in result.stderr and "fredica daemon" in result.stderr
    assert result.stderr.count("\n") == 1


def test_socket_where_nothing_listens_exits_3(tmp_path):
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # the file exists, but nobody listens: ECONNREFUSED
    result = CliRunner().invoke(cli.main, ["--config", write_config(tmp_path, path), "ls"])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: nothing is listening on {path}")


def _answer_once(path: Path, reply: bytes | None) -> threading.Thread:
    """A server for one connection: reads the request, then sends `reply` (raw bytes) or hangs up."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            protocol.read_frame(conn, protocol.MAX_REQUEST)
            if reply is not None:
                conn.sendall(reply)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_daemon_that_closes_without_replying_is_unreachable(tmp_path):
    server = _answer_once(tmp_path / "mute.sock", None)
    with pytest.raises(client.DaemonUnreachable, match="closed the connection without a reply"):
        client.Client(socket_path=tmp_path / "mute.sock").call("status")
    server.join()


@pytest.mark.parametrize(
    "reply, message",
    [
        (protocol.encode({"v": 2, "ok": True, "data": {}}, protocol.MAX_REPLY), "protocol version 2"),
        (protocol.encode({"v": 1}, protocol.MAX_REPLY), "neither ok nor error"),
        (b"\x00\x00\x00\x03[1]", "not a JSON object"),
    ],
)
def test_a_malformed_reply_is_a_protocol_error(tmp_path, reply, message):
    server = _answer_once(tmp_path / "odd.sock", reply)
    with pytest.raises(protocol.ProtocolError, match=message):
        client.Client(socket_path=tmp_path / "odd.sock").call("status")
    server.join()


def test_client_raises_remote_error_with_kind_and_message(fake):
    fake.handlers["status"] = Refuse("Recovering", "the daemon is still recovering")
    with pytest.raises(client.RemoteError) as raised:
        client.Client(socket_path=fake.path).call("status")
    assert (raised.value.kind, raised.value.message) == ("Recovering", "the daemon is still recovering")


def test_config_from_the_environment_and_after_the_subcommand(fake, cfg, monkeypatch, tmp_path):
    fake.handlers["status"] = {"pid": 1, "uptime": 0, "max_workers": 1, "busy_workers": 0, "counts": {}}
    assert CliRunner().invoke(cli.main, ["status", "--config", cfg]).exit_code == 0
    monkeypatch.setenv("FREDICA_CONFIG", cfg)
    assert CliRunner().invoke(cli.main, ["status"]).exit_code == 0
    # An explicit --config wins over the environment.
    monkeypatch.setenv("FREDICA_CONFIG", str(tmp_path / "absent.toml"))
    assert CliRunner().invoke(cli.main, ["status", "--config", cfg]).exit_code == 0
    assert fake.ops == ["status"] * 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("[daemon]\nsockt = 'x'\n", "unknown key 'sockt'"),
        ("[daemon\n", "not valid TOML"),
        (None, "cannot read config"),
    ],
)
def test_a_broken_config_is_one_line_and_exit_1(tmp_path, text, message):
    path = tmp_path / "broken.toml"
    if text is not None:
        path.write_text(text)
    result = CliRunner().invoke(cli.main, ["--config", str(path), "status"])
    assert result.exit_code == 1
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_daemon_command_runs_the_service_in_the_foreground(monkeypatch, tmp_path):
    import daemon

    seen = []
    service = type(sys)("daemon.service")
    service.main = lambda config_path: seen.append(config_path) or 4
    monkeypatch.setitem(sys.modules, "daemon.service", service)
    monkeypatch.setattr(daemon, "service", service, raising=False)
    result = CliRunner().invoke(cli.main, ["daemon", "--config", str(tmp_path / "c.toml")])
    assert (result.exit_code, seen) == (4, [str(tmp_path / "c.toml")])


def test_every_command_has_help_with_a_description():
    runner = CliRunner()
    commands = [[name] for name in cli.main.commands] + [
        ["restarts", "dismiss"], ["restarts", "recreate"], ["db"], ["db", "copy"]
    ]
    for command in commands:
        result = runner.invoke(cli.main, [*command, "--help"])
        assert result.exit_code == 0, command
        assert "--config" in result.stdout, command
        description = result.stdout.split("\n\n")[1].strip()
        assert description and "\n" not in description, command
    read_commands = ["ls", "runs", "show", "restarts", "status"]
    assert all("--json" in runner.invoke(cli.main, [name, "--help"]).stdout for name in read_commands)


def test_importing_the_cli_stays_light():
    code = (
        "import sys, daemon.cli; "
        "heavy = [m for m in ('structlog', 'psutil', 'sqlite3', 'daemon.supervisor') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- logs ---------------------------------------------------------------------------------------


def test_logs_prints_the_last_lines_of_a_task_log(fake, fredica, tmp_path):
    log = tmp_path / "task.log"
    log.write_text("".join(f"line {n}\n" for n in range(1, 101)))
    fake.handlers["log_path"] = {"path": str(log), "active": False, "json_lines": False}
    result = fredica("logs", ID_A, "-n", "3")
    assert (result.exit_code, result.stdout) == (0, "line 98\nline 99\nline 100\n")
    assert fake.requests == [("log_path", {"id": ID_A})]
    assert fredica("logs", ID_A).stdout.splitlines() == [f"line {n}" for n in range(51, 101)]


def test_logs_of_a_long_file_reads_across_blocks(fake, fredica, tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"{n:07d} " + "x" * 200 + "\n" for n in range(2000)) + "unfinished")
    fake.handlers["log_path"] = {"path": str(log), "active": False, "json_lines": False}
    lines = fredica("logs", ID_A, "-n", "400").stdout.splitlines()
    assert len(lines) == 400
    assert lines[0].startswith("0001601 ") and lines[-1] == "unfinished"


def test_logs_of_the_daemon_renders_json_lines(fake, fredica, tmp_path):
    log = tmp_path / "daemon.log"
    records = [
        {"timestamp": "2024-05-01T10:00:00.000Z", "level": "info", "event": "daemon_ready", "pid": 7},
        {"timestamp": "2024-05-01T10:00:01.500Z", "level": "warning", "event": "task_finished",
         "task_id": "t1", "status": "failed", "error": "exit status 2"},
        {"timestamp": "2024-05-01T10:00:02.000Z", "level": "error", "event": "executor_crashed",
         "exception": "Traceback (most recent call last):\nValueError: boom"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json at all\n")
    fake.handlers["log_path"] = {"path": str(log), "active": True, "json_lines": True}
    result = fredica("logs")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "2024-05-01T10:00:00.000Z info    daemon_ready pid=7",
        '2024-05-01T10:00:01.500Z warning task_finished task_id=t1 status=failed error="exit status 2"',
        "2024-05-01T10:00:02.000Z error   executor_crashed",
        "    Traceback (most recent call last):",
        "    ValueError: boom",
        "not json at all",
    ]
    assert fake.requests == [("log_path", {})]
    raw = fredica("logs", "--json", "-n", "1").stdout
    assert raw == "not json at all\n"
    assert fredica("logs", "--json", "-n", "4").stdout.splitlines()[0] == json.dumps(records[0])


@pytest.mark.parametrize("task", [None, ID_A])
def test_logs_are_read_from_their_files_when_the_daemon_is_down(tmp_path, task):
    # When the daemon has stopped is when its log matters most: the CLI knows where it is.
    log_dir = tmp_path / "logs"
    config_file = tmp_path / "down.toml"
    config_file.write_text(f'[daemon]\nsocket = "{tmp_path / "gone.sock"}"\nlog_dir = "{log_dir}"\n')
    path = log_dir / "tasks" / f"{task}.log" if task else log_dir / "daemon.log"
    path.parent.mkdir(parents=True)
    record = {"timestamp": "2024-05-01T10:00:00.000Z", "level": "info", "event": "daemon_stopped"}
    path.write_text(json.dumps(record) + "\n" if not task else "line 1\nline 2\n")
    result = CliRunner().invoke(cli.main, ["--config", str(config_file), "logs", *([task] if task else []), "-n", "5"])
    assert result.exit_code == 0, result.output
    expected = ["line 1", "line 2"] if task else ["2024-05-01T10:00:00.000Z info    daemon_stopped"]
    assert result.stdout.splitlines() == expected
    if task:  # its id is looked up in a database, which is not there either
        assert "no daemon socket" in result.stderr and f"reading {path}" in result.stderr
    else:  # the daemon's log is found without the database
        assert result.stderr == "daemon not running\n"


@pytest.mark.parametrize("system", [True, False], ids=["system config", "user config"])
def test_a_config_naming_systemds_directories_works_from_a_shell(tmp_path, monkeypatch, system):
    # config.example.toml shows database = "$STATE_DIRECTORY/fredica.db": the daemon under
    # systemd has that variable, a shell running `fredica status` does not.
    for name in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg-run"))
    config_file = tmp_path / "config.toml"
    config_file.write_text('[daemon]\nsocket = "$RUNTIME_DIRECTORY/control.sock"\nlog_dir = "$STATE_DIRECTORY/logs"\n')
    service = {"STATE_DIRECTORY": str(tmp_path / "lib"), "RUNTIME_DIRECTORY": str(tmp_path / "run")}
    monkeypatch.setattr(config, "SYSTEM_SERVICE_ENV", service)
    if system:
        monkeypatch.setattr(config, "SYSTEM_CONFIG", config_file)
    # A daemon run by hand on it (or the user service): ~/.local/state/fredica, $XDG_RUNTIME_DIR/fredica.
    by_hand = config.load_for_client(config_file)
    assert by_hand.socket == tmp_path / "xdg-run" / "fredica" / "control.sock"
    assert by_hand.log_dir == tmp_path / "home" / ".local" / "state" / "fredica" / "logs"
    # The system service is running on the system config: its socket is found.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "control.sock").touch()
    found = config.load_for_client(config_file)
    if system:
        assert found.socket == tmp_path / "run" / "control.sock" and found.log_dir == tmp_path / "lib" / "logs"
    else:  # a user's own config never leads to the system service
        assert found == by_hand


def test_with_no_config_the_system_services_socket_is_found(tmp_path, monkeypatch):
    # `sudo -u fredica fredica status`: the service's directories come from its unit, which a
    # shell does not have, and no config file names them.
    for name in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY", "XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    system = {"STATE_DIRECTORY": str(tmp_path / "lib"), "RUNTIME_DIRECTORY": str(tmp_path / "run")}
    monkeypatch.setattr(config, "SYSTEM_SERVICE_ENV", system)
    (tmp_path / "run").mkdir()
    daemon = FakeDaemon(tmp_path / "run" / "control.sock")
    try:
        daemon.handlers["log_path"] = {"path": str(tmp_path / "lib" / "logs" / "daemon.log"), "active": True,
                                       "json_lines": True}
        result = CliRunner().invoke(cli.main, ["logs", "-n", "1"])
        assert daemon.requests == [("log_path", {})] and "no log yet" in result.stderr
    finally:
        daemon.close()
    assert not daemon.failures
    # With the service's socket gone too, the user's own default is what is reported missing.
    (tmp_path / "run" / "control.sock").unlink(missing_ok=True)
    result = CliRunner().invoke(cli.main, ["status"])
    assert result.exit_code == 3 and str(tmp_path / "home") in result.stderr


def test_logs_of_an_unknown_task_exits_1(fake, fredica):
    fake.handlers["log_path"] = Refuse("UnknownTask", "no task has id nope")
    result = fredica("logs", "nope")
    assert (result.exit_code, result.stderr) == (1, "error: no task has id nope\n")


def test_logs_of_a_task_without_a_log_yet(fake, fredica, tmp_path):
    fake.handlers["log_path"] = {"path": str(tmp_path / "none.log"), "active": True, "json_lines": False}
    result = fredica("logs", ID_A)
    assert result.exit_code == 0 and result.stdout == ""
    assert "no log yet" in result.stderr


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


@pytest.mark.parametrize("replace", ["rotate", "truncate"])
def test_logs_follow_a_task_until_it_ends(fake, fredica, tmp_path, replace):
    """The fake daemon plays the task: each time the CLI asks whether the task is still active, it
    first writes the task's next step to the log (appending, rotating or truncating the file), and
    the last answer, after the last line, is "no longer active"."""
    log = tmp_path / "task.log"
    log.write_text("line 1\nline 2\n")
    calls = itertools.count()

    def log_path(args: dict[str, Any]) -> dict[str, Any]:
        step = next(calls)
        if step == 1:
            _append(log, "line 3\nline 4 sta")
        elif step == 2:
            _append(log, "rts here\n")
        elif step == 3 and replace == "rotate":
            os.rename(log, tmp_path / "task.log.1")
            log.write_text("line 5\n")
        elif step == 3:
            log.write_text("line 5\n")  # truncated in place, shorter than before
        elif step == 4:
            _append(log, "line 6, unfinished")
        return {"path": str(log), "active": step < 4, "json_lines": False}

    fake.handlers["log_path"] = log_path
    result = fredica("logs", ID_A, "-f", "-n", "1")
    assert result.exit_code == 0, result.output
    expected = ["line 2", "line 3", "line 4 starts here", "line 5", "line 6, unfinished"]
    assert result.stdout.splitlines() == expected
    assert fake.requests == [("log_path", {"id": ID_A})] * 5


def test_logs_follow_of_a_finished_task_just_prints(fake, fredica, tmp_path):
    log = tmp_path / "task.log"
    log.write_text("done\n")
    fake.handlers["log_path"] = {"path": str(log), "active": False, "json_lines": False}
    result = fredica("logs", ID_A, "-f")
    assert (result.exit_code, result.stdout) == (0, "done\n")
    assert len(fake.requests) == 1


def test_logs_follow_the_daemon_log_until_ctrl_c(fake, fredica, tmp_path, monkeypatch):
    log = tmp_path / "daemon.log"
    log.write_text(json.dumps({"timestamp": "T0", "level": "info", "event": "daemon_ready"}) + "\n")
    fake.handlers["log_path"] = {"path": str(log), "active": True, "json_lines": True}
    claimed = {"timestamp": "T1", "level": "info", "event": "task_claimed", "n": 1}

    def rotate() -> None:
        os.rename(log, tmp_path / "daemon.log.1")
        log.write_text('{"timestamp": "T2", "event": "rotated"}\n')

    steps = iter([lambda: _append(log, json.dumps(claimed) + "\n"), rotate])

    def sleep(seconds: float) -> None:
        # Each poll of the follower plays the next step; after the last one, the user presses Ctrl-C.
        step = next(steps, None)
        if step is None:
            raise KeyboardInterrupt
        step()

    monkeypatch.setattr(cli, "_sleep", sleep)
    result = fredica("logs", "-f")
    assert result.exit_code == 0, result.output
    expected = ["T0 info    daemon_ready", "T1 info    task_claimed n=1", "T2 rotated"]
    assert result.stdout.splitlines() == expected
    assert fake.requests == [("log_path", {})]


# --- watch --------------------------------------------------------------------------------------


def _sequence(replies: list[Any]) -> Callable[[dict[str, Any]], Any]:
    """A handler that answers each call with the next reply, the last one ever after."""
    remaining = list(replies)
    return lambda args: remaining.pop(0) if len(remaining) > 1 else remaining[0]


def _world(states: list[list[dict[str, Any]]]) -> Callable[[dict[str, Any]], Any]:
    """An `ls_pages` handler for `watch`: each refresh (its query of the running tasks) moves to
    the next state, the last one ever after; answers the tasks of the status asked, limited, with
    the total."""
    at = {"state": -1}

    def handler(args: dict[str, Any]) -> dict[str, Any]:
        if args["status"] == "running":
            at["state"] = min(at["state"] + 1, len(states) - 1)
        tasks = [t for t in states[at["state"]]
                 if (t["status"] == "running") == (args["status"] == "running") and args.get("run") in (None, RUN)]
        return {"items": tasks[: args["limit"]], "total": len(tasks)}

    return handler


def test_watch_without_a_terminal_prints_changes_until_nothing_is_active(fake, fredica):
    a = dict(task(ID_A), seq=1)
    b = dict(task(ID_B, type="DOWNLOAD"), seq=2)
    fake.handlers["ls_pages"] = _world(
        [
            [a],
            [dict(a, status="running", progress=10, status_text="step 1")],
            [dict(a, status="running", progress=10, status_text="step 1")],  # no change: no line
            [dict(a, status="running", progress=10, status_text="step 1", is_paused=True)],
            [dict(a, status="running", progress=60), b],
            [dict(b, status="running", progress=50)],
            [],
        ]
    )
    finals = {
        ID_A: dict(a, status="completed", progress=100),
        ID_B: dict(b, status="failed", progress=50, error_type="EXCEPTION"),
    }
    fake.handlers["show"] = lambda args: {"kind": "task", "object": finals[args["id"]]}
    result = fredica("watch")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "[--------------------]   0%  SHELL aaaaaaaa waiting",
        "0 more running, 0 more waiting",
        "[##------------------]  10%  SHELL aaaaaaaa running step 1",
        "0 more running, 0 waiting",
        "[##------------------]  10%  SHELL aaaaaaaa paused step 1",
        "[############--------]  60%  SHELL aaaaaaaa running",
        "[--------------------]   0%  DOWNLOAD bbbbbbbb waiting",
        "0 more running, 0 more waiting",
        "[####################] 100%  SHELL aaaaaaaa completed",
        "[##########----------]  50%  DOWNLOAD bbbbbbbb running",
        "0 more running, 0 waiting",
        "[##########----------]  50%  DOWNLOAD bbbbbbbb failed EXCEPTION",
        "watched 2 tasks: 1 completed, 1 failed",
    ]
    assert [args for op, args in fake.requests if op == "show"] == [{"id": ID_A}, {"id": ID_B}]


def test_watch_asks_only_for_the_rows_it_draws(fake, fredica, monkeypatch):
    monkeypatch.setenv("LINES", "6")  # 4 task lines, the last line, the cursor's
    running = [task(f"{n:08x}-0000-4000-8000-000000000000", seq=n, status="running") for n in range(6)]
    waiting = [task(f"{n:08x}-0000-4000-8000-000000000000", seq=n) for n in range(6, 16)]
    fake.handlers["ls_pages"] = _world([running + waiting, []])
    fake.handlers["show"] = lambda args: {"kind": "task", "object": dict(task(args["id"]), status="completed")}
    lines = fredica("watch").stdout.splitlines()
    assert lines[:5] == [render.progress_line(t) for t in running[:4]] + ["2 more running, 10 waiting"]
    asked = [args for op, args in fake.requests if op == "ls_pages"][:2]
    assert asked == [{"status": "running", "sort": "duration", "limit": 4, "total": True},
                     {"status": "waiting", "sort": "priority", "limit": 0, "total": True}]


def test_watch_with_nothing_active(fake, fredica):
    fake.handlers["ls_pages"] = {"items": [], "total": 0}
    result = fredica("watch")
    assert (result.exit_code, result.stdout) == (0, "nothing to watch\n")


def test_watch_a_run_until_all_its_tasks_end(fake, fredica):
    a, b = task(ID_A), task(ID_B, seq=2)
    fake.handlers["ls_pages"] = _world([[dict(a, status="running", progress=50), b], [dict(b, status="running")], []])
    finals = {ID_A: dict(a, status="completed", progress=100), ID_B: dict(b, status="cancelled", error_type="CANCEL")}

    def show(args: dict[str, Any]) -> dict[str, Any]:
        if args["id"] == RUN:
            return {"kind": "run", "object": {"id": RUN, "status": "running", "tasks": [],
                                              "task_counts": {"completed": 1, "cancelled": 1}}}
        return {"kind": "task", "object": finals[args["id"]]}

    fake.handlers["show"] = show
    result = fredica("watch", RUN)
    assert result.exit_code == 1, result.output  # one of them did not complete (SPEC §14)
    assert result.stdout.splitlines()[-1] == "watched 2 tasks: 1 completed, 1 cancelled"
    assert {args.get("run") for op, args in fake.requests if op == "ls_pages"} == {RUN}


def test_watch_one_task(fake, fredica):
    fake.handlers["show"] = _sequence(
        [{"kind": "task", "object": task(status="running", progress=p)} for p in (10, 10, 90)]
        + [{"kind": "task", "object": task(status="completed", progress=100)}]
    )
    result = fredica("watch", ID_A)
    assert result.stdout.splitlines()[-2:] == [
        "[####################] 100%  SHELL aaaaaaaa completed",
        "watched 1 task: 1 completed",
    ]


def test_watch_screen_redraws_in_place_on_a_terminal(capsys):
    from daemon import watching

    screen = watching.Screen(tty=True)
    running = task(status="running", progress=45, status_text="frame 9")
    screen.update([], [running, task(ID_B, seq=2)], "0 more running, 0 more waiting")
    first = capsys.readouterr().out
    assert first.splitlines() == [
        "[#########-----------]  45%  SHELL aaaaaaaa running frame 9",
        "[--------------------]   0%  SHELL bbbbbbbb waiting",
        "0 more running, 0 more waiting",
    ]
    screen.update([dict(running, status="completed", progress=100)], [task(ID_B, seq=2, status="running")],
                  "0 more running, 0 waiting")
    second = capsys.readouterr().out
    assert second.startswith("\x1b[3A\r\x1b[J")  # back over the three live lines, then clear
    assert second.count("\n") == 3


# --- restarts, status ---------------------------------------------------------------------------


def restart_entry(entry_id: int = 3, **fields: Any) -> dict[str, Any]:
    entry = {
        "id": entry_id, "session_id": "s1", "task_id": ID_A, "task_type": "TRANSCODE_MP4",
        "workflow_run_id": RUN, "material_id": "m1", "status_at_restart": "running",
        "payload": {"input": "a.mkv"}, "progress": 37, "disposition": "pending_review",
        "new_workflow_run_id": None, "created_at": 1_700_000_000.0, "resolved_at": None,
    }
    entry.update(fields)
    return entry


def test_restarts_lists_entries_awaiting_review(fake, fredica):
    fake.handlers["restarts"] = [restart_entry()]
    result = fredica("restarts")
    assert result.exit_code == 0
    header, row = result.stdout.splitlines()
    assert header.split()[:4] == ["ID", "TASK", "TYPE", "WAS"]
    assert row.split()[:7] == ["3", ID_A[:8], "TRANSCODE_MP4", "running", "37%", "pending_review", "-"]
    assert fake.requests == [("restarts", {})]


def test_restarts_all_as_json(fake, fredica):
    entries = [restart_entry(1, disposition="dismissed", resolved_at=1_700_000_100.0), restart_entry()]
    fake.handlers["restarts"] = entries
    result = fredica("restarts", "--all", "--json")
    assert json.loads(result.stdout) == entries
    assert fake.requests == [("restarts", {"all": True})]


def test_restarts_empty(fake, fredica):
    fake.handlers["restarts"] = []
    assert fredica("restarts").stdout == "no interrupted tasks to review\n"


def test_restarts_dismiss_and_recreate(fake, fredica, cfg):
    fake.handlers["restarts_dismiss"] = {"results": [ok_result("3", "dismissed 3", task_id=ID_A)]}
    fake.handlers["restarts_recreate"] = {"results": [
        ok_result("4", f"recreated entry 4 (task {ID_A[:8]}) as {ID_B[:8]} (run {RUN[:8]})", run_id=RUN)]}
    assert fredica("restarts", "dismiss", "3").stdout == "dismissed 3\n"
    result = CliRunner().invoke(cli.main, ["restarts", "recreate", "4", "--config", cfg])
    assert (result.exit_code, result.stdout) == (0, f"recreated entry 4 (task {ID_A[:8]}) as {ID_B[:8]} (run {RUN[:8]})\n")
    assert fredica("restarts", "dismiss", "--all", "--run", RUN[:8]).exit_code == 0
    assert fake.requests == [("restarts_dismiss", {"ids": ["3"]}), ("restarts_recreate", {"ids": ["4"]}),
                             ("restarts_dismiss", {"all": True, "run": RUN[:8]})]


def test_restarts_dismiss_of_an_unknown_entry_exits_1(fake, fredica):
    fake.handlers["restarts_dismiss"] = {"results": [
        refused_result("99", "no restart-log entry has id 99", "UnknownRestartEntry")]}
    result = fredica("restarts", "dismiss", "99")
    assert (result.exit_code, result.stderr) == (1, "error: no restart-log entry has id 99\n")


STATUS = {
    "pid": 4242,
    "uptime": 3725.4,
    "max_workers": 4,
    "busy_workers": 2,
    "counts": {"pending": 3, "running": 2, "completed": 10},
    "version": "0.1.0",
    "socket": "/run/fredica/control.sock",
}


def test_status_readable(fake, fredica):
    fake.handlers["status"] = STATUS
    result = fredica("status")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "pid      4242",
        "uptime   1h 02m",
        "workers  2 busy of 4",
        "tasks    3 pending, 0 claimed, 2 running, 10 completed, 0 failed, 0 cancelled",
        "version  0.1.0",
        "socket   /run/fredica/control.sock",
    ]
    assert fake.requests == [("status", {})]


def test_status_json(fake, fredica):
    fake.handlers["status"] = dict(STATUS, recovering=True)
    printed = json.loads(fredica("status", "--json").stdout)
    assert printed == dict(STATUS, recovering=True)
    assert {"pid", "uptime", "max_workers", "busy_workers", "counts"} <= set(printed)


# --- rendering details --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (42, "42s"), (303, "5m 03s"), (3725, "1h 02m"), (3 * 86400 + 4 * 3600, "3d 04h")],
)
def test_durations(seconds, text):
    assert render.duration(seconds) == text


def test_ages():
    assert [render.age(1000 - delta, 1000) for delta in (5, 300, 7200, 172800)] == ["5s", "5m", "2h", "2d"]


def test_submit_hold_sends_the_task_held_and_for_a_batch_every_line(fake, fredica):
    fake.handlers["submit"] = {"run_id": RUN, "tasks": [{"id": ID_A, "created": True}]}
    assert fredica("submit", "ECHO", "--hold").stdout == f"{ID_A}\n"
    assert fredica("submit", "--batch", "-", "--hold", input='{"type": "ECHO"}\n{"type": "ECHO"}\n').exit_code == 0
    assert [args["tasks"] for _, args in fake.requests] == [
        [{"type": "ECHO", "hold": True}], [{"type": "ECHO", "hold": True}, {"type": "ECHO", "hold": True}]]
