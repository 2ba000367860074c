"""Process-wide tuning for the long-running commands: when the cyclic garbage collector runs.

A consumer keeps tens of thousands of fetched records alive in its lanes while it allocates hundreds of
thousands of short-lived objects per round. Those objects are acyclic and freed by reference counting the
moment a round lets go of them; the collector only ever finds the few cycles (exceptions with tracebacks,
finished tasks), a few hundred objects per 100,000 records. Left to its allocation thresholds it kept re-walking
the live records (docs/performance.md), so the long-running commands turn the automatic collector off and
collect on a clock instead.

A collection walks every object alive that was not frozen at start-up: a few milliseconds when little is in
flight, a quarter of a second with a backlog's records in the lanes. So the clock collects when little is
alive (the net count of objects allocated since the last collection is small), and, when it never is, at
least once a minute: the few cycles wait that long at most.
"""

from __future__ import annotations

import asyncio
import gc
import time

from service.stopping import sleep_unless_stopped

COLLECT_EVERY_SECONDS = 10.0  # how often the clock looks
CHEAP_COLLECTION = 50_000  # net objects allocated since the last collection: at most this many, collect now
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
    """Until `stop` is set, every `every` seconds: collect cyclic garbage when at most `cheap` objects were
    allocated (net) since the last collection, or when the last was `at_least_every` seconds ago."""
    last = time.monotonic()
    while not stop.is_set():
        await sleep_unless_stopped(stop, every)
        # With the automatic collector off, the youngest generation's count is the net number of objects
        # allocated since the last collection: about what this one would walk beyond the few survivors.
        if worth_collecting(gc.get_count()[0], time.monotonic() - last, cheap=cheap, at_least_every=at_least_every):
            gc.collect()
            last = time.monotonic()


def worth_collecting(allocated: int, since_last: float, *, cheap: int, at_least_every: float) -> bool:
    """Whether to collect now, `allocated` objects (net) and `since_last` seconds after the last collection."""
    return allocated <= cheap or since_last >= at_least_every
