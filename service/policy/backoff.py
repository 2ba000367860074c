"""Backoff: how long to wait before the next try, doubling from a first wait up to a longest one (pure).

Every wait that grows while something keeps failing is this one rule: a record's blocking retries and an effect's
(with equal jitter), a breaker's openings, a quarantine the database refuses, and every process waiting for its
database or broker to come back (`outage_wait`).
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TypeVar

Wait = TypeVar("Wait", float, timedelta)  # seconds, or a timedelta

# How long a process waits for its database or broker to come back: a second, doubled up to half a minute (an
# outage is noticed within that of its end, and a long one costs a log line every 30 s, not a busy loop).
OUTAGE_FIRST_SECONDS = 1.0
OUTAGE_LONGEST_SECONDS = 30.0


def exponential(first: Wait, attempt: int, longest: Wait) -> Wait:
    """The wait before try `attempt + 1`: `first` after the first failure, twice as long after each next one, never
    longer than `longest` (an `attempt` below 1 counts as the first)."""
    wait = first
    # Doubled until the cap, not `first * 2**n`: a large n overflows a timedelta long before the cap applies.
    for _ in range(max(0, attempt - 1)):
        if wait >= longest or wait * 2 <= wait:  # at the cap, or not positive: doubling would not grow it
            break
        wait = wait * 2
    return min(wait, longest)


def equal_jitter(ceiling: Wait, rng: random.Random) -> Wait:
    """A wait between half the ceiling and the ceiling: half fixed, so retries never bunch at zero, half random, so
    that the ones that failed together do not come back together."""
    half = ceiling / 2
    return half + half * rng.random()


def outage_wait(failures: int) -> float:
    """Seconds to wait after `failures` failures in a row to reach the database or the broker."""
    return exponential(OUTAGE_FIRST_SECONDS, failures, OUTAGE_LONGEST_SECONDS)
