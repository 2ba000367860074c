"""The shared state the gauges show (service/worker/gauges.py), read by cheap indexed queries in one transaction.

Each query reads a partial index or a small table (see migrations): cheap whatever the history size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

_QUARANTINE_OPEN = text("SELECT error_code, owner, count(*) FROM quarantine WHERE status = 'open' GROUP BY 1, 2")
_QUARANTINE_OLDEST = text(
    "SELECT extract(epoch FROM now() - min(first_failed_at)) FROM quarantine WHERE status = 'open'"
)
# One pass over the unpublished rows: those waiting for the relay, and those it set aside.
_OUTBOX = text(
    "SELECT count(*) FILTER (WHERE set_aside_at IS NULL),"
    " extract(epoch FROM now() - min(created_at) FILTER (WHERE set_aside_at IS NULL)),"
    " count(*) FILTER (WHERE set_aside_at IS NOT NULL)"
    " FROM outbox WHERE published_at IS NULL"
)
# `sent` only grows with history, so it is not counted here (its rate is orders_effect_outcomes_total);
# the unfinished states are a short range of the (state, kind, next_attempt_at) index.
_EFFECTS = text("SELECT state, count(*) FROM effects WHERE state IN ('pending', 'in_flight', 'uncertain') GROUP BY 1")
_EFFECTS_FAILED = text("SELECT count(*) FROM effects WHERE state = 'failed'")
_UNCERTAIN_OLDEST = text("SELECT extract(epoch FROM now() - min(updated_at)) FROM effects WHERE state = 'uncertain'")
_PARKED = text(
    "SELECT (SELECT count(*) FROM parked),"
    " (SELECT count(*) FROM (SELECT ordering_key FROM parked UNION SELECT ordering_key FROM key_blocks) AS held),"
    " (SELECT count(*) FROM retries)"
)
_RECONCILE = text(
    "SELECT outcome, count(*), extract(epoch FROM max(finished_at)) FROM reconcile_runs"
    " WHERE finished_at > now() - interval '1 day' GROUP BY 1"
)
_REPROCESS = text("SELECT outcome, count(*) FROM reprocess_items GROUP BY 1")

_UNFINISHED_EFFECT_STATES = ("pending", "in_flight", "uncertain")


@dataclass(frozen=True)
class Readings:
    """One reading of every database-derived gauge; an age or a time is 0 when there is nothing to measure."""

    quarantine_open: dict[tuple[str, str], float]  # open records per (error code, owner)
    quarantine_oldest: float  # seconds since the oldest open record first failed
    outbox_pending: float
    outbox_oldest: float  # seconds since the oldest row waiting for the relay was written
    outbox_set_aside: float
    effects: dict[str, float]  # per state: every unfinished state (0 when none) and `failed`
    uncertain_oldest: float  # seconds since the oldest uncertain effect last changed
    parked_records: float
    parked_keys: float  # keys held by a parked record or a quarantined head
    retrying: float
    reconcile_runs: dict[str, float]  # reconciler passes of the last day, per outcome
    reconcile_last: float  # when the last pass of the last day finished (seconds since the epoch)
    reprocess_items: dict[str, float]  # reprocessed items of all runs, per verified outcome


async def read(connection: AsyncConnection) -> Readings:
    """Read every gauge once."""

    async def rows(query: TextClause) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await connection.execute(query)]

    quarantine_open = {(code, owner): _number(count) for code, owner, count in await rows(_QUARANTINE_OPEN)}
    [(quarantine_oldest,)] = await rows(_QUARANTINE_OLDEST)
    [(pending, outbox_oldest, set_aside)] = await rows(_OUTBOX)
    effects = dict.fromkeys(_UNFINISHED_EFFECT_STATES, 0.0)
    effects |= {state: _number(count) for state, count in await rows(_EFFECTS)}
    [(failed,)] = await rows(_EFFECTS_FAILED)
    effects["failed"] = _number(failed)
    [(uncertain_oldest,)] = await rows(_UNCERTAIN_OLDEST)
    [(parked, keys, retrying)] = await rows(_PARKED)
    reconcile = await rows(_RECONCILE)
    return Readings(
        quarantine_open=quarantine_open,
        quarantine_oldest=_number(quarantine_oldest),
        outbox_pending=_number(pending),
        outbox_oldest=_number(outbox_oldest),
        outbox_set_aside=_number(set_aside),
        effects=effects,
        uncertain_oldest=_number(uncertain_oldest),
        parked_records=_number(parked),
        parked_keys=_number(keys),
        retrying=_number(retrying),
        reconcile_runs={outcome: _number(count) for outcome, count, _ in reconcile},
        reconcile_last=max((_number(finished) for _, _, finished in reconcile), default=0.0),
        reprocess_items={outcome: _number(count) for outcome, count in await rows(_REPROCESS)},
    )


def _number(value: Any) -> float:
    """A count or an age from SQL (NULL when there is nothing to measure: 0)."""
    return float(value or 0)
