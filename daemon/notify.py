"""sd_notify over `$NOTIFY_SOCKET`: READY, STATUS, WATCHDOG and STOPPING for systemd `Type=notify`.

The protocol is one datagram of newline-separated KEY=VALUE lines to a Unix socket, so it needs
no library. Watchdog pings come from the supervisor's loop (`tick`), never from a side thread:
a stuck loop stops pinging, and systemd restarts the daemon, which is the point of the watchdog.
"""

from __future__ import annotations

import os
import socket
from typing import Mapping

STATUS_EVERY = 5.0  # seconds between STATUS updates when no watchdog sets the pace


class Notifier:
    """Talks to systemd if it is listening; every method is a cheap no-op otherwise."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        # "@name" is an abstract-namespace socket: a leading NUL byte on the wire.
        self.address = ("\0" + address[1:]) if address and address.startswith("@") else address
        self.watchdog_interval: float | None = None
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        if usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1_000_000
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self.address else None
        self._next_update = 0.0
        self._last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        if self._sock is None or self.address is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError:
            pass  # systemd went away or is restarting: nothing useful to do about it

    def ready(self, status: str) -> None:
        self._last_status = status
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "stopping") -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def tick(self, now: float, status: str) -> None:
        """Called by the loop on every tick: pings the watchdog at half its interval, and keeps
        STATUS current."""
        if self._sock is None or now < self._next_update:
            return
        lines = []
        if self.watchdog_interval is not None:
            lines.append("WATCHDOG=1")
        if status != self._last_status or lines:
            lines.append(f"STATUS={status}")
            self._last_status = status
        if lines:
            self.send(*lines)
        self._next_update = now + self.update_every

    @property
    def update_every(self) -> float:
        return self.watchdog_interval / 2 if self.watchdog_interval is not None else STATUS_EVERY

    def next_update(self) -> float | None:
        """When the loop must tick again for the next ping (None: no watchdog to keep)."""
        return self._next_update if self.watchdog_interval is not None else None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
