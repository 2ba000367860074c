"""The offsets a consumer loop owes the broker (service/worker/consumer.py): what its rounds made terminal, committed
in the background one commit at a time, and the lag that follows from what was committed.

An offset is owed only after its record left the processor (its transaction committed); a failed commit keeps it
owed and is tried again (the inbox makes a redelivery safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from service.metrics import Metrics
from service.worker.lanes import Lanes

log = structlog.get_logger("consumer")

# Why Kafka errors happened, in one line (service/explain.py, `kafka_reason`), with the operation when it is known.
Reason = Callable[[list[BaseException], str | None], str | None]


class Offsets:
    """The offsets owed and committed per partition; `wake` is called when a commit leaves some owed (rounds that
    ended while it was out), as nothing else may wake the loop to commit them."""

    def __init__(self, wake: Callable[[], None], reason: Reason) -> None:
        self._wake = wake
        self._reason = reason
        self._owed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._committing: asyncio.Task[None] | None = None
        self._next_lag_report = 0.0

    @property
    def owed(self) -> bool:
        """Whether some offset is owed."""
        return bool(self._owed)

    def settle(self, settled: Mapping[tuple[str, int], int]) -> None:
        """The next offsets of lanes whose records became terminal."""
        for lane, offset in settled.items():
            partition = TopicPartition(*lane)
            self._owed[partition] = max(self._owed.get(partition, 0), offset)

    def commit_soon(self, consumer: AIOKafkaConsumer) -> None:
        """Commit in the background while the next round runs; one commit in flight at a time."""
        if self._committing is None or self._committing.done():
            self._committing = asyncio.create_task(self.commit(consumer))

    async def commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit what is owed; on failure keep it and try again later (the inbox makes redelivery safe)."""
        assigned = consumer.assignment()
        for partition in [p for p in self._owed if p not in assigned]:
            del self._owed[partition]  # revoked: its next owner commits it
        offsets = dict(self._owed)
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as error:
            log.warning("offset_commit_failed", error=type(error).__name__, reason=self._reason([error], None))
            return
        for partition, offset in offsets.items():
            self._committed[partition] = offset
            if self._owed.get(partition) == offset:
                del self._owed[partition]
        if self._owed:
            # Rounds that ended while this commit was out: nothing else may wake the loop to commit theirs (after a
            # drain's last round, not for half a second). A failed commit is tried again at the next wake-up.
            self._wake()

    async def finish(self, consumer: AIOKafkaConsumer) -> None:
        """On the way out: wait for the commit in flight, then commit what is still owed."""
        if self._committing is not None:
            await self._committing
        if self._owed:
            await self.commit(consumer)

    async def hand_over(self, consumer: AIOKafkaConsumer, revoked: set[TopicPartition], within: float) -> None:
        """Before revoked partitions go: commit what is owed on them (after the commit in flight, bounded)."""
        if any(partition in revoked for partition in self._owed):
            if self._committing is not None and not self._committing.done():
                await asyncio.wait([self._committing], timeout=within)
            await self.commit(consumer)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Revoked partitions: their next owner commits them."""
        for partition in partitions:
            self._owed.pop(partition, None)
            self._committed.pop(partition, None)

    def report_lag(self, consumer: AIOKafkaConsumer, lanes: Lanes, metrics: Metrics, now: float) -> None:
        """Lag per partition: the broker's high watermark minus our committed offset (once a second)."""
        if now < self._next_lag_report:
            return
        for partition in consumer.assignment():
            lag = self.lag(consumer, lanes, partition)
            if lag is None:
                continue  # nothing fetched from it yet: report it as soon as something is
            self._next_lag_report = now + 1.0
            metrics.consumer_lag.labels(topic=partition.topic, partition=str(partition.partition)).set(lag)

    def lag(self, consumer: AIOKafkaConsumer, lanes: Lanes, partition: TopicPartition) -> int | None:
        """The broker's high watermark at the last fetch minus what was committed (before the first commit: the
        first record held, else nothing); None before the first fetch. No request is made."""
        high = consumer.highwater(partition)
        if high is None:
            return None
        done = self._committed.get(partition)
        if done is None:
            head = lanes.head((partition.topic, partition.partition))
            done = head.record.offset if head else high
        return int(max(0, high - done))
