"""The procrastinate App the PostgreSQL benchmark runs: `procrastinate --app
benchmarks.postgres.procrastinate_app.app worker --concurrency 2`, and the client's defers.

The worker's database comes from $PEER_PROCRASTINATE_URL (a libpq URL);
the tasks mark their end in the file $PEER_MARKER names, as the Huey tasks of benchmarks/peers do
(benchmarks/peers/peer_tasks.py): procrastinate keeps a job's status but no result, and watching
a file's size costs the server nothing while it is measured.

The tasks are `async def`: procrastinate's worker is an asyncio loop, and its `concurrency`
counts coroutines; a sync task would run in a thread of its own (asgiref's sync_to_async)
for nothing. W3's chain is one task that defers the next link before it ends (procrastinate has
no dependencies between jobs), as users of procrastinate chain jobs.
"""

from __future__ import annotations

import os
import time

import procrastinate

from benchmarks.peers import peer_tasks

URL_ENV = "PEER_PROCRASTINATE_URL"


# The worker's database, from its environment; the client replaces the connector with one of
# each instance's database (`App.replace_connector`), the tasks staying the same.
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(URL_ENV, "")))


@app.task(name="noop")
async def noop() -> None:
    peer_tasks.noop_marked()


@app.task(name="stamp")
async def stamp() -> None:
    started = time.time()
    peer_tasks.append_stamp(started)


@app.task(name="link")
async def link(remaining: int) -> None:
    """One link of W3's chain: defers the next (while links remain), then marks its end."""
    if remaining > 1:
        await link.defer_async(remaining=remaining - 1)
    peer_tasks.noop_marked()
