"""The outbox relay: publishes unpublished outbox rows to Kafka, then marks them published.

At-least-once: a relay that dies between Kafka's acknowledgement and its commit publishes the rows again,
with the same `event-id` / `failure-id` headers, so readers deduplicate on those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.kafka import start_with_backoff
from service.config import Settings
from service.errors import InfrastructureUnavailable
from service.faults import crash_point
from service.metrics import Metrics
from service.stopping import sleep_unless_stopped
from service.store import outbox
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.relay")

_IDLE_POLL_SECONDS = 0.2


class Relay:
    """Claims rows with FOR UPDATE SKIP LOCKED; several relays may run at once."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        metrics: Metrics,
        make_producer: Callable[[], AIOKafkaProducer],
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._metrics = metrics
        self._make_producer = make_producer

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set; a broker or database outage is waited out, never a crash."""
        delay = 1.0
        while not stop.is_set():
            producer = self._make_producer()
            if not await start_with_backoff(producer.start, stop, "relay"):
                return
            log.info("relay_started")
            try:
                while not stop.is_set():
                    published = await self.publish_once(producer)
                    delay = 1.0
                    if published == 0:
                        await sleep_unless_stopped(stop, _IDLE_POLL_SECONDS)
            except InfrastructureUnavailable:
                log.warning("database_unavailable", retry_in_seconds=delay)
            except KafkaError as error:
                # A fresh producer after a broker outage: the old one's idempotence state may be stale.
                log.warning("kafka_publish_failed", error=type(error).__name__, retry_in_seconds=delay)
            finally:
                await producer.stop()
            await sleep_unless_stopped(stop, delay)
            delay = min(delay * 2, 30.0)

    async def publish_once(self, producer: AIOKafkaProducer) -> int:
        """Publish one claimed batch; return how many rows were published."""
        async with UnitOfWork(self._engine) as uow:
            rows = await outbox.claim(uow.connection, self._settings.relay_batch_size)
            if not rows:
                return 0
            sent = []
            for row in rows:
                key = row.key.encode() if row.key is not None else None
                sent.append(await producer.send(row.topic, row.payload, key=key, headers=list(row.headers)))
            await asyncio.gather(*sent)
            crash_point("after-publish", self._settings.fault_crash_at)
            await outbox.mark_published(uow.connection, [row.id for row in rows])
            await uow.commit()
        self._metrics.published.inc(len(rows))
        return len(rows)
