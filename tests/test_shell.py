"""The built-in SHELL executor with real commands: output, progress, exit codes, pause, cancel."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon import models
from daemon.errors import PayloadRefused
from daemon.models import TaskStatus
from executors import _process
from executors.shell import ShellExecutor
from tests import media
from tests.conftest import wait_for


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[media.Launcher]:
    launcher = media.Launcher(tmp_path)
    yield launcher
    launcher.close()


def sh(script: str, **payload: Any) -> dict[str, Any]:
    return {"argv": ["sh", "-c", script], **payload}


def pid_in(path: Path) -> int:
    return int(str(wait_for(lambda: media.read_text(path))))


# The script writes its pid (the group leader's) and a background sleep's pid atomically, then
# blocks on the FIFO `go` until the test releases it. Blocking in a builtin, not polling with a
# `sleep` loop: a stop that lands while the shell forks leaves it in "disk sleep", not "stopped".
GROUP_SCRIPT = """
echo $$ > pid.tmp && mv pid.tmp pid
sleep 600 & echo $! > bg.tmp && mv bg.tmp bg
echo started
read line < go
kill $!
echo finished
"""


def group_dir(tmp_path: Path) -> Path:
    """A directory for GROUP_SCRIPT, with its FIFO."""
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / "go")
    return work


def release(work: Path) -> None:
    """Let GROUP_SCRIPT finish: write to its FIFO once the script is reading it."""
    def open_for_writing() -> int | None:
        try:
            return os.open(work / "go", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: the script has not opened the FIFO yet
            return None

    fd = wait_for(open_for_writing)
    assert fd is not None
    os.write(fd, b"go\n")
    os.close(fd)


# --- results ----------------------------------------------------------------------------------------


def test_success_echoes_output_to_the_task_log_and_keeps_the_last_lines(launcher: media.Launcher) -> None:
    child = launcher.launch("SHELL", sh("for i in $(seq 1 30); do echo line $i; done; echo to stderr >&2"))
    result = launcher.finish(child)
    assert result["error"] is None
    last = result["result"]["last_lines"]
    assert result["result"]["exit_code"] == 0 and len(last) == 20
    assert last[0] == "line 12" and last[-2:] == ["line 30", "to stderr"]
    log = child.log_path.read_text()
    assert "line 1\n" in log and "to stderr" in log


def test_a_command_can_handle_sigint_itself(launcher: media.Launcher) -> None:
    # A shell cannot trap a signal that was ignored when it started: the executor must not pass on
    # an ignored SIGINT (it keeps Ctrl-C on the daemon's terminal away by its process group).
    child = launcher.launch("SHELL", sh("trap 'echo trapped' INT; kill -INT $$; echo after"))
    result = launcher.finish(child)
    assert result["error"] is None and result["result"]["last_lines"] == ["trapped", "after"]


def test_argv_runs_without_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "injected"
    argument = f"a; touch {marker} $HOME"
    result, _ = media.run_inline(ShellExecutor(), {"argv": ["echo", argument]})
    assert result.ok and result.result["last_lines"] == [argument]
    assert not marker.exists()


def test_shell_true_runs_the_command_with_cwd_and_env(tmp_path: Path) -> None:
    payload = {
        "command": "echo one | tr a-z A-Z; echo $FREDICA_TEST_VAR; pwd; echo ${HOME:+home is set}",
        "shell": True, "cwd": str(tmp_path), "env": {"FREDICA_TEST_VAR": "from env"},
    }
    result, _ = media.run_inline(ShellExecutor(), payload)
    assert result.ok, result
    assert result.result["last_lines"] == ["ONE", "from env", str(tmp_path), "home is set"]
    unset, _ = media.run_inline(ShellExecutor(), {"command": "echo ${HOME:-unset}", "shell": True, "env": {"HOME": None}})
    assert unset.result["last_lines"] == ["unset"]


def test_progress_comes_from_the_pattern(launcher: media.Launcher) -> None:
    script = "echo starting; echo 10%; echo 'half: 50.7%'; echo 250%; printf 'no newline 99%%'"
    child = launcher.launch("SHELL", sh(script, progress_pattern=r"(?P<percent>\d+(\.\d+)?)%"))
    assert launcher.finish(child)["error"] is None
    progress = [(m["percent"], m["text"]) for m in launcher.messages(child) if m["type"] == "progress"]
    assert progress == [(10, "10%"), (50, "half: 50.7%"), (100, "250%"), (99, "no newline 99%")]


def test_a_first_group_and_carriage_returns_work_too() -> None:
    result, messages = media.run_inline(
        ShellExecutor(), sh(r"printf 'step 1/4\rstep 2/4\rstep 4/4\n'", progress_pattern=r"step (\d)/4")
    )
    assert result.ok and media.progress_of(messages) == [1, 2, 4]
    assert result.result["last_lines"] == ["step 1/4", "step 2/4", "step 4/4"]


def test_a_nonzero_exit_is_exit_code_with_the_last_lines(launcher: media.Launcher) -> None:
    child = launcher.launch("SHELL", sh("echo working; echo 'disk full' >&2; exit 3"))
    result = launcher.finish(child)
    assert result["error_type"] == "EXIT_CODE"
    assert result["error"] == "command exited with code 3: working\ndisk full"


def test_death_by_a_signal_is_named() -> None:
    result, _ = media.run_inline(ShellExecutor(), sh("echo about to die; kill -SEGV $$"))
    assert result.error_type == "SIGNAL"
    assert result.error == "command killed by SIGSEGV: about to die"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"argv": ["fredica-no-such-command-xyz"]}, "command not found: fredica-no-such-command-xyz"),
        ({"argv": ["{tmp}/data.txt"]}, "command not executable (permission denied): {tmp}/data.txt"),
        ({"argv": ["{tmp}/garbage"]}, "command could not be started: [Errno 8] Exec format error"),
        ({"argv": "echo hi"}, "argv must be a non-empty list of strings"),
        ({"argv": []}, "argv must be a non-empty list of strings"),
        ({"argv": ["echo", 3]}, "argv must be a non-empty list of strings"),
        ({"argv": ["echo"], "command": "echo", "shell": True}, "give either argv or command, not both"),
        ({"command": "echo hi"}, "a command string runs only with shell: true"),
        ({"command": "echo hi", "shell": "yes"}, "shell must be true or false"),
        ({"argv": ["echo"], "pausable": 0}, "pausable must be true or false"),
        ({"argv": ["echo"], "shell": True}, "shell: true runs a command string"),
        ({}, "argv (a list of strings) or command (with shell: true) is required"),
        ({"argv": ["echo"], "progress_pattern": "(unclosed"}, "progress_pattern is not a valid regex"),
        ({"argv": ["echo"], "progress_pattern": r"\d+%"}, "progress_pattern needs a group"),
        ({"argv": ["echo"], "cwd": "/no/such/dir"}, "cwd is not a directory: /no/such/dir"),
        ({"argv": ["echo"], "env": {"A": 1}}, "env: the value of A must be a string or null"),
        ({"argv": ["echo"], "env": ["A=1"]}, "env must be an object"),
    ],
)
def test_bad_payloads_and_missing_commands_are_payload_errors(
    payload: dict[str, Any], message: str, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("not a program\n")
    (tmp_path / "garbage").write_bytes(b"\x00\x01\x02 not a program either")
    (tmp_path / "garbage").chmod(0o755)
    if isinstance(payload.get("argv"), list) and payload["argv"] and isinstance(payload["argv"][0], str):
        payload = {**payload, "argv": [payload["argv"][0].replace("{tmp}", str(tmp_path)), *payload["argv"][1:]]}
    message = message.replace("{tmp}", str(tmp_path))
    result, _ = media.run_inline(ShellExecutor(), payload)
    assert result.error_type == models.PAYLOAD_ERROR
    assert message in (result.error or "")


def test_processes_left_in_the_group_are_ended_when_the_command_exits(tmp_path: Path) -> None:
    bg = tmp_path / "bg"
    result, _ = media.run_inline(ShellExecutor(), sh(f"sleep 600 & echo $! > {bg}; echo left it running"))
    assert result.ok and result.result["last_lines"] == ["left it running"]
    wait_for(lambda: media.gone(int(bg.read_text())))


def test_line_splitting() -> None:
    splitter = _process.LineSplitter()
    assert splitter.feed(b"one\ntw") == ["one"]
    assert splitter.feed(b"o\r") == []  # maybe the first half of a CRLF
    assert splitter.feed(b"\nthree\rfour\r\n\xff\n") == ["two", "three", "four", "\ufffd"]
    assert splitter.feed(b"x" * (_process.MAX_LINE + 5)) == ["x" * _process.MAX_LINE]
    assert splitter.flush() == ["xxxxx"] and splitter.flush() == []
    assert splitter.feed(b"last\r") == [] and splitter.flush() == ["last"]


# --- pause and cancel -------------------------------------------------------------------------------


def test_pause_stops_the_whole_group_and_resume_continues(launcher: media.Launcher, tmp_path: Path) -> None:
    work = group_dir(tmp_path)
    child = launcher.launch("SHELL", sh(GROUP_SCRIPT, cwd=str(work)))
    leader, background = pid_in(work / "pid"), pid_in(work / "bg")
    child.pause()
    wait_for(lambda: media.is_stopped(leader) and media.is_stopped(background))
    assert child.is_alive()
    child.resume()
    wait_for(lambda: media.is_running(leader) and media.is_running(background))
    release(work)
    result = launcher.finish(child)
    assert result["error"] is None and result["result"]["last_lines"] == ["started", "finished"]
    log = child.log_path.read_text()
    assert f"paused: process group {leader} stopped" in log and f"process group {leader} continued" in log


# As GROUP_SCRIPT, with a background process in a session of its own (as `setsid`, or a daemon
# that detaches): out of the command's process group.
# The detached process writes its own pid, once it has left the group (`$!` may be read first).
DETACHED_SCRIPT = GROUP_SCRIPT.replace(
    "sleep 600 & echo $! > bg.tmp && mv bg.tmp bg",
    "setsid sh -c 'echo $$ > bg.tmp && mv bg.tmp bg; exec sleep 600' &",
)


def test_pause_and_cancel_reach_what_left_the_group(launcher: media.Launcher, tmp_path: Path) -> None:
    work = group_dir(tmp_path)
    child = launcher.launch("SHELL", sh(DETACHED_SCRIPT, cwd=str(work)))
    leader, detached = pid_in(work / "pid"), pid_in(work / "bg")
    assert os.getpgid(detached) != leader  # it did leave the group
    try:
        child.pause()
        wait_for(lambda: media.is_stopped(leader) and media.is_stopped(detached))
        child.resume()
        wait_for(lambda: media.is_running(leader) and media.is_running(detached))
        child.request_cancel()
        assert launcher.finish(child)["error_type"] == models.CANCELLED
        assert media.gone(detached)
    finally:
        if not media.gone(detached):  # only if an assertion failed: never leave it running
            os.kill(detached, signal.SIGKILL)


def test_an_unpausable_command_is_never_stopped(launcher: media.Launcher, tmp_path: Path) -> None:
    work = group_dir(tmp_path)
    child = launcher.launch("SHELL", sh(GROUP_SCRIPT, cwd=str(work), pausable=False))
    leader = pid_in(work / "pid")
    launcher.wait_message(child, lambda m: m == {"type": "pausable", "pausable": False})
    child.pause()  # a supervisor would refuse it now; the executor ignores it anyway
    release(work)  # only possible if the script is not stopped
    result = launcher.finish(child)
    assert result["error"] is None and result["result"]["last_lines"] == ["started", "finished"]
    assert media.gone(leader) and "stopped" not in child.log_path.read_text()


def test_cancel_kills_the_whole_group(launcher: media.Launcher, tmp_path: Path) -> None:
    work = group_dir(tmp_path)
    child = launcher.launch("SHELL", sh(GROUP_SCRIPT, cwd=str(work)))
    leader, background = pid_in(work / "pid"), pid_in(work / "bg")
    child.request_cancel()
    assert launcher.finish(child)["error_type"] == models.CANCELLED
    assert media.gone(leader) and media.gone(background)


def test_cancel_a_paused_command_that_ignores_sigterm(launcher: media.Launcher, tmp_path: Path) -> None:
    work = group_dir(tmp_path)
    script = "trap '' TERM; echo $$ > pid.tmp && mv pid.tmp pid; read line < go"
    child = launcher.launch("SHELL", sh(script, cwd=str(work)), ref="tests.test_shell:QuickKillShell")
    leader = pid_in(work / "pid")
    child.pause()
    wait_for(lambda: media.is_stopped(leader))
    child.request_cancel()
    assert launcher.finish(child)["error_type"] == models.CANCELLED
    assert media.gone(leader)
    assert "cancel: ending process group" in child.log_path.read_text()


class QuickKillShell(ShellExecutor):
    """SHELL with a short SIGTERM → SIGKILL grace, for the test above."""

    kill_grace = 0.2


# --- end to end through the supervisor --------------------------------------------------------------


def test_end_to_end_through_the_supervisor(tmp_path: Path) -> None:
    sup = media.start_supervisor(tmp_path)
    try:
        ok = media.submit(sup, "SHELL", {"argv": ["echo", "hello from SHELL"]})
        task = media.wait_ended(sup, ok)
        assert task.status is TaskStatus.COMPLETED and task.progress == 100
        assert task.result == {"exit_code": 0, "last_lines": ["hello from SHELL"]}
        assert "hello from SHELL" in sup.settings.task_log(ok).read_text()

        failing = media.submit(sup, "SHELL", sh("echo nope; exit 2"), max_retries=1)
        task = media.wait_ended(sup, failing)
        assert task.status is TaskStatus.FAILED and task.error_type == "EXIT_CODE" and task.retry_count == 1

        with pytest.raises(PayloadRefused, match="a command string runs only with shell: true"):
            media.submit(sup, "SHELL", {"command": "echo hi"}, max_retries=3)  # refused at submit
        bad = media.store_unchecked(sup, "SHELL", {"command": "echo hi"}, max_retries=3)  # stored before that
        task = media.wait_ended(sup, bad)
        assert task.status is TaskStatus.FAILED and task.error_type == models.PAYLOAD_ERROR and task.retry_count == 0

        work = group_dir(tmp_path)
        steered = media.submit(sup, "SHELL", sh(GROUP_SCRIPT, cwd=str(work)))
        leader = pid_in(work / "pid")
        assert sup.pause(steered).is_paused
        wait_for(lambda: media.is_stopped(leader))
        sup.resume(steered)
        wait_for(lambda: media.is_running(leader))
        sup.cancel(steered)
        task = media.wait_ended(sup, steered)
        assert task.status is TaskStatus.CANCELLED
        assert media.gone(leader) and media.gone(int((work / "bg").read_text()))
    finally:
        sup.stop(grace=0, timeout=20)
