"""What a server said about a downloaded file (ETag, Last-Modified, its length), kept beside it, so
that the next DOWNLOAD of the same output asks "changed since?" instead of keeping it blindly.

Kept in a small JSON file next to the output, `.<name>.validators`, written atomically after the
output's rename. Not an extended attribute: those are missing on some filesystems (FAT, many
network mounts), dropped by many copy and backup tools, and invisible to a user wondering why a
file is or is not fetched again; a file beside the output travels with the directory and can be
read or deleted by hand. It also records the output's size and modification time as they were
after the rename, so validators are used only for the very file they describe: an output that
someone replaced or edited since is fetched again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Validators:
    """The server's validators for one downloaded output, and which file they describe."""

    url: str
    etag: str | None
    last_modified: str | None
    size: int  # the output's length (the server's Content-Length, or the total of its ranges)
    mtime_ns: int  # the output's, right after it was written
    sha256: str

    @property
    def usable(self) -> bool:
        """Whether a conditional request can be made with them (a length alone cannot)."""
        return bool(self.etag or self.last_modified)

    def conditional_headers(self) -> dict[str, str]:
        """If-None-Match and If-Modified-Since, for what the server gave (a server that knows
        ETags compares those and ignores the date, RFC 9110 §13.1.3)."""
        headers = {}
        if self.etag:
            headers["If-None-Match"] = self.etag
        if self.last_modified:
            headers["If-Modified-Since"] = self.last_modified
        return headers


def sidecar(output: Path) -> Path:
    """Where the validators of `output` are kept."""
    return output.with_name(f".{output.name}.validators")


def from_headers(headers: Mapping[str, str] | Any) -> tuple[str | None, str | None]:
    """(ETag, Last-Modified) of a response, None for what it lacks; a weak ETag (`W/"..."`) is kept
    as it came: If-None-Match compares weakly."""
    etag = (headers.get("ETag") or "").strip() or None
    last_modified = (headers.get("Last-Modified") or "").strip() or None
    return etag, last_modified


def load(output: Path, url: str) -> Validators | None:
    """The validators kept for `output` if they describe it as it is now and were given for `url`;
    None otherwise (none kept, unreadable, another URL's, or the file changed since)."""
    try:
        data = json.loads(sidecar(output).read_text())
        found = Validators(**{field.name: data[field.name] for field in dataclasses.fields(Validators)})
        info = output.stat()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if found.url != url or info.st_size != found.size or info.st_mtime_ns != found.mtime_ns:
        return None
    return found


def save(output: Path, url: str, etag: str | None, last_modified: str | None, sha256: str) -> None:
    """Keep what the server said of the output just written; without ETag or Last-Modified there
    is nothing to ask with next time, and an older file of validators goes."""
    path = sidecar(output)
    if not (etag or last_modified):
        path.unlink(missing_ok=True)
        return
    info = output.stat()
    kept = Validators(url, etag, last_modified, info.st_size, info.st_mtime_ns, sha256)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(dataclasses.asdict(kept)))
    os.replace(temporary, path)


def for_existing(output: Path, url: str, log: logging.Logger) -> Validators | None:
    """What to ask the server with about an existing output; None when there is no output, or
    nothing to ask with (it is then downloaded again: keeping it could keep a stale file for ever)."""
    if not output.is_file():
        return None
    kept = load(output, url)
    if kept is None or not kept.usable:
        log.info("%s exists with no ETag or Last-Modified of its server to ask with: downloading it again", output)
        return None
    return kept


def keep(output: Path, url: str, validators: tuple[str | None, str | None], sha256: str, log: logging.Logger) -> None:
    """`save`, for a download that stands without it: a failure is only a warning."""
    try:
        save(output, url, *validators, sha256=sha256)
    except OSError as exc:
        log.warning("cannot keep the server's validators for %s: %s", output, exc)
