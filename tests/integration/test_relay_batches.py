"""The relay's own record batches (`service/worker/relay.py` `_send_all`) on a broker away for longer than the
producer's request timeout, while three of the relay's batches are in flight on one partition: the producer queues one
built batch per partition at a time, and the relay must wait for the broker rather than give up on a batch's rows.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.produce import ProduceRequest

from service.adapters.kafka import MAX_UNCOMPRESSED_MESSAGE, make_producer, partition_of
from service.store.outbox import ClaimedRow
from service.worker.publishing import send_all
from tests.support import Topics, read_topic, settings_for

pytestmark = pytest.mark.slow

_AWAY_SECONDS = 18.0  # longer than the producer's request timeout (15 s), as any real outage is


def _rows_on(
    topic: str, partition: int, partitions: list[int], first_id: int, count: int, avoid: set[str]
) -> list[ClaimedRow]:
    """`count` rows of keys no other batch has, each on `partition` (Kafka's default partitioner's pick)."""
    rows: list[ClaimedRow] = []
    n = 0
    while len(rows) < count:
        key = f"K-{first_id}-{n}"
        n += 1
        if key in avoid or partition_of(key.encode(), partitions) != partition:
            continue
        avoid.add(key)
        rows.append(ClaimedRow(first_id + len(rows), topic, key, (), b"x", key.encode()))
    return rows


async def test_three_batches_in_flight_on_one_partition_each_get_every_rows_outcome_after_an_outage(
    kafka: str, topics: Topics
) -> None:
    # Given the relay's producer, and a broker that goes away (every produce request fails to connect, as when it is
    # down: the idempotent producer retries those batches until it is back)
    settings = settings_for("postgresql+asyncpg://unused@127.0.0.1:1/unused", kafka, topics)
    producer = make_producer(settings)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topics.source))
        hot, other = partitions[0], partitions[1]
        away = asyncio.Event()
        away.set()
        send = producer.client.send

        async def produce_or_fail(node_id: Any, request: Any, **kwargs: Any) -> Any:
            if away.is_set() and isinstance(request, ProduceRequest):
                raise KafkaConnectionError("broker away (test)")
            return await send(node_id, request, **kwargs)

        producer.client.send = produce_or_fail  # type: ignore[method-assign]

        # When the relay's three batches in flight (disjoint keys, as `busy` keeps them) each send rows to the same
        # partition, the third also to another partition first
        keys: set[str] = set()
        first = _rows_on(topics.source, hot, partitions, 1_000, 3, keys)
        second = _rows_on(topics.source, hot, partitions, 2_000, 3, keys)
        third = _rows_on(topics.source, other, partitions, 3_000, 2, keys) + _rows_on(
            topics.source, hot, partitions, 3_100, 2, keys
        )
        batches = []
        for rows in (first, second, third):
            batches.append(asyncio.create_task(send_all(producer, rows)))
            await asyncio.sleep(0.3)  # (the interleaving, not a wait for a result: each claimed after the one before)
        # And the broker comes back after longer than the request timeout (the outage itself)
        await asyncio.sleep(_AWAY_SECONDS)
        away.clear()
        outcomes = await asyncio.wait_for(asyncio.gather(*batches, return_exceptions=True), timeout=60)

        # Then every row of every batch has its own outcome (here: acknowledged), none is lost to one partition's wait
        for name, rows, result in zip(("first", "second", "third"), (first, second, third), outcomes, strict=True):
            assert not isinstance(result, BaseException), f"the {name} batch raised {type(result).__name__}"
            assert result == [None] * len(rows), name
    finally:
        await producer.stop()


async def test_a_row_over_the_producers_request_limit_is_refused_before_sending_and_its_batch_still_goes(
    kafka: str, topics: Topics
) -> None:
    # Given rows on one partition around one larger than the producer lets through (it is never sent: the broker
    # would only refuse it, and the batch with it)
    settings = settings_for("postgresql+asyncpg://unused@127.0.0.1:1/unused", kafka, topics)
    producer = make_producer(settings)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topics.source))
        keys: set[str] = set()
        before, after = (_rows_on(topics.source, partitions[0], partitions, first, 1, keys) for first in (1, 3))
        [huge] = _rows_on(topics.source, partitions[0], partitions, 2, 1, keys)
        huge.payload = b"x" * (MAX_UNCOMPRESSED_MESSAGE + 1)

        # When the relay sends them in one go
        outcomes = await send_all(producer, [*before, huge, *after])
    finally:
        await producer.stop()

    # Then the large one alone is refused for its size, and the rows around it reach the topic, in order
    assert [type(outcome).__name__ if outcome else None for outcome in outcomes] == [
        None,
        "MessageSizeTooLargeError",
        None,
    ]
    published = await read_topic(kafka, topics.source, expect=2, timeout=10)
    assert [record.key for record in published] == [before[0].kafka_key, after[0].kafka_key]
