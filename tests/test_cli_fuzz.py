"""Hostile input to the `fredica` CLI against the real daemon (SPEC §11, §13): whatever the
arguments, payloads and batch lines hold (lone surrogates, undecodable bytes, NULs, deep nesting,
numbers out of range), the exit status is 0, 1 or 2, never a traceback; a refusal is one line on
stderr and changes nothing.

Hypothesis drives the CLI in-process (click's CliRunner, which passes an undecodable byte of a
command line as Python does: a surrogate escape); a few real processes get the raw bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import cli
from tests.conftest import wait_for
from tests.daemon_harness import Daemon

EXAMPLES = int(os.environ.get("FREDICA_FUZZ_EXAMPLES", "120"))
# Any character, lone surrogates (what an undecodable argv byte becomes) and NULs often.
TEXT = st.text(st.characters(exclude_categories=()) | st.sampled_from(["\udcff", "\ud800", "\x00", "\n", "é"]),
               max_size=10)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=8)
NUMBERS = st.integers(-(2**70), 2**70).map(str) | st.sampled_from(["nan", "inf", "-1", "0", "1e400", "2.5"]) | TEXT
STATUSES = st.sampled_from(["pending", "running", "completed", "failed"]) | TEXT
SUBMIT_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--payload": None,  # drawn by payloads()
    "--priority": NUMBERS,
    "--depends-on": None,  # drawn from the known ids and TEXT
    "--max-retries": NUMBERS,
    "--idempotency-key": TEXT,
    "--material": TEXT,
    "--timeout": NUMBERS,
}


def payloads() -> st.SearchStrategy[str]:
    """What a user types after --payload: JSON (with `\\ud800` escapes, NaN, deep nesting) or not."""
    as_json = st.tuples(JSON, st.booleans()).map(lambda v: json.dumps(v[0], ensure_ascii=v[1]))
    return as_json | TEXT | st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth)


@st.composite
def invocations(draw: st.DrawFn, ids: list[str]) -> tuple[list[str], bytes | None]:
    """A command line (and stdin for a batch) of any command that ends by itself."""
    some_id = st.sampled_from(ids) | TEXT
    command = draw(st.sampled_from(["submit", "batch", "show", "cancel", "pause", "resume", "ls", "runs", "run",
                                    "logs", "restarts", "status"]))
    stdin = None
    if command == "submit":
        args = ["submit", draw(st.sampled_from(["ECHO", "NO_SUCH_TYPE"]) | TEXT)]
        for flag in draw(st.lists(st.sampled_from(sorted(SUBMIT_OPTIONS)), max_size=3)):
            strategy = SUBMIT_OPTIONS[flag]
            if strategy is None:
                strategy = payloads() if flag == "--payload" else some_id
            args += [flag, draw(strategy)]
    elif command == "batch":
        args = ["submit", "--batch", "-"]
        line = st.tuples(st.dictionaries(st.sampled_from(["type", "payload", "depends_on", "key"]) | TEXT,
                                         JSON | some_id, max_size=3), st.booleans())
        lines = draw(st.lists(line.map(lambda v: json.dumps(v[0], ensure_ascii=v[1])) | TEXT, min_size=1, max_size=3))
        # Lone surrogates written as such (bytes that are not UTF-8), or escaped.
        stdin = "\n".join(lines).encode("utf-8", draw(st.sampled_from(["surrogatepass", "backslashreplace"])))
    elif command in ("show", "cancel", "pause", "resume"):
        args = [command, draw(some_id)]
    elif command == "ls":
        args = ["ls", *draw(st.sampled_from([[], ["--json"]]))]
        for flag, values in draw(st.lists(st.sampled_from([("--status", STATUSES), ("--run", some_id),
                                                          ("--type", TEXT), ("--limit", NUMBERS)]), max_size=2)):
            args += [flag, draw(values)]
    elif command == "runs":
        args = ["runs", "--status", draw(STATUSES)]
    elif command == "run":
        args = ["run", draw(TEXT), "--set", draw(TEXT)]
    elif command == "logs":
        args = ["logs", draw(some_id), "-n", draw(NUMBERS)]
    elif command == "restarts":
        args = ["restarts", draw(st.sampled_from(["dismiss", "recreate"])), draw(NUMBERS)]
    else:
        args = ["status"]
    return args, stdin


def snapshot(d: Daemon) -> tuple[Any, ...]:
    """Everything a request could change, once nothing is running (so nothing changes by itself)."""
    wait_for(lambda: not d.data("ls", status=["pending", "claimed", "running"]), timeout=20)
    return d.data("ls"), d.data("runs"), d.data("restarts", all=True)


def test_no_input_makes_a_traceback_and_a_refusal_changes_nothing(daemons) -> None:
    d = daemons().start()
    done = d.wait_task(d.submit("ECHO", payload={"x": 1}), "completed")
    ids = [done["id"], done["workflow_run_id"]]
    runner = CliRunner()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("CI") == "true",
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(invocation=invocations(ids))
    def invoke(invocation: tuple[list[str], bytes | None]) -> None:
        args, stdin = invocation
        before = snapshot(d)
        result = runner.invoke(cli.main, ["--config", str(d.config), *args], input=stdin)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
        assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
        assert "Traceback" not in result.output and "Traceback" not in result.stderr
        if result.exit_code == 1:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        if result.exit_code != 0:
            assert snapshot(d) == before

    invoke()
    assert d.process.poll() is None
    assert "Traceback" not in d.output.read_text()


def fredica_process(d: Daemon, *args: bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The installed command line as a shell runs it, with arguments as raw bytes."""
    return subprocess.run([sys.executable.encode(), b"-m", b"daemon", b"--config", bytes(d.config), *args],
                          input=stdin, capture_output=True, env=d.env(), cwd=d.root, timeout=60)


# What a shell passes: bytes that are not UTF-8 (`$'\xff'`), and `\ud800` escapes in JSON.
RAW_COMMAND_LINES = [
    ([b"show", b"\xff"], None),
    ([b"submit", b"\xff"], None),
    ([b"submit", b"ECHO", b"--material", b"m\xfe"], None),
    ([b"submit", b"ECHO", b"--payload", b'{"a": "\\ud800"}'], None),
    ([b"submit", b"ECHO", b"--payload", b'{"a": "\xff"}'], None),
    ([b"submit", b"--batch", b"-"], b'{"type": "ECHO"}\n{"type": "ECHO", "payload": {"a": "\\ud800"}}\n'),
    ([b"submit", b"--batch", b"-"], b'{"type": "ECHO"}\n{"type": "ECHO\xff"}\n'),
    ([b"run", b"t", b"--set", b"k=\xff"], None),
    ([b"ls", b"--type", b"\xff"], None),
]


def test_undecodable_bytes_on_a_real_command_line_get_one_line(daemons) -> None:
    d = daemons().start()
    before = snapshot(d)
    for args, stdin in RAW_COMMAND_LINES:
        done = fredica_process(d, *args, stdin=stdin)
        assert done.returncode in (1, 2), done
        assert b"Traceback" not in done.stderr
        lines = done.stderr.decode("utf-8", "replace").splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
        assert done.stdout == b""
    assert snapshot(d) == before
