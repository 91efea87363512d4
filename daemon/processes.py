"""Processes recognised by pid and start time (SPEC §9), and ended with their whole trees.

A start is a time that no change of the wall clock moves. Executors are recognised long after
their start was recorded (stop escalation, startup recovery). psutil's create_time() is the boot
time as the kernel reckons it *now* plus the clock ticks from boot to the start, so stepping the
wall clock (an NTP correction soon after boot, `date -s`) moves every process's create_time by
the step, and a process recorded before it would no longer be recognised: a stuck task never
ended, a leftover executor left running. Here a start is the same ticks counted from a boot time
fixed once per boot and database: the first one a daemon on that database read, kept there.
"""

from __future__ import annotations

import os
import signal
import sqlite3

import psutil

from daemon.store import boots

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
START_TOLERANCE = 0.01  # a start is counted in clock ticks (1/100 s)

_boot_time: float | None = None  # this boot's, as the database keeps it (anchor_to)


def boot_id() -> str:
    """This boot's id, which the kernel makes anew at every boot."""
    with open("/proc/sys/kernel/random/boot_id") as handle:
        return handle.read().strip()


def anchor_to(conn: sqlite3.Connection) -> float:
    """Count starts from the boot time the database keeps for this boot (recorded now if it has
    none). The daemon calls it once, before it records or looks for any process."""
    global _boot_time
    _boot_time = boots.boot_time(conn, boot_id(), psutil.boot_time())
    return _boot_time


def start_time(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch as of the anchored boot time (to
    1/100 s); None if there is no such process."""
    global _boot_time
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count fields after its end.
    fields = stat[stat.rindex(b")") + 2:].split()
    ticks = int(fields[19])  # field 22, starttime
    if _boot_time is None:  # no daemon anchored it (a test, a script): this process's first look
        _boot_time = psutil.boot_time()
    return _boot_time + ticks / TICKS_PER_SECOND


def descendants(root: psutil.Process) -> list[psutil.Process]:
    """Every descendant of `root`, collected before any of them is signalled: a parent that dies
    first would leave its children reparented and out of reach of `children()`."""
    try:
        return root.children(recursive=True)
    except psutil.Error:
        return []


def send(sig: signal.Signals, procs: list[psutil.Process]) -> None:
    """Signal each process; one already gone, or whose pid now names another, is skipped."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass  # already gone, or a reused pid psutil refuses to touch


def end_process_trees(roots: list[psutil.Process], grace: float) -> int:
    """SIGTERM each root and its descendants, SIGKILL what is left after `grace`; how many there were.

    For processes found again after a restart (no ExecutorProcess to steer them).
    """
    procs = {proc.pid: proc for root in roots for proc in (root, *descendants(root))}
    send(signal.SIGTERM, list(procs.values()))
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    send(signal.SIGKILL, alive)
    psutil.wait_procs(alive, timeout=grace)
    return len(procs)


def find_leftover(pid: int, create_time: float) -> psutil.Process | None:
    """The process `pid` if it still exists and started at `create_time` (as `start_time`
    gave it); None for a reused pid."""
    try:
        proc = psutil.Process(pid)  # psutil checks, when it signals, that the pid still names it
    except psutil.Error:
        return None
    started = start_time(pid)
    if started is None or abs(started - create_time) > START_TOLERANCE:
        return None
    return proc
