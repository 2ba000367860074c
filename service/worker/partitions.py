"""What a consumer loop says of its partitions in its heartbeat (service/policy/heartbeat.py): from what it already
holds (its assignment, the high watermarks of its last fetches, its commits, its lanes and pauses), with no request
to the broker."""

from __future__ import annotations

from collections.abc import Collection

from aiokafka import AIOKafkaConsumer, TopicPartition

from service.policy.heartbeat import PartitionView
from service.worker.lanes import Lanes
from service.worker.offsets import Offsets


def partition_views(
    consumer: AIOKafkaConsumer, lanes: Lanes, offsets: Offsets, paused: Collection[TopicPartition], now: float
) -> tuple[PartitionView, ...]:
    """Each assigned partition: its lag, why it is paused (None: fetching) and its oldest held record's timestamp."""
    views = []
    for partition in consumer.assignment():
        lane = (partition.topic, partition.partition)
        head = lanes.head(lane)
        why = (lanes.why_stalled(lane, now) or "paused") if partition in paused else None
        views.append(
            PartitionView(
                topic=partition.topic,
                partition=partition.partition,
                lag=offsets.lag(consumer, lanes, partition),
                paused=why,
                oldest_ms=head.origin_timestamp_ms if head is not None else None,
            )
        )
    return tuple(views)
