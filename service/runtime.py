"""Process-wide tuning for the long-running commands: when the cyclic garbage collector runs.

A consumer keeps tens of thousands of fetched records alive in its lanes while it allocates hundreds of
thousands of short-lived objects per round. Those objects are acyclic and freed by reference counting the
moment a round lets go of them; the collector only ever finds the few cycles (exceptions with tracebacks,
finished tasks), a few hundred objects per 100,000 records. Left to its allocation thresholds it kept re-walking
the live records (docs/performance.md), so the long-running commands turn the automatic collector off and
collect on a clock instead.

A collection walks every object alive that was not frozen at start-up: next to nothing when little is in flight,
a long pause with a backlog's records in the lanes. So the clock collects when few objects are alive, and, when
many always are, at least once a minute: the few cycles wait that long at most (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import gc
import time

from service.stopping import sleep_unless_stopped

COLLECT_EVERY_SECONDS = 10.0  # how often the clock looks
CHEAP_COLLECTION = 50_000  # objects a collection would walk: at most this many, collect now
COLLECT_AT_LEAST_EVERY_SECONDS = 60.0  # however many are alive


def tune_garbage_collector() -> None:
    """Move everything built at start-up out of the collector's reach and stop collecting on allocations.

    No `gc.collect()` first: at that point it walks about 100,000 objects for 50 ms of every start and finds a
    few dozen unreachable ones, which are then frozen with the rest.
    """
    gc.freeze()
    gc.disable()


async def collect_garbage(
    stop: asyncio.Event,
    every: float = COLLECT_EVERY_SECONDS,
    *,
    cheap: int = CHEAP_COLLECTION,
    at_least_every: float = COLLECT_AT_LEAST_EVERY_SECONDS,
) -> None:
    """Until `stop` is set, every `every` seconds: collect cyclic garbage when at most `cheap` objects are alive
    (outside the frozen ones), or when the last collection was `at_least_every` seconds ago."""
    last = time.monotonic()
    while not stop.is_set():
        await sleep_unless_stopped(stop, every)
        # Listing them is a small part of walking them; `gc.get_count()` would be free, but it counts allocations
        # less frees since the last collection, whatever their age, not what is alive.
        alive = len(gc.get_objects())
        if worth_collecting(alive, time.monotonic() - last, cheap=cheap, at_least_every=at_least_every):
            gc.collect()
            last = time.monotonic()


def worth_collecting(alive: int, since_last: float, *, cheap: int, at_least_every: float) -> bool:
    """Whether to collect now, with `alive` objects to walk, `since_last` seconds after the last collection."""
    return alive <= cheap or since_last >= at_least_every
