"""Gauges of shared state, read from PostgreSQL by cheap indexed queries at most every `interval` seconds.

Never per scrape: a Prometheus server scraping every second must not turn into a query load. Every
long-running process refreshes them, so any one of them answers the operator's questions on its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.errors import InfrastructureUnavailable
from service.metrics import Metrics
from service.stopping import sleep_unless_stopped
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.gauges")

# Each query reads a partial index or a small table (see migrations): cheap whatever the history size.
_QUERIES = {
    "quarantine": "SELECT error_code, owner, count(*) FROM quarantine WHERE status = 'open' GROUP BY 1, 2",
    "quarantine_oldest": (
        "SELECT extract(epoch FROM now() - min(first_failed_at)) FROM quarantine WHERE status = 'open'"
    ),
    # One pass over the unpublished rows: those waiting for the relay, and those it set aside.
    "outbox": (
        "SELECT count(*) FILTER (WHERE set_aside_at IS NULL),"
        " extract(epoch FROM now() - min(created_at) FILTER (WHERE set_aside_at IS NULL)),"
        " count(*) FILTER (WHERE set_aside_at IS NOT NULL)"
        " FROM outbox WHERE published_at IS NULL"
    ),
    # `sent` only grows with history, so it is not counted here (its rate is orders_effect_outcomes_total);
    # the unfinished states are a short range of the (state, next_attempt_at) index.
    "effects": "SELECT state, count(*) FROM effects WHERE state IN ('pending', 'in_flight', 'uncertain') GROUP BY 1",
    "effects_failed": "SELECT count(*) FROM effects WHERE state = 'failed'",
    "uncertain_oldest": "SELECT extract(epoch FROM now() - min(updated_at)) FROM effects WHERE state = 'uncertain'",
    "parked": (
        "SELECT (SELECT count(*) FROM parked),"
        " (SELECT count(*) FROM (SELECT ordering_key FROM parked UNION SELECT ordering_key FROM key_blocks) AS held),"
        " (SELECT count(*) FROM retries)"
    ),
    "reconcile": (
        "SELECT outcome, count(*), extract(epoch FROM max(finished_at)) FROM reconcile_runs"
        " WHERE finished_at > now() - interval '1 day' GROUP BY 1"
    ),
    "reprocess": "SELECT outcome, count(*) FROM reprocess_items GROUP BY 1",
}

_EFFECT_STATES = ("pending", "in_flight", "uncertain")


class GaugeRefresher:
    """Refreshes the database-derived gauges every `interval` seconds until stopped."""

    def __init__(self, engine: AsyncEngine, metrics: Metrics, interval: float = 10.0) -> None:
        self._engine = engine
        self._metrics = metrics
        self._interval = interval

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh now, then every interval; a database outage only leaves the gauges stale."""
        while not stop.is_set():
            try:
                await self.refresh()
            except InfrastructureUnavailable:
                log.warning("database_unavailable", what="gauges")
            await sleep_unless_stopped(stop, self._interval)

    async def refresh(self) -> None:
        """Read every gauge once."""
        m = self._metrics
        async with UnitOfWork(self._engine) as uow:
            c = uow.connection

            async def rows(name: str) -> list[tuple[Any, ...]]:
                return [tuple(row) for row in await c.execute(text(_QUERIES[name]))]

            m.quarantine_open.clear()
            for code, owner, count in await rows("quarantine"):
                m.quarantine_open.labels(error_code=code, owner=owner).set(_number(count))
            [(oldest,)] = await rows("quarantine_oldest")
            m.quarantine_oldest.set(_number(oldest))
            [(pending, outbox_oldest, set_aside)] = await rows("outbox")
            m.outbox_pending.set(_number(pending))
            m.outbox_oldest.set(_number(outbox_oldest))
            m.outbox_set_aside.set(_number(set_aside))
            states = dict.fromkeys(_EFFECT_STATES, 0.0) | {state: _number(n) for state, n in await rows("effects")}
            for state, count in states.items():
                m.effects.labels(state=state).set(count)
            [(failed,)] = await rows("effects_failed")
            m.effects.labels(state="failed").set(_number(failed))
            [(uncertain,)] = await rows("uncertain_oldest")
            m.uncertain_oldest.set(_number(uncertain))
            [(parked, keys, retrying)] = await rows("parked")
            m.parked_records.set(_number(parked))
            m.parked_keys.set(_number(keys))
            m.retrying.set(_number(retrying))
            last = 0.0
            for outcome, count, finished in await rows("reconcile"):
                m.reconcile_runs.labels(outcome=outcome).set(_number(count))
                last = max(last, _number(finished))
            m.reconcile_last.set(last)
            for outcome, count in await rows("reprocess"):
                m.reprocess_items.labels(outcome=outcome).set(_number(count))


def _number(value: Any) -> float:
    """A count or an age from SQL (NULL when there is nothing to measure: 0)."""
    return float(value or 0)
