"""Ids as people type them: a whole id, or a unique prefix of at least 4 characters (SPEC §14).

One function turns what was typed into the full id of a task or a workflow run. Each table is
asked with a range on its unique id index (`id >= prefix AND id < upper`), not a LIKE scan, so
that a lookup costs the same in a table of ten tasks or of a million.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
from typing import Literal

from daemon.errors import AmbiguousId, IdTooShort, UnknownRun, UnknownTask

Kind = Literal["task", "run"]
MIN_PREFIX = 4
# How many candidates an ambiguous prefix lists: enough to choose from, one line still.
SHOWN_CANDIDATES = 10

_TABLES: dict[Kind, str] = {"task": "task", "run": "workflow_run"}
_NOUNS: dict[tuple[Kind, ...], str] = {
    ("task", "run"): "task or workflow run",
    ("task",): "task",
    ("run",): "workflow run",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """What an id or prefix named: a task or a workflow run, by its full id."""

    kind: Kind
    id: str


def resolve(conn: sqlite3.Connection, given: str, kinds: tuple[Kind, ...] = ("task", "run")) -> Resolved:
    """The one task or run (of `kinds`) whose id is `given` or starts with it.

    A whole id wins over longer ids that start with it (a submitter may choose short ids). Raises
    UnknownTask/UnknownRun when nothing matches, IdTooShort for a prefix under 4 characters and
    AmbiguousId, listing the candidates, when more than one task or run matches.
    """
    exact = [(kind, given, status) for kind in kinds if (status := _status(conn, kind, given)) is not None]
    if len(exact) == 1:
        return Resolved(exact[0][0], given)
    if not exact and len(given) < MIN_PREFIX:
        raise IdTooShort(f"id {given!r} is too short: give at least {MIN_PREFIX} characters of it")
    candidates = exact or _starting_with(conn, given, kinds)
    if not candidates:
        error = UnknownRun if kinds == ("run",) else UnknownTask
        raise error(f"no {_NOUNS[kinds]} has id {given}")
    if len(candidates) == 1:
        kind, full_id, _ = candidates[0]
        return Resolved(kind, full_id)
    shown = ", ".join(f"{kind} {full_id} ({status})" for kind, full_id, status in candidates[:SHOWN_CANDIDATES])
    more = len(candidates) - SHOWN_CANDIDATES
    tail = f" and {more}+ more" if more > 0 else ""
    raise AmbiguousId(f"id {given} is ambiguous: it matches {shown}{tail}")


def task_id(conn: sqlite3.Connection, given: str) -> str:
    """The full id of the one task that `given` names (see `resolve`)."""
    return resolve(conn, given, ("task",)).id


def run_id(conn: sqlite3.Connection, given: str) -> str:
    """The full id of the one workflow run that `given` names (see `resolve`)."""
    return resolve(conn, given, ("run",)).id


def _status(conn: sqlite3.Connection, kind: Kind, full_id: str) -> str | None:
    row = conn.execute(f"SELECT status FROM {_TABLES[kind]} WHERE id = ?", (full_id,)).fetchone()
    return None if row is None else row[0]


def _starting_with(conn: sqlite3.Connection, prefix: str, kinds: tuple[Kind, ...]) -> list[tuple[Kind, str, str]]:
    """(kind, id, status) of the ids starting with `prefix`: one more than are shown, at most,
    per table, so that a short prefix in a large table still reads only a few index entries."""
    low, high = prefix, _upper(prefix)
    found: list[tuple[Kind, str, str]] = []
    for kind in kinds:
        sql = f"SELECT id, status FROM {_TABLES[kind]} WHERE id >= ?"
        params: list[object] = [low]
        if high is not None:
            sql += " AND id < ?"
            params.append(high)
        sql += " ORDER BY id LIMIT ?"
        params.append(SHOWN_CANDIDATES + 1)
        found += [(kind, row[0], row[1]) for row in conn.execute(sql, params)]
    return found


def _upper(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (SQLite's BINARY collation
    orders UTF-8 bytes, which is code point order); None when there is none (all U+10FFFF)."""
    stripped = prefix.rstrip(chr(sys.maxunicode))
    if not stripped:
        return None
    last = ord(stripped[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are not text: the next character is past them
        last = 0xE000
    return stripped[:-1] + chr(last)
