"""The Kafka side of consuming: fetch batches, hand them to the processor, commit offsets of terminal records."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from service.adapters.kafka import start_with_backoff, to_source
from service.metrics import Metrics
from service.policy.records import SourceRecord
from service.worker.processor import Processor

log = structlog.get_logger("order_service.consumer")


class ConsumerLoop:
    """Fetches, processes, commits; an offset is committed only after its record's transaction committed."""

    def __init__(
        self,
        processor: Processor,
        metrics: Metrics,
        make_consumer: Callable[[], AIOKafkaConsumer],
        topics: list[str],
        batch_size: int,
    ) -> None:
        self._processor = processor
        self._topics = topics
        self._metrics = metrics
        self._make_consumer = make_consumer
        self._batch_size = batch_size
        self._uncommitted: dict[TopicPartition, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set, then finish the in-flight transaction, commit and return."""
        consumer = self._make_consumer()
        consumer.subscribe(self._topics, listener=_LogAssignments())
        if not await start_with_backoff(consumer.start, stop, "consumer"):
            return
        log.info("consumer_started", topics=self._topics)
        try:
            while not stop.is_set():
                if self._uncommitted:
                    await self._commit(consumer)
                batches = await consumer.getmany(timeout_ms=500, max_records=self._batch_size)
                records = [to_source(record) for partition in batches.values() for record in partition]
                if not records:
                    continue

                async def on_terminal(done: Sequence[SourceRecord]) -> None:
                    for record in done:
                        partition = TopicPartition(record.topic, record.partition)
                        self._uncommitted[partition] = max(self._uncommitted.get(partition, 0), record.offset + 1)
                    await self._commit(consumer)

                with self._metrics.batch_seconds.time():
                    await self._processor.process(records, on_terminal, stop)
        finally:
            if self._uncommitted:
                await self._commit(consumer)
            await consumer.stop()
            log.info("consumer_stopped")

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit what is terminal; on failure keep it and try again later (the inbox makes redelivery safe)."""
        offsets = dict(self._uncommitted)
        try:
            await consumer.commit(offsets)
        except KafkaError as error:
            log.warning("offset_commit_failed", error=type(error).__name__)
            return
        for partition, offset in offsets.items():
            if self._uncommitted.get(partition) == offset:
                del self._uncommitted[partition]


class _LogAssignments(ConsumerRebalanceListener):  # type: ignore[misc]
    """Log the partitions this member owns after each rebalance (operators and tests read it)."""

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        log.info("partitions_revoked", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))
