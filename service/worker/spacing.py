"""How often a worker claims at a steady rate: a claim that came back short (no backlog) is followed by the next
no sooner than `SPACING_SECONDS` after it started; a full one (a backlog) at once.

Each claim pays a transaction (and, for the relay, a produce request) whatever it finds. Taking the next batch as
soon as the last one was written made the claims follow how fast a lane could go around, not the load, and two
lanes woken by the same insert both claimed, one of them nothing. The consumer's rounds are spaced the same way
(service/worker/consumer.py). A row waits at most this long more; docs/performance.md has what it saves.
"""

from __future__ import annotations

import asyncio
import time

from service.stopping import wait_unless_stopped

SPACING_SECONDS = 0.02


class Spacing:
    """The turns of the claims of one kind in one process: whichever lane (task) claims next waits for its turn,
    and takes it before it claims: of two idle lanes woken by the same insert, one claims at once and the other a
    spacing later, taking what came meanwhile."""

    def __init__(self, seconds: float = SPACING_SECONDS) -> None:
        self._seconds = seconds
        self._not_before = 0.0
        self._moved = asyncio.Event()  # set when a full claim brings the next turn forward

    async def turn(self, stop: asyncio.Event) -> None:
        """Wait until the next claim may start (or `stop` is set), then take the turn: the next one after this
        waits for the spacing, unless this claim reports itself `full`."""
        while (delay := self._not_before - time.monotonic()) > 0 and not stop.is_set():
            self._moved.clear()
            await wait_unless_stopped(stop, self._moved, delay)
        self._not_before = time.monotonic() + self._seconds

    def full(self) -> None:
        """The claim just made came back full: there is a backlog, and the next claim may start at once."""
        self._not_before = time.monotonic()
        self._moved.set()
