"""Durations as the contract writes them (`500ms`, `30s`, `5m`, `1h`, `7d`), and time ranges (points in time as
operators write them are read by service/bounds.py)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
FORMAT_HINT = "a duration like 500ms, 30s, 5m, 1h or 7d"


def parse_duration(text: str) -> timedelta:
    """Parse `30s` into a timedelta; raise ValueError naming the accepted format otherwise."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not {FORMAT_HINT}")
    try:
        return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    except OverflowError:
        raise ValueError(f"{text!r} is too long a duration") from None


def format_duration(value: timedelta) -> str:
    """Write a timedelta back in the shortest exact contract form (used in topic names: `orders.retry.30s`)."""
    ms = round(value.total_seconds() * 1000)
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def time_range(since: datetime | None, until: datetime | None) -> tuple[datetime | None, datetime | None]:
    """A [since, until) range, checked: ValueError when it ends before it starts."""
    if since is not None and until is not None and until < since:
        raise ValueError(f"until ({until.isoformat()}) is before since ({since.isoformat()})")
    return since, until
