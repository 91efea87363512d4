"""Real executors for the tests: each one exercises one behaviour of the executor subprocess.

Tests observe them through files named in the payload (written atomically, so a reader never sees
half a value) and through their status channel, never by sleeping.
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from daemon import models
from daemon.models import Task
from executors.base import ExecuteResult, TaskContext, TaskExecutor


def write_atomically(path: str | Path, text: str) -> None:
    """Replace the file's content in one step (readers see the old or the new text, never a mix)."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cancelled() -> ExecuteResult:
    return ExecuteResult(error="cancelled", error_type=models.CANCELLED)


class Echo(TaskExecutor):
    """Returns its payload."""

    task_type = "ECHO"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result={"echo": task.payload, "task_id": task.id})


class JsonText(TaskExecutor):
    """Returns its result as a JSON string: the payload's "json" text, else an object's."""

    task_type = "JSON_TEXT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result=task.payload.get("json", '{"text": true}'))


class Counter(TaskExecutor):
    """Counts to `n`, one step per `step` seconds, honouring cancel and pause at every step.

    `count_file` holds the count so far; `state_file` says "paused" just before the executor blocks
    in `wait_if_paused`, and "running" once it continues.
    """

    task_type = "COUNT"
    pausable = True

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        p = task.payload
        count = 0
        for _ in range(int(p.get("n", 10))):
            if ctx.cancelled:
                return _cancelled()
            if not ctx.wait_if_paused(timeout=0):
                write_atomically(p["state_file"], "paused")
                ctx.wait_if_paused()
                write_atomically(p["state_file"], "running")
                if ctx.cancelled:
                    return _cancelled()
            count += 1
            write_atomically(p["count_file"], str(count))
            ctx.progress(100 * count / int(p.get("n", 10)), f"step {count}")
            if ctx.wait_cancelled(float(p.get("step", 0.005))):
                return _cancelled()
        return ExecuteResult(result={"count": count})


class Raising(TaskExecutor):
    """Raises from execute()."""

    task_type = "RAISE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctx.progress(10)
        raise ValueError("boom from the executor")


class ExitAbruptly(TaskExecutor):
    """Leaves with os._exit(3) after printing a last line, sending no result."""

    task_type = "EXIT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        print("about to exit abruptly", flush=True)
        os._exit(int(task.payload.get("code", 3)))


class Segfault(TaskExecutor):
    """Crashes the interpreter with a real segmentation fault."""

    task_type = "SEGFAULT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctypes.string_at(0)
        return ExecuteResult(result={"unreachable": True})


class Hang(TaskExecutor):
    """Ignores cancel (and SIGTERM if `ignore_sigterm`) and sleeps forever; writes `ready_file` first."""

    task_type = "HANG"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        if task.payload.get("ignore_sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_atomically(task.payload["ready_file"], str(os.getpid()))
        threading.Event().wait()
        return ExecuteResult()


class Grandparent(TaskExecutor):
    """Starts `sleep 600` (its pid goes to `pid_file`), then ignores cancel and hangs."""

    task_type = "GRANDCHILD"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        p = task.payload
        if p.get("ignore_sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(["sleep", "600"])
        write_atomically(p["pid_file"], str(grandchild.pid))
        threading.Event().wait()
        return ExecuteResult()


class Flood(TaskExecutor):
    """Sends `n` distinct progress messages as fast as it can, then succeeds."""

    task_type = "FLOOD"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        n = int(task.payload.get("n", 100_000))
        for i in range(n):
            ctx.progress(i % 101, str(i))
        return ExecuteResult(result={"sent": n})


class SelfPause(TaskExecutor):
    """Asks to pause `times` times, each until someone resumes it; `resumed_file` counts the resumes."""

    task_type = "SELF_PAUSE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        p = task.payload
        times = int(p.get("times", 1))
        for i in range(times):
            ctx.request_pause(f"waiting for the user ({i + 1})")
            if "resumed_file" in p:
                write_atomically(p["resumed_file"], str(i + 1))
            if ctx.cancelled:
                return _cancelled()
        return ExecuteResult(result={"resumed": times})


class SelfPauseSelfResume(TaskExecutor):
    """Pauses itself; a helper thread resumes it once it sees the pause (a freed resource)."""

    task_type = "SELF_RESUME"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        def resource_freed() -> None:
            while ctx.wait_if_paused(timeout=0):  # wait until the main thread has paused
                if ctx.wait_cancelled(0.001):
                    return
            ctx.request_resume()

        helper = threading.Thread(target=resource_freed)
        helper.start()
        ctx.request_pause("gpu_oom")
        helper.join()
        ctx.progress(100, "done after self-resume")
        return ExecuteResult(result={"self_resumed": True})


class Upstream(TaskExecutor):
    """Returns what it got as ctx.upstream."""

    task_type = "UPSTREAM"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result={"upstream": ctx.upstream})


class Printer(TaskExecutor):
    """Writes to stdout, stderr, ctx.log, and through a child process, then succeeds."""

    task_type = "PRINT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        print("hello on stdout")
        print("hello on stderr", file=sys.stderr)
        ctx.log.info("hello from ctx.log")
        ctx.log.warning("careful from ctx.log")
        subprocess.run(["sh", "-c", "echo hello from a grandchild; echo grandchild stderr >&2"], check=True)
        return ExecuteResult(result={"printed": True})


class BadResult(TaskExecutor):
    """Returns a result of the kind named by `kind`, each of which is unusable."""

    task_type = "BAD_RESULT"

    def execute(self, task: Task, ctx: TaskContext) -> Any:
        kind = task.payload["kind"]
        if kind == "object":
            return ExecuteResult(result={"x": object()})
        if kind == "nan":
            return ExecuteResult(result={"x": float("nan")})
        if kind == "list":
            return ExecuteResult(result=[1, 2])
        if kind == "bad_json":
            return ExecuteResult(result="{not json")
        if kind == "not_a_result":
            return {"plain": "dict"}
        if kind == "only_error_type":
            return ExecuteResult(error_type=models.PAYLOAD_ERROR)
        raise AssertionError(kind)


class BigResult(TaskExecutor):
    """Returns a result of `size` characters (many pipe writes, reassembled by the reader)."""

    task_type = "BIG_RESULT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result={"blob": "x" * int(task.payload["size"])})


class TogglePausable(TaskExecutor):
    """Declares itself unpausable while running, and reports clamped progress."""

    task_type = "TOGGLE"
    pausable = True

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctx.set_pausable(False)
        ctx.progress(-5)
        ctx.progress(250.7, "over")
        ctx.progress(42.9)
        ctx.progress(42.2)  # the same whole percent and text: not sent again
        return ExecuteResult(result={})


class NotAnExecutor:
    """Has a task_type but is not a TaskExecutor (for the registry tests)."""

    task_type = "NOT_AN_EXECUTOR"


class ProcessState(TaskExecutor):
    """Reports the process it runs in and what its Events say, and prints its task id.

    For processes that run several attempts: each attempt must see a clear cancel Event, a set
    resume Event and its own log, whatever the attempt before it went through.
    """

    task_type = "STATE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        print(f"attempt of {task.id}")
        ctx.log.info("ctx.log of %s", task.id)
        return ExecuteResult(
            result={"pid": os.getpid(), "cancelled": ctx.cancelled, "running": ctx.wait_if_paused(0)}
        )


class FreshProcessState(ProcessState):
    """ProcessState that asks for a process no other attempt has used."""

    task_type = "FRESH_STATE"
    needs_fresh_process = True


class LeaveReporter(TaskExecutor):
    """Leaves a thread behind that keeps reporting progress after the attempt has returned."""

    task_type = "LEAVE_REPORTER"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        def report_forever() -> None:
            percent = 0
            while True:
                percent = (percent + 1) % 100  # a new value each time: never deduplicated
                ctx.progress(percent, "left behind")
                threading.Event().wait(0.001)

        threading.Thread(target=report_forever, daemon=True).start()
        return ExecuteResult(result={"left": "a reporter"})


class StartTime(TaskExecutor):
    """Returns the wall-clock time at which execute() was entered (latency measurements)."""

    task_type = "START_TIME"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        import time

        return ExecuteResult(result={"t": time.time()})


class Garbler(TaskExecutor):
    """Writes garbage on its status channel (as a buggy extension might), then hangs."""

    task_type = "GARBLE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        status_fd = ctx._status._status._fd  # type: ignore[attr-defined]  # the raw pipe, on purpose
        os.write(status_fd, b"\xff\xff\xff\x7fnot a frame")
        threading.Event().wait()
        return ExecuteResult()


class StuckAfterResult(TaskExecutor):
    """Returns its result, but its process then hangs on the way out (a log handler whose flush
    never returns, which the process's final logging.shutdown() calls)."""

    task_type = "STUCK_AFTER_RESULT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        class NeverFlushes(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                pass

            def flush(self) -> None:
                threading.Event().wait()

        logging.getLogger("stuck").addHandler(NeverFlushes())
        if task.payload.get("fail"):
            return ExecuteResult(error="it went wrong", error_type="IO_ERROR")
        return ExecuteResult(result={"pid": os.getpid()})


class Streams(TaskExecutor):
    """Prints and logs through a library's logger, then changes the process's output the way
    `payload["how"]` says: what a later attempt in the same process must not inherit."""

    task_type = "STREAMS"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        print(f"print of {task.id}")
        logging.getLogger("a.library").warning("library warning of %s", task.id)
        how = task.payload.get("how")
        if how == "detach":
            sys.stdout = io.TextIOWrapper(sys.stdout.detach(), encoding="utf-8", line_buffering=True)
        elif how == "wrap_buffer":  # when this wrapper goes, it closes the buffer it wraps
            sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", line_buffering=True)
        elif how == "unflushed":
            print(f"unflushed of {task.id}", end="")
            sys.stdout = io.StringIO()
        elif how == "root_logging":
            logging.basicConfig(force=True, level=logging.DEBUG, stream=io.StringIO())
        elif how == "root_level":
            logging.getLogger().setLevel(logging.ERROR)
        elif how == "handler_level":
            for handler in logging.getLogger().handlers:
                handler.setLevel(logging.CRITICAL)
        elif how == "reconfigure":
            sys.stdout.reconfigure(line_buffering=False)
        return ExecuteResult(result={"line_buffering": sys.stdout.line_buffering})


class Imported(TaskExecutor):
    """Says which of `payload["modules"]` the process running it has imported."""

    task_type = "IMPORTED"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        return ExecuteResult(result={"imported": [m for m in task.payload["modules"] if m in sys.modules]})


class ForgedExit(TaskExecutor):
    """Writes a launcher's "exited" report on its own status channel, then waits for `go_file`."""

    task_type = "FORGE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctx._status.put({"type": "exited", "exitcode": 0, "next_pid": 1})  # type: ignore[attr-defined]
        go = Path(task.payload["go_file"])
        while not go.exists():
            ctx.wait_cancelled(0.01)
        return ExecuteResult(result={})


class LeavesProcesses(TaskExecutor):
    """Starts `sleep 300` twice, one of them in a session of its own (as a daemon detaches), writes
    their pids to `pid_file`, and returns without waiting for them."""

    task_type = "LEAVE"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        plain = subprocess.Popen(["sleep", "300"])
        # `sh` starts the detached one and exits at once: it is orphaned, as a double fork leaves it.
        detached = subprocess.run(
            ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        )
        write_atomically(task.payload["pid_file"], f"{plain.pid} {detached.stdout.strip()}")
        return ExecuteResult(result={})


class InheritedFds(TaskExecutor):
    """Reports the file descriptors a command it starts inherits (close_fds=False, as os.system)."""

    task_type = "FDS"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        # "; true": the shell stays (it would exec ls as its last command) and lists its own fds.
        done = subprocess.run(["sh", "-c", "ls /proc/$$/fd; true"], close_fds=False, capture_output=True, text=True,
                              check=True)
        return ExecuteResult(result={"fds": sorted(int(fd) for fd in done.stdout.split())})


class CrashesLeavingAWorker(TaskExecutor):
    """Forks a worker that keeps its status channel, writes the worker's pid to `pid_file`, and
    dies (os._exit) without a result. The worker would report as if it were the task once
    `go_file` exists."""

    task_type = "CRASH_LEAVING_WORKER"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        pid = os.fork()
        if pid == 0:
            go = Path(task.payload["go_file"])
            while not go.exists():
                threading.Event().wait(0.01)
            ctx._status.put({"type": "progress", "percent": 42, "text": "from a worker of an earlier task"})  # type: ignore[attr-defined]
            os._exit(0)
        write_atomically(task.payload["pid_file"], str(pid))
        os._exit(3)


class DeepResult(TaskExecutor):
    """Returns a result nested far deeper than JSON encoding can go."""

    task_type = "DEEP"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        result: dict[str, Any] = {}
        for _ in range(5000):
            result = {"x": result}
        return ExecuteResult(result=result)


class RawResult(TaskExecutor):
    """Writes the payload's `message` on its status channel as it is, as a hostile executor could
    (no check in between), and exits without another word."""

    task_type = "RAW_RESULT"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        ctx._status.put(task.payload["message"])  # type: ignore[attr-defined]
        sys.stdout.flush()
        os._exit(0)


class OversizedFrame(TaskExecutor):
    """Writes the header of a `size`-byte message on its status channel, then its body, as fast as
    the pipe takes it; writes its pid to `pid_file` first."""

    task_type = "OVERSIZED_FRAME"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        write_atomically(task.payload["pid_file"], str(os.getpid()))
        size = int(task.payload["size"])
        queue = ctx._status._status  # type: ignore[attr-defined]
        queue.put_frame(size.to_bytes(4, "big") + b'{"type":"result","result":{"blob":"')
        chunk = b"x" * 65536
        while True:
            queue.put_frame(chunk)


class LogFlood(TaskExecutor):
    """Prints lines "line <i> xxx..." for i in 1..n (each `width` characters wide) through its
    stdout, or with `direct`, has `seq` write them straight to the fd it inherited; then, with
    `hold_file`, waits for that file to exist (writing `ready_file` first)."""

    task_type = "LOG_FLOOD"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        p = task.payload
        n, width = int(p["n"]), int(p.get("width", 100))
        if p.get("direct"):
            subprocess.run(["seq", "-f", "line %.0f " + "x" * (width - 12), str(n)], check=True)
        else:
            for i in range(1, n + 1):
                print(f"line {i} ".ljust(width, "x"))
        if "hold_file" in p:
            write_atomically(p["ready_file"], "ready")
            while not Path(p["hold_file"]).exists() and not ctx.wait_cancelled(0.01):
                pass
        return ExecuteResult(result={"lines": n})


class Family(TaskExecutor):
    """Starts `sleep 600`, and `sleep 600` in a session of its own (detached), writes their pids to
    `pid_file` (a line each), then waits forever: silently, or reporting progress every 10 ms
    when `chatty`."""

    task_type = "FAMILY"

    def execute(self, task: Task, ctx: TaskContext) -> ExecuteResult:
        child = subprocess.Popen(["sleep", "600"])
        detached = subprocess.Popen(["sleep", "600"], start_new_session=True)
        write_atomically(task.payload["pid_file"], f"{child.pid}\n{detached.pid}\n")
        step = 0
        while True:
            if task.payload.get("chatty"):
                step += 1
                ctx.progress(step % 100, f"step {step}")
            threading.Event().wait(0.01 if task.payload.get("chatty") else None)
