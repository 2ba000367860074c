"""Process-wide tuning for the long-running commands: when the cyclic garbage collector runs.

A consumer keeps tens of thousands of fetched records alive in its lanes while it allocates hundreds of
thousands of short-lived objects per round. Those objects are acyclic and freed by reference counting the
moment a round lets go of them; the collector only ever finds the few cycles (exceptions with tracebacks,
finished tasks), a few hundred objects per 100,000 records. Left to its allocation thresholds it still walks
the young objects each time their net count grows past the threshold: with the defaults (700, 10, 10) it kept
re-walking the live records (a drain ran 26 % faster at 10,000/100/100), and at 10,000/100/100 it still spent
12-15 % of the consumer's CPU in 340 young collections per 150,000 records, collecting 700 objects
(docs/performance.md). So the long-running commands turn the automatic collector off and collect everything
on a clock instead: the cycles of a few seconds wait for the next collection, which walks the live objects
once (tens of milliseconds with a full backlog in flight).
"""

from __future__ import annotations

import asyncio
import gc

from service.stopping import sleep_unless_stopped

COLLECT_EVERY_SECONDS = 10.0


def tune_garbage_collector() -> None:
    """Move everything built at start-up out of the collector's reach and stop collecting on allocations.

    No `gc.collect()` first: at that point it walks about 100,000 objects for 50 ms of every start and finds a
    few dozen unreachable ones, which are then frozen with the rest.
    """
    gc.freeze()
    gc.disable()


async def collect_garbage(stop: asyncio.Event, every: float = COLLECT_EVERY_SECONDS) -> None:
    """Collect cyclic garbage every `every` seconds until `stop` is set (the automatic collector is off)."""
    while not stop.is_set():
        await sleep_unless_stopped(stop, every)
        gc.collect()
