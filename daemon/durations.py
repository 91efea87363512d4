"""Lengths of time as people write them: `90s`, `30m`, `12h`, `7d`, `2w` (and `0`)."""

from __future__ import annotations

import re

from daemon.errors import BadDuration  # noqa: F401 (re-exported: this module's errors live in the catalogue)

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
# Far beyond any sensible age, and still far from what a float of Unix seconds can hold.
LONGEST = 100 * 365 * 86400.0


def parse(text: str) -> float:
    """Seconds in `text`: a number with one unit of s, m, h, d, w; a bare number is seconds.
    BadDuration (one line, naming the text) for anything else."""
    match = _DURATION.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise BadDuration(f"{text!r} is not a duration: write a number and a unit, like 90s, 30m, 12h, 7d or 2w")
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if seconds > LONGEST:
        raise BadDuration(f"{text!r} is longer than 100 years")
    return seconds
