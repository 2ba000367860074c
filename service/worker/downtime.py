"""How long this process could not work because its own database or broker was unreachable.

A record's elapsed budget is for the downstream it waits on, not for our own infrastructure: the time it sat through
such an outage does not count against it (service/policy/next_step.py reads `total` at each failure and excuses what
grew since the record's last one). Several rounds may wait out one outage at once: it counts once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class Downtime:
    """A process-wide stopwatch of own-infrastructure outages, in seconds on a monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._inside = 0  # waits under way now
        self._since = 0.0  # when the first of them began
        self._total = 0.0  # outages that ended

    @property
    def total(self) -> float:
        """Seconds of outage so far, the one under way included."""
        return self._total + (self._clock() - self._since if self._inside else 0.0)

    def now(self) -> float:
        """A reading of the stopwatch's clock (for `waiting(since=…)`)."""
        return self._clock()

    @contextlib.contextmanager
    def waiting(self, since: float | None = None) -> Iterator[None]:
        """Count the time inside the block as downtime, from `since` (a `now()` reading: the start of the work that
        found the outage) or from now; once, however many blocks overlap."""
        if self._inside == 0:
            self._since = self._clock() if since is None else min(since, self._clock())
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1
            if self._inside == 0:
                self._total += self._clock() - self._since
