"""The built-in SHELL executor: run a command, without a shell unless the payload asks for one.

Payload:

    {"argv": ["prog", "arg", ...]}                 run directly; no shell ever sees the arguments
    {"command": "prog | other", "shell": true}     run with /bin/sh -c, only when shell is true
    optional:
      "cwd": "/dir"                                working directory (must exist)
      "env": {"NAME": "value", "OTHER": null}      merged over the inherited environment; null unsets
      "progress_pattern": "(\\d+)%"                regex searched in each output line; its group
                                                   "percent" (else its first group) is the progress
      "pausable": false                            for commands that must never be stopped (default
                                                   true: pause stops the command's process group)

Result: `{"exit_code": 0, "last_lines": [...]}` (the last 20 lines of output).

Errors: `EXIT_CODE` (non-zero exit; retryable), `SIGNAL` (killed by a signal; retryable),
`PAYLOAD_ERROR` (malformed payload, command not found or not executable, missing working
directory), `CANCELLED`. A task `timeout` is enforced by the supervisor, not here.

stdout and stderr are merged, echoed line by line to the task's log, and searched for progress.
Pause stops the command's whole process group (SIGSTOP) and resume continues it (SIGCONT); cancel
ends the group (SIGTERM, then SIGKILL after `kill_grace` seconds), and what the command started
outside its group with them; see `executors._process`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Mapping

from executors import _process
from executors.base import ExecuteResult, TaskExecutor, check_keys

if TYPE_CHECKING:
    from daemon.models import Task
    from executors.base import TaskContext

LAST_LINES = 20
KNOWN_KEYS = ("argv", "command", "shell", "cwd", "env", "progress_pattern", "pausable", "timeout")

EXIT_CODE = "EXIT_CODE"
SIGNAL = "SIGNAL"


@dataclasses.dataclass(frozen=True)
class ShellCommand:
    """A validated SHELL payload."""

    argv: tuple[str, ...] | None
    command: str | None
    cwd: str | None
    env: dict[str, str] | None  # the full environment, or None to inherit it unchanged
    progress_pattern: re.Pattern[str] | None
    pausable: bool

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], *, check_cwd: bool = True) -> ShellCommand:
        """Check the payload; PayloadError says what is wrong. `check_cwd` False: a cwd need not
        exist yet (at submit, an upstream task may make it)."""
        if not isinstance(payload, Mapping):
            raise _process.PayloadError("the payload must be an object")
        argv, command, shell = payload.get("argv"), payload.get("command"), payload.get("shell", False)
        pausable = payload.get("pausable", True)
        for key, value in (("shell", shell), ("pausable", pausable)):
            if not isinstance(value, bool):
                raise _process.PayloadError(f"{key} must be true or false, not {value!r}")
        if argv is not None and command is not None:
            raise _process.PayloadError("give either argv or command, not both")
        if argv is None and command is None:
            raise _process.PayloadError("argv (a list of strings) or command (with shell: true) is required")
        if argv is not None:
            if shell:
                raise _process.PayloadError("shell: true runs a command string: give command, not argv")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise _process.PayloadError("argv must be a non-empty list of strings")
            if not argv[0]:
                raise _process.PayloadError("argv[0], the program, must not be empty")
            if any("\0" in a for a in argv):
                raise _process.PayloadError("argv must not contain NUL characters")
        else:
            if not isinstance(command, str) or not command.strip():
                raise _process.PayloadError("command must be a non-empty string")
            if not shell:
                # Silently running a string through a shell is how injections happen: opt in.
                raise _process.PayloadError(
                    "a command string runs only with shell: true; or give argv (a list of strings)"
                )
            if "\0" in command:
                raise _process.PayloadError("command must not contain NUL characters")
        return cls(
            argv=tuple(argv) if argv is not None else None,
            command=command,
            cwd=_cwd(payload.get("cwd"), check_cwd),
            env=_environment(payload.get("env")),
            progress_pattern=_pattern(payload.get("progress_pattern")),
            pausable=pausable,
        )


def _cwd(value: Any, exists: bool) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _process.PayloadError("cwd must be a non-empty string")
    if exists and not os.path.isdir(value):
        raise _process.PayloadError(f"cwd is not a directory: {value}")
    return value


def _environment(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _process.PayloadError("env must be an object of NAME: value strings")
    env = dict(os.environ)
    for name, setting in value.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise _process.PayloadError(f"env: invalid variable name {name!r}")
        if setting is None:
            env.pop(name, None)
        elif isinstance(setting, str) and "\0" not in setting:
            env[name] = setting
        else:
            raise _process.PayloadError(f"env: the value of {name} must be a string or null")
    return env


def _pattern(value: Any) -> re.Pattern[str] | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _process.PayloadError("progress_pattern must be a non-empty string")
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise _process.PayloadError(f"progress_pattern is not a valid regex: {exc}") from None
    if "percent" not in pattern.groupindex and pattern.groups < 1:
        raise _process.PayloadError("progress_pattern needs a group: (?P<percent>...) or a first group")
    return pattern


def percent_in(pattern: re.Pattern[str], line: str) -> float | None:
    """The percentage `pattern` finds in `line`, or None."""
    match = pattern.search(line)
    if match is None:
        return None
    text = match.group("percent") if "percent" in pattern.groupindex else match.group(1)
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


class ShellExecutor(TaskExecutor):
    """Runs a command (argv, or a shell command with shell: true); pausable, cancellable."""

    task_type = "SHELL"
    pausable = True
    payload_keys = KNOWN_KEYS
    kill_grace = 3.0  # seconds between SIGTERM and SIGKILL of the command's group on cancel

    @classmethod
    def validate(cls, payload: Mapping[str, Any]) -> None:
        """The payload's keys and values; the cwd is looked for only at run time."""
        check_keys(payload, KNOWN_KEYS)
        ShellCommand.from_payload(payload, check_cwd=False)

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        """Run the command to its end and report its exit status."""
        try:
            spec = ShellCommand.from_payload(task.payload)
        except _process.PayloadError as exc:
            return _process.payload_error(exc)
        unknown = sorted(set(task.payload) - set(KNOWN_KEYS))
        if unknown:  # a task stored before submit refused unknown keys
            ctx.log.warning("SHELL payload keys ignored: %s", ", ".join(unknown))
        if not spec.pausable:
            ctx.set_pausable(False)
        last_lines: collections.deque[str] = collections.deque(maxlen=LAST_LINES)

        def on_line(line: str) -> None:
            print(line, file=sys.stdout)  # the executor's stdout is the task's log
            last_lines.append(line)
            if spec.progress_pattern is not None:
                percent = percent_in(spec.progress_pattern, line)
                if percent is not None:
                    ctx.progress(percent, line)

        try:
            outcome = _process.run(
                ctx,
                spec.command if spec.command is not None else list(spec.argv or ()),
                shell=spec.command is not None,
                on_stdout=on_line,
                cwd=spec.cwd,
                env=spec.env,
                kill_grace=self.kill_grace,
                pausable=spec.pausable,
            )
        except _process.CommandNotStarted as exc:
            return _process.payload_error(exc)
        finally:
            sys.stdout.flush()
        if outcome.cancelled:
            return _process.cancelled_result()
        lines = list(last_lines)
        if outcome.returncode == 0:
            return ExecuteResult(result={"exit_code": 0, "last_lines": lines})
        tail = "\n".join(lines)
        if outcome.returncode < 0:
            error = f"command {_process.describe_returncode(outcome.returncode)}"
            return ExecuteResult(error=f"{error}: {tail}" if tail else error, error_type=SIGNAL)
        error = f"command exited with code {outcome.returncode}"
        if spec.command is not None and outcome.returncode in (126, 127):
            error += " (the shell's code for a command " + (
                "not found)" if outcome.returncode == 127 else "that cannot be executed)"
            )
        return ExecuteResult(error=f"{error}: {tail}" if tail else error, error_type=EXIT_CODE)
