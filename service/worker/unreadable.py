"""Records the Kafka client cannot decode, skipped by their coordinates (service/worker/consumer.py's fetcher).

A record batch the Kafka client cannot decode (a header name that is not UTF-8): without this, every fetch fails on it
again, for ever.

The client decodes a whole batch to return any of it, and a failed fetch may have moved other partitions past records
it never returned: every partition goes back to the next record the loop took. Then each partition is read alone to
find the one that fails; from its position, each offset the client cannot read is handed to the processor as an
`UNREADABLE_RECORD` (quarantined by its coordinates: read it with another client, e.g. kcat, to see it) until a record
reads again. Records of that batch the client could have read are among them: the client cannot return them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from service.policy.delivery import Delivery

log = structlog.get_logger("consumer")

# Unreadable records skipped in one go on one partition (the next fetch goes on); the wait for each probe.
_MAX_UNREADABLE = 10_000
_PROBE_WAIT_MS = 1_000


async def skip_unreadable(
    consumer: AIOKafkaConsumer,
    fetched_to: dict[TopicPartition, int],
    paused: Callable[[TopicPartition], bool],
    add: Callable[[tuple[str, int], list[Delivery]], None],
    unreadable: Callable[[str, int, int], Delivery],
    take: Callable[[dict[TopicPartition, list[Any]]], None],
) -> None:
    """Skip the records of the batch the client cannot decode: each goes to its lane (`add`) as an `unreadable`
    delivery, and what reads again to `take` (`fetched_to`: where each partition's next record is, moved past them;
    `paused`: whether a partition is paused, so not probed)."""
    try:
        await _skip(consumer, fetched_to, paused, add, unreadable, take)
    except IllegalStateError:
        # A rebalance took a partition meanwhile: the next fetch fails again if the batch is still ours.
        log.info("unreadable_skip_interrupted")


async def _skip(
    consumer: AIOKafkaConsumer,
    fetched_to: dict[TopicPartition, int],
    paused: Callable[[TopicPartition], bool],
    add: Callable[[tuple[str, int], list[Delivery]], None],
    unreadable: Callable[[str, int, int], Delivery],
    take: Callable[[dict[TopicPartition, list[Any]]], None],
) -> None:
    assigned = consumer.assignment()
    for partition in assigned:
        if partition in fetched_to:
            consumer.seek(partition, fetched_to[partition])
        elif not (await consumer.seek_to_committed(partition)).get(partition):
            await consumer.seek_to_beginning(partition)
    for partition in sorted(assigned):
        if paused(partition) or partition not in consumer.assignment():
            continue
        position = await consumer.position(partition)
        high = consumer.highwater(partition)
        if high is not None and position >= high:
            continue  # nothing to read there: not the one that failed, and probing it would only wait
        skipped = 0
        while skipped < _MAX_UNREADABLE:
            try:
                batches = await consumer.getmany(partition, timeout_ms=_PROBE_WAIT_MS, max_records=1)
            except UnicodeDecodeError:
                # Where the client stands now: a rebalance during the probe may have given the partition back
                # from its committed offset, before the records this probe already found unreadable.
                position = await consumer.position(partition)
                add(
                    (partition.topic, partition.partition),
                    [unreadable(partition.topic, partition.partition, position)],
                )
                position += 1
                skipped += 1
                fetched_to[partition] = position
                consumer.seek(partition, position)
                continue
            take(batches)
            break
        if skipped:
            log.warning("unreadable_records", topic=partition.topic, partition=partition.partition, records=skipped)
            break  # found it: the other partitions are fetched as usual
