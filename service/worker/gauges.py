"""Gauges of shared state, read from PostgreSQL by cheap indexed queries at most every `interval` seconds.

Never per scrape: a Prometheus server scraping every second must not turn into a query load. Every
long-running process refreshes them, so any one of them answers the operator's questions on its own.
"""

from __future__ import annotations

import asyncio

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from service.errors import InfrastructureUnavailable
from service.metrics import Metrics
from service.stopping import sleep_unless_stopped
from service.store import gauges
from service.store.uow import UnitOfWork

log = structlog.get_logger("gauges")


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
        async with UnitOfWork(self._engine) as uow:
            readings = await gauges.read(uow.connection)
        m = self._metrics
        m.quarantine_open.clear()
        for (code, owner), count in readings.quarantine_open.items():
            m.quarantine_open.labels(error_code=code, owner=owner).set(count)
        m.quarantine_oldest.set(readings.quarantine_oldest)
        m.outbox_pending.set(readings.outbox_pending)
        m.outbox_oldest.set(readings.outbox_oldest)
        m.outbox_set_aside.set(readings.outbox_set_aside)
        for state, count in readings.effects.items():
            m.effects.labels(state=state).set(count)
        m.uncertain_oldest.set(readings.uncertain_oldest)
        m.parked_records.set(readings.parked_records)
        m.parked_keys.set(readings.parked_keys)
        m.retrying.set(readings.retrying)
        for outcome, count in readings.reconcile_runs.items():
            m.reconcile_runs.labels(outcome=outcome).set(count)
        m.reconcile_last.set(readings.reconcile_last)
        for outcome, count in readings.reprocess_items.items():
            m.reprocess_items.labels(outcome=outcome).set(count)
