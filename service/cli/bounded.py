"""Flag types with the bounds of service/bounds.py, for typer's `parser=`: a value out of range is one line naming
the flag and exit 2. (Typer's own `float` takes `nan` and `inf`, which pass any `min` and `max`.)"""

from __future__ import annotations

from typing import Any

from service import bounds

MOST_PER_SECOND = 10_000.0  # a reprocess rate: beyond it the consumer, not the token bucket, sets the pace
LONGEST_SECONDS = 86_400.0  # a time budget or a wait given in seconds: a day


def rate(value: Any) -> float:
    """Records per second: from 0.01 to `MOST_PER_SECOND`."""
    return bounds.decimal(str(value), low=0.01, high=MOST_PER_SECOND)


def fraction(value: Any) -> float:
    """A share: from 0 to 1."""
    return bounds.decimal(str(value), low=0, high=1)


def seconds(value: Any) -> float:
    """A time in seconds: from 1 to `LONGEST_SECONDS`."""
    return bounds.decimal(str(value), low=1, high=LONGEST_SECONDS)
