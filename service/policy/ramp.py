"""A ramped reprocess: the records go back in growing batches, each sent only once the one before is verified,
and the first failure stops the run while it has touched few records (ServicePulse's users ask for this: retry
1, 2, 5, 20, … at a time). Pure: the reprocessor (service/worker/reprocess.py) applies what `next_step` says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SCHEDULE = (1, 2, 5, 20, 50, 100)  # the ramp's batch sizes; what remains after them is sent at the run's rate
# The outcomes that let a ramp go on: applied now, applied before, or not sent because an operator changed the
# record meanwhile (not the reprocess's failure). Anything else (failed again, unverified, unexpected duplicate)
# stops it.
PASSING = frozenset({"reprocessed", "noop", "skipped"})


@dataclass(frozen=True)
class Batch:
    """One batch of a ramp: its number (from 1), where it starts in the selection, and its size; `ramped` is
    False for the last, the rest of the selection at the run's rate."""

    number: int
    start: int
    size: int
    ramped: bool = True

    @property
    def stage(self) -> str:
        """Its name in the run's items (`ramp 3`; the rest is the `main` stage)."""
        return f"ramp {self.number}" if self.ramped else "main"


@dataclass(frozen=True)
class Settled:
    """What became of one item of a batch: its failure id, outcome and detail."""

    failure_id: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class Stop:
    """The ramp stops: why, naming the batch and the first item that failed."""

    reason: str


@dataclass(frozen=True)
class Done:
    """Every batch went through."""


def plan(total: int, schedule: Sequence[int] = SCHEDULE) -> tuple[Batch, ...]:
    """The batches of a selection of `total` records: the schedule's sizes while records remain, then the rest
    as one last batch."""
    batches: list[Batch] = []
    start = 0
    for size in schedule:
        if start >= total:
            break
        batches.append(Batch(len(batches) + 1, start, min(size, total - start)))
        start += size
    if start < total:
        batches.append(Batch(len(batches) + 1, start, total - start, ramped=False))
    return tuple(batches)


def next_step(
    batches: Sequence[Batch], settled: Sequence[Sequence[Settled]], stopped: str | None = None
) -> Batch | Stop | Done:
    """What a ramp does once `settled` holds the outcomes of its first batches (in order): send the next batch,
    stop (a ramped batch had a failure, named first, or the run's own thresholds stopped the last batch:
    `stopped`), or end."""
    if settled:
        batch = batches[len(settled) - 1]
        # The rest goes at the run's rate under its own thresholds (`stopped`), as a run without a ramp does.
        failed = next((item for item in settled[-1] if item.outcome not in PASSING), None) if batch.ramped else None
        where = f"batch {batch.number} of {len(batches)} ({batch.size} record{'s' if batch.size != 1 else ''})"
        if failed is not None:
            detail = f" ({failed.detail})" if failed.detail else ""
            return Stop(f"ramp {where}: {failed.failure_id} {failed.outcome.replace('_', ' ')}{detail}")
        if stopped is not None:
            return Stop(f"ramp {where}: {stopped}")
    if len(settled) < len(batches):
        return batches[len(settled)]
    return Done()
