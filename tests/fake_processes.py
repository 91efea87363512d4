"""Fake executor processes: the real kinds (`LauncherProcess`, `ReusedProcess`, `EventLoopProcess`)
with the operating system taken out, so that a test steps the supervisor with `tick(now)` and
decides, at the `now` it chooses, what each "executor" says and when it exits.

What is real: every decision the supervisor's side makes (the kinds' own `takes_another`,
`route`, `watch`, `settled`, `usable`, `attempt_token`, `drain`, `assign`'s bookkeeping, the
launcher's report handling), the pipes between the two sides and their framing (status messages
are written with `executors.channel.encode` into a real pipe the real `StatusReader` reads;
assignments are pickled down a real pipe and read back; control commands are the real framed
bytes), and the sentinel (a pipe whose write end closes when the fake "process" exits).

What is scripted instead of run: the executor. It does nothing by itself: the test makes it send
messages (`progress`, `result`, `send`), exit (`exit`), and says how it takes signals
(`on_sigterm`: die, as a Python process does by default, or ignore; SIGKILL always kills). What
it was told is in `commands` ("assign", "cancel", "pause", "resume", "SIGTERM", "SIGKILL",
"dismiss"), in order. No pid is real (they are above any pid_max), and no signal is sent.

Where the real processes do something of their own, the fake does the same by default:
- a launcher's fork exits once it has sent its result, and the launcher reports that exit (with
  its next fork's pid) on its report pipe, after the result (`lingers=True`: the fork stays,
  stuck in its own shutdown, until killed);
- a reused process exits after the result of the attempt it was told is its last, and an idle
  process exits when its assignment pipe is closed (`dismiss`), unless `lingers`;
- an event-loop process's messages name their attempt; its heartbeat (`{"type": "alive"}`) is
  sent only when the test calls `heartbeat` (its loop never beats by itself here).

The behaviour that lives in the processes themselves (forking, the fork server, signals reaching
a process tree, executors' own cancel and pause handling, flooding, garbling) is tested against
real processes elsewhere: tests/test_supervisor.py, tests/test_processes.py, tests/test_event_loop.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from multiprocessing.connection import Connection
from typing import Any, Iterator

import psutil

from daemon.engine.executor_processes import (
    EventLoopProcess, ExecutorContext, ExecutorProcess, LauncherProcess, ReusedProcess,
)
from executors import assignment, channel

# Above the largest pid_max Linux allows (2**22): no fake can ever name a real process.
FIRST_PID = 2**22 + 1


class FakeOsProcess:
    """What `multiprocessing` would give for the process: its pid, sentinel and exit status."""

    def __init__(self, pid: int, owner: Scripted) -> None:
        self.pid = pid
        self._owner = owner
        self.sentinel, self._sentinel_writer = os.pipe()
        self.exitcode: int | None = None

    def exited(self, code: int) -> None:
        if self.exitcode is None:
            self.exitcode = code
            os.close(self._sentinel_writer)

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for: a fake exits only when the test (or a signal) says."""

    def kill(self) -> None:
        self._owner.record("SIGKILL", "process")
        self._owner.process_exit(-signal.SIGKILL)

    def close(self) -> None:
        os.close(self.sentinel)


class Scripted:
    """The scripted side of a fake process, mixed in before its real kind (see the module docstring)."""

    # Set by `FakeProcesses.start` (the dataclass fields belong to the real kind).
    commands: list[tuple[Any, ...]]
    sent: list[assignment.Assignment]
    on_sigterm: str  # "die" or "ignore"
    lingers: bool
    _writers: dict[str, Any]
    _readers: dict[str, Any]
    _pids: Iterator[int]
    fork_exitcode: int | None  # the current fork's exit (a launcher), None while it runs

    # --- what the supervisor calls, with the operating system taken out ---------------------------

    def assign(self, task: Any, executor_ref: str, upstream: Any, log_path: Any, **options: Any) -> str:
        token = super().assign(task, executor_ref, upstream, log_path, **options)  # type: ignore[misc]
        message = self._readers["assignments"].recv()  # as the real process reads it
        self.sent.append(message)
        self.record("assign", token, task.id)
        self.fork_exitcode = None
        if self.assignments is None:  # type: ignore[attr-defined]
            self._readers.pop("assignments").close()
        return token

    def _command(self, kind: str, token: str | None, reason: str | None = None) -> None:
        super()._command(kind, token, reason)  # type: ignore[misc]
        for command in self._readers["control"].drain(None):
            self.record(command["type"], command["attempt"], *([command["reason"]] if "reason" in command else []))

    def _root(self) -> psutil.Process | None:
        return None  # never a real process: `_signal_tree` is faked below

    def _signal_tree(self, sig: signal.Signals) -> None:
        self.record(sig.name, "attempt")
        if sig is signal.SIGKILL or self.on_sigterm == "die":
            self.attempt_exit(-sig)

    def dismiss(self, timeout: float = 2.0) -> None:
        self.record("dismiss")
        if self.assignments is not None:  # type: ignore[attr-defined]
            self.assignments.close()  # type: ignore[attr-defined]
            self.assignments = None
        if not self.lingers and self.is_alive():  # type: ignore[attr-defined]
            self.process_exit(0)  # its assignment pipe closed: it exits
        super().dismiss(timeout)  # type: ignore[misc]

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        if self._closed:  # type: ignore[attr-defined]
            for name in list(self._writers):
                os.close(self._writers.pop(name))
            if "assignments" in self._readers:
                self._readers.pop("assignments").close()
            self._readers["control"].close()

    # --- what the test makes the executor do ----------------------------------------------------

    def record(self, *command: Any) -> None:
        self.commands.append(command)

    def told(self, kind: str) -> list[tuple[Any, ...]]:
        """The commands of `kind` it got, in order."""
        return [command for command in self.commands if command[0] == kind]

    def send(self, message: dict[str, Any], token: str | None = None) -> None:
        """The attempt sends `message` on its status channel (an event-loop process's names its
        attempt: `token`, else its latest)."""
        if self.holds_many:  # type: ignore[attr-defined]
            message = {**message, "attempt": token or self.attempt_token}  # type: ignore[attr-defined]
        os.write(self._writers["status"], channel.encode(message))

    def progress(self, percent: int, text: str | None = None, token: str | None = None) -> None:
        self.send({"type": "progress", "percent": percent, "text": text}, token)

    def result(self, result: Any = None, *, error: str | None = None, error_type: str | None = None,
               token: str | None = None) -> None:
        """The attempt sends its result; a fork (a launcher's) or a last attempt's process then
        exits with 0, as the real ones do, unless it `lingers`."""
        self.send({"type": "result", "result": result, "error": error, "error_type": error_type}, token)
        if not self.lingers and (self.kind == "fresh" or (self.kind == "reused" and self.last)):  # type: ignore[attr-defined]
            self.attempt_exit(0)

    def heartbeat(self) -> None:
        """An event-loop process's loop says it is alive."""
        os.write(self._writers["status"], channel.encode({"type": "alive"}))

    def attempt_exit(self, code: int) -> None:
        """The attempt's process exits with `code` (< 0: killed by that signal): a launcher's
        fork, reported by the launcher, which forks the next; otherwise the process itself."""
        if self.kind != "fresh":
            self.process_exit(code)
            return
        if self.fork_exitcode is not None or not self.is_alive():  # type: ignore[attr-defined]
            return
        self.fork_exitcode = code
        self.attempt_pid = next_pid = next(self._pids)
        os.write(self._writers["reports"], channel.encode({"type": "exited", "next_pid": next_pid, "exitcode": code}))

    def process_exit(self, code: int) -> None:
        """The executor process itself exits (a launcher's fork with it): its channels close."""
        if self.process.exitcode is not None:  # type: ignore[attr-defined]
            return
        if self.kind == "fresh" and self.fork_exitcode is None:
            self.fork_exitcode = code
        for name in list(self._writers):
            os.close(self._writers.pop(name))
        self.process.exited(code)  # type: ignore[attr-defined]


@dataclasses.dataclass(eq=False)
class FakeLauncher(Scripted, LauncherProcess):
    """A fake launcher: each attempt "runs" in a fork with a pid of its own."""


@dataclasses.dataclass(eq=False)
class FakeReused(Scripted, ReusedProcess):
    """A fake process that runs several attempts itself."""


@dataclasses.dataclass(eq=False)
class FakeEventLoop(Scripted, EventLoopProcess):
    """A fake event-loop process: holds many attempts, beats only when told."""


FAKES: dict[str, type[ExecutorProcess]] = {"fresh": FakeLauncher, "reused": FakeReused, "event_loop": FakeEventLoop}


class FakeProcesses:
    """The `start_process` a test gives the Supervisor: starts fakes, and keeps them all."""

    def __init__(self, *, on_sigterm: str = "die", lingers: bool = False) -> None:
        self.started: list[Any] = []
        self.on_sigterm, self.lingers = on_sigterm, lingers  # what each new fake starts with
        self._pids = itertools.count(FIRST_PID)

    def __call__(self, context: ExecutorContext | None, kind: str) -> ExecutorProcess:
        return self.start(kind)

    def start(self, kind: str) -> Any:
        # Plain pipes, as multiprocessing makes them on Linux; our ends as Connections, as the
        # real kinds hold them.
        assignments_in, assignments_fd = os.pipe()
        control_in, control_fd = os.pipe()
        status_fd, status_writer = os.pipe()
        for fd in (assignments_fd, control_fd):
            os.set_blocking(fd, False)
        assignments, control = Connection(assignments_fd, readable=False), Connection(control_fd, readable=False)
        pid = next(self._pids)
        fake: Any = FAKES[kind](
            process=None, status=channel.StatusReader(Connection(status_fd, writable=False)), control=control, pid=pid,  # type: ignore[arg-type]
            create_time=None, assignments=assignments, sentinel_exact=True,
        )
        fake.process = FakeOsProcess(pid, fake)
        fake.commands, fake.sent = [], []
        fake.on_sigterm, fake.lingers, fake.fork_exitcode = self.on_sigterm, self.lingers, None
        fake._pids = self._pids
        fake._readers = {"assignments": Connection(assignments_in, writable=False), "control": channel.StatusReader(Connection(control_in, writable=False))}
        fake._writers = {"status": status_writer}
        if kind == "fresh":
            reports_fd, fake._writers["reports"] = os.pipe()
            fake.reports = channel.StatusReader(Connection(reports_fd, writable=False))
            fake.attempt_pid = next(self._pids)  # its first fork, announced
        self.started.append(fake)
        return fake

    def of_kind(self, kind: str) -> list[Any]:
        return [fake for fake in self.started if fake.kind == kind]

    def running(self, task_id: str) -> Any:
        """The fake last given an attempt of `task_id`."""
        return next(fake for fake in reversed(self.started) if any(c[:1] == ("assign",) and c[2] == task_id
                                                                       for c in fake.commands))

    def close_all(self) -> None:
        """End every fake still open (a test's teardown)."""
        for fake in self.started:
            fake.process_exit(-signal.SIGKILL)
            fake.close()

