"""A relay in front of the test cluster's Unix socket whose connections can be cut off the way a
network that drops every packet cuts them: both ends stay open, and nothing more gets through in
either direction. The server's session then lives on, holding whatever its transaction holds,
and neither end hears of it: what a frozen PostgreSQL process (SIGSTOP) cannot show, since the
server ends a session whose client has gone as soon as it runs again."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from urllib.parse import quote


class Link:
    """One client's connection through the relay, and its way to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.cut = threading.Event()  # set: nothing more is passed, and nothing is closed

    def relay(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self.cut.is_set():
                data = source.recv(65536)
                if not data or self.cut.is_set():
                    break
                sink.sendall(data)
        if not self.cut.is_set():  # an end closed: pass the close on, as a network does
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class StallingProxy:
    """Listens where libpq looks for a server in `directory` (`.s.PGSQL.5432`) and relays each
    connection to the real server's socket in `server_dir`."""

    def __init__(self, directory: Path, server_dir: Path) -> None:
        self.directory = directory
        self.target = str(server_dir / ".s.PGSQL.5432")
        self.links: list[Link] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(directory / ".s.PGSQL.5432"))
        os.chmod(directory / ".s.PGSQL.5432", 0o777)
        self._listener.listen(16)
        self._closed = False
        self.partitioned = False  # new connections get through to nothing either (`partition`)
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        """`database_url` (the cluster's, for one database) reached through this relay."""
        base, _, query = database_url.partition("?")
        others = [part for part in query.split("&") if part and not part.startswith("host=")]
        return f"{base}?{'&'.join([f'host={quote(str(self.directory))}', *others])}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.target)
            link = Link(client, server)
            if self.partitioned:  # the server never hears of it: a connect that waits in vain
                link.cut.set()
            self.links.append(link)
            threading.Thread(target=link.relay, args=(client, server), daemon=True).start()
            threading.Thread(target=link.relay, args=(server, client), daemon=True).start()

    def cut_all(self) -> None:
        """Every connection made so far stops passing anything; new ones pass as ever."""
        for link in self.links:
            link.cut.set()

    def partition(self) -> None:
        """Cut every connection, and every one made from now on, until `heal`."""
        self.partitioned = True
        self.cut_all()

    def heal(self) -> None:
        """Connections made from now on get through again (those cut stay cut, as TCP's would)."""
        self.partitioned = False

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for link in self.links:
            for sock in (link.client, link.server):
                with contextlib.suppress(OSError):
                    sock.close()
