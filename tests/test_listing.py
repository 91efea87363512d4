"""`ls`, `show RUN` and the streamed listing: the store's pages (every sort, across page edges),
the table's columns, width and "more" line (CliRunner against the fake daemon of test_cli), and
`ls_pages` against the real daemon: several frames for many rows, a client that leaves early."""

from __future__ import annotations

import datetime
import json
import socket
import sqlite3
import time
from typing import Any

import pytest

from daemon import client, listing, models, protocol
from daemon.models import TaskStatus
from daemon.store import listing as store_listing
from daemon.store import task_reads, tasks
from daemon.submission import TaskSpec
from tests.conformance import conn  # noqa: F401 (the store's pages on every backend)
from tests.daemon_harness import Daemon
from tests.test_cli import RUN, FakeDaemon, cfg, fake, fredica, isolated_env, task  # noqa: F401 (fixtures)

NOW = 1_800_000_000.0


# --- the store's pages --------------------------------------------------------------------------


def _stored(conn: sqlite3.Connection, count: int = 23) -> list[models.Task]:
    """`count` tasks of mixed priority, type, status and duration, submitted a second apart."""
    for n in range(count):
        specs = [TaskSpec(type=("ECHO", "shell", "Download")[n % 3], priority=n % 4)]
        tasks.submit(conn, specs, now=NOW - 1000 + n)
    stored = task_reads.list_tasks(conn)
    for n, t in enumerate(stored):
        if n % 5 == 0:
            continue  # left pending
        claimed = tasks.claim_ready(conn, NOW, 1)  # in claim order, not `t`: the order does not matter here
        started = tasks.start(conn, claimed[0].id, now=NOW - 500 + 7 * n)
        if n % 5 == 2:
            tasks.complete(conn, started.id, {}, now=NOW - 400 + (n * 13) % 50)
        elif n % 5 == 3:
            tasks.fail(conn, started.id, error="boom", error_type="EXCEPTION", now=NOW - 300)
    return task_reads.list_tasks(conn)


def _expected(found: list[models.Task], sort: str) -> list[str]:
    rank = {s: i for i, s in enumerate([TaskStatus.RUNNING, TaskStatus.CLAIMED, TaskStatus.PENDING,
                                         TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.COMPLETED])}

    def took(t: models.Task) -> float:
        return -1 if t.started_at is None else (t.completed_at or NOW) - t.started_at

    keys = {
        "submitted": lambda t: -t.seq,
        "priority": lambda t: (-t.priority, t.seq),
        "status": lambda t: (rank[t.status], -t.seq),
        "type": lambda t: (t.type.lower(), -t.seq),
        "duration": lambda t: (-took(t), -t.seq),
    }
    return [t.id for t in sorted(found, key=keys[sort])]


@pytest.mark.parametrize("sort", models.TASK_SORTS)
def test_pages_follow_each_sort_across_page_edges(conn, sort):
    found = _stored(conn)
    query = store_listing.TaskQuery(sort=sort, now=NOW)
    pages = list(store_listing.tasks(conn, query, size=4))
    assert [len(p) for p in pages] == [4] * 5 + [3]
    assert [t.id for p in pages for t in p] == _expected(found, sort)
    limited = list(store_listing.tasks(conn, query, limit=6, size=4))
    assert [t.id for p in limited for t in p] == _expected(found, sort)[:6]


def test_filters_and_count(conn):
    found = _stored(conn)
    since = NOW - 1000 + 10
    query = store_listing.TaskQuery(status=["waiting", "failed"], task_type="ECHO", since=since, now=NOW)
    want = [t.id for t in reversed(found) if t.type == "ECHO" and t.created_at >= since
            and t.status in (TaskStatus.PENDING, TaskStatus.CLAIMED, TaskStatus.FAILED)]
    assert want  # the filter leaves some, and takes some away
    assert [t.id for p in store_listing.tasks(conn, query, size=2) for t in p] == want
    assert store_listing.count(conn, query) == len(want)
    assert store_listing.count(conn, store_listing.TaskQuery()) == len(found)


def test_a_page_is_read_when_it_is_asked_for(conn):
    _stored(conn)
    pages = store_listing.tasks(conn, store_listing.TaskQuery(), size=5)
    first = next(pages)
    tasks.submit(conn, [TaskSpec(type="LATE")], now=NOW)  # newer than the first page: never in a later one
    assert len(first) == 5
    assert all(t.type != "LATE" for p in pages for t in p)


# --- the CLI: columns, width, the more line -----------------------------------------------------


def _many(count: int, **fields: Any) -> list[dict[str, Any]]:
    return [task(f"{n:08x}-0000-4000-8000-000000000000", seq=n, **fields) for n in range(count, 0, -1)]


LONG_TEXT = "transcoding frame 1234 of 99999 " * 6  # about 190 characters


def test_ls_ends_with_how_many_more_there_are(fake, fredica):
    fake.handlers["ls_pages"] = {"items": _many(50), "total": 120}
    lines = fredica("ls").stdout.splitlines()
    assert len(lines) == 1 + 50 + 1
    assert lines[-1] == "70 more (--limit N, --all)"


def test_ls_uses_the_terminal_width_and_cuts_only_there(fake, fredica, monkeypatch):
    rows = _many(3, status="running", status_text=LONG_TEXT, started_at=time.time() - 65)
    fake.handlers["ls_pages"] = {"items": rows, "total": 3}
    monkeypatch.setattr(listing, "terminal_width", lambda: 200)
    wide = fredica("ls").stdout.splitlines()
    assert max(len(line) for line in wide) == 200  # wider than 80: the text goes on to the edge
    assert "  1m 05s  " in wide[1]  # the TIME column: how long it has been running
    monkeypatch.setattr(listing, "terminal_width", lambda: 60)
    narrow = fredica("ls").stdout.splitlines()
    assert max(len(line) for line in narrow) == 60
    assert [line.split()[0] for line in narrow] == [line.split()[0] for line in wide]  # the columns before it stay


def test_ls_is_not_cut_when_the_output_is_not_a_terminal(fake, fredica):
    fake.handlers["ls_pages"] = {"items": _many(2, status="running", status_text=LONG_TEXT), "total": 2}
    lines = fredica("ls").stdout.splitlines()  # CliRunner's output is no terminal
    assert all(line.endswith(LONG_TEXT.strip()) for line in lines[1:])
    assert "\x1b" not in "".join(lines)


def test_ls_shows_how_a_task_ended_as_its_status_text(fake, fredica):
    fake.handlers["ls_pages"] = {"items": [
        task(status="failed", error_type="EXCEPTION", error="ValueError: bad\nTraceback ...", status_text="stale"),
        task(status="completed", status_text="stale too"),
    ], "total": 2}
    failed, completed = fredica("ls").stdout.splitlines()[1:]
    assert failed.endswith("EXCEPTION: ValueError: bad") and not completed.endswith("stale too")


def test_ls_since_sends_the_time_it_means(fake, fredica):
    fake.handlers["ls_pages"] = {"items": [], "total": 0}
    before = time.time()
    assert fredica("ls", "--since", "2h", "--sort", "duration").exit_code == 0
    sent = fake.requests[-1][1]
    assert sent["sort"] == "duration" and before - 7200 - 1 <= sent["since"] <= time.time() - 7200
    assert fredica("ls", "--since", "2026-01-31T08:00:00+00:00").exit_code == 0
    assert fake.requests[-1][1]["since"] == datetime.datetime(2026, 1, 31, 8, tzinfo=datetime.timezone.utc).timestamp()


@pytest.mark.parametrize("args", [["--since", "yesterday"], ["--sort", "size"], ["--limit", "5", "--all"]])
def test_ls_refuses_bad_options_before_asking(fake, fredica, args):
    result = fredica("ls", *args)
    assert result.exit_code == 2 and fake.requests == []


def test_parse_since():
    assert listing.parse_since("10m", NOW) == NOW - 600
    assert listing.parse_since("7d", NOW) == NOW - 7 * 86400
    assert listing.parse_since("1.5h", NOW) == NOW - 5400
    local = datetime.datetime(2026, 3, 1, 12, 0).astimezone().timestamp()
    assert listing.parse_since("2026-03-01T12:00", NOW) == local
    with pytest.raises(ValueError, match="neither an age"):
        listing.parse_since("10 parsecs", NOW)


def test_show_run_says_how_many_more_tasks_it_has(fake, fredica):
    run = {"id": RUN, "material_id": None, "template": "adhoc", "status": "running", "total_tasks": 10_000,
           "done_tasks": 9, "created_at": NOW, "completed_at": None, "tasks": _many(50),
           "task_counts": {"completed": 9, "running": 1, "waiting": 9990}}
    fake.handlers["show"] = {"kind": "run", "object": run}
    lines = fredica("show", RUN).stdout.splitlines()
    assert "tasks: 10000 (1 running, 9990 waiting, 9 completed)" in lines
    assert lines[-1] == f"9950 more (fredica ls --run {RUN[:8]} --all)"
    assert sum(1 for line in lines if line.startswith("0000")) == 50


# --- the streamed reply, against the real daemon ------------------------------------------------


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory):
    """A daemon holding 1,300 tasks that never start (its queue paused), in one run."""
    d = Daemon(tmp_path_factory.mktemp("listing") / "d", max_workers=1)
    d.start()
    try:
        d.data("queue_pause", name="default")
        d.data("submit", tasks=[{"type": "ECHO", "payload": {"n": n, "pad": "x" * 200}} for n in range(1300)])
        yield d
    finally:
        d.kill_if_running()


def _frames(d: Daemon, op: str, **args: Any) -> list[dict[str, Any]]:
    """Every frame of one reply, as they come."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(d.socket))
        sock.sendall(protocol.encode(protocol.request(op, **args), protocol.MAX_REQUEST))
        frames, reader = [], protocol.FrameReader(protocol.MAX_REPLY)
        while not frames or frames[-1].get("data", {}).get("more"):
            frames.append(protocol.read_frame(sock, protocol.MAX_REPLY, reader))
        return frames


def test_a_long_listing_comes_a_page_per_frame(busy):
    frames = _frames(busy, "ls_pages", total=True)
    assert all(frame["ok"] for frame in frames)
    sizes = [len(frame["data"]["items"]) for frame in frames]
    assert sizes == [500, 500, 300]  # never the whole listing in one frame
    assert frames[-1]["data"]["total"] == 1300 and "more" not in frames[-1]["data"]
    seqs = [t["seq"] for frame in frames for t in frame["data"]["items"]]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == 1300


def test_the_client_holds_one_page_at_a_time(busy):
    with client.Client(socket_path=busy.socket) as fredica:
        listed = fredica.stream("ls_pages", limit=1200)
        pages = iter(listed.pages)
        first = next(pages)
        # The rest is still on its way: neither the client's buffer nor what it gave holds it.
        assert len(first) == 500 and fredica._frames.buffered < 600 * 1024
        assert sum(len(page) for page in pages) == 700
        assert listed.final == {}
        assert len(fredica.call("ls_pages", sort="priority", status="waiting")) == 1300  # joined, for scripts
        assert fredica.status()["counts"]["pending"] == 1300  # the connection goes on after a stream


def test_a_client_that_leaves_in_the_middle_of_a_stream(busy):
    with client.Client(socket_path=busy.socket) as fredica:
        listed = fredica.stream("ls_pages")
        next(iter(listed.pages))
        listed.close()  # two pages unread: the connection is dropped, not reused
        assert fredica._sock is None
        assert fredica.status()["pid"] == busy.process.pid


def test_ls_json_through_the_cli_is_the_whole_array(busy):
    from click.testing import CliRunner

    from daemon import cli

    result = CliRunner().invoke(cli.main, ["ls", "--json", "--config", str(busy.config)])
    assert result.exit_code == 0
    printed = json.loads(result.stdout)
    assert len(printed) == 1300 and printed[0]["seq"] > printed[-1]["seq"]
    table = CliRunner().invoke(cli.main, ["show", printed[0]["workflow_run_id"], "--config", str(busy.config)])
    lines = table.stdout.splitlines()
    assert "tasks: 1300 (1300 waiting)" in lines and lines[-1].startswith("1250 more (fredica ls --run ")


def test_ls_pages_refusals(busy):
    for args, kind in (({"sort": "size"}, "ProtocolError"), ({"run": "nope"}, "UnknownRun")):
        [frame] = _frames(busy, "ls_pages", **args)
        assert not frame["ok"] and frame["error"]["kind"] == kind, frame
    assert busy.data("status")["pid"] == busy.process.pid


def test_duration_is_measured_to_now(conn):
    tasks.submit(conn, [TaskSpec(type="ECHO")], now=NOW - 100)
    [claimed] = tasks.claim_ready(conn, NOW, 1)
    tasks.start(conn, claimed.id, now=NOW - 90)
    listed = list(store_listing.tasks(conn, store_listing.TaskQuery(sort="duration", now=NOW)))
    assert listing.run_time(listed[0][0].to_dict(), NOW) == "1m 30s"



def test_a_stream_that_fails_half_way_ends_with_the_error(tmp_path):
    from daemon import control
    from daemon.errors import UnknownRun

    def pages():
        yield [{"n": 1}]
        yield [{"n": 2}]
        raise UnknownRun("the run went away")

    server = control.ControlServer(tmp_path / "c.sock", lambda op, args: protocol.Pages(pages()))
    server.bind()
    server.serve()
    try:
        with client.Client(socket_path=tmp_path / "c.sock") as fredica:
            listed = fredica.stream("ls_pages")
            got = []
            with pytest.raises(UnknownRun, match="the run went away"):
                for page in listed.pages:
                    got.append(page)
            assert got == [[{"n": 1}], [{"n": 2}]]  # every page read before the error, then the error
            assert fredica._sock is None  # the stream did not end well: its connection is not reused
    finally:
        server.close()
