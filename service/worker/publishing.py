"""Putting outbox rows on Kafka: a claim's rows as record batches, one partition each, and what the broker's answers
mean for a row (refused for its content and set aside, or an outage waited out, or a topic it does not have).

The relay (service/worker/relay.py) claims, settles and marks; this module only talks to the producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnknownError,
    UnknownTopicOrPartitionError,
)
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from service.adapters.kafka import MAX_UNCOMPRESSED_MESSAGE, InvalidRecordError, partition_of
from service.store.outbox import ClaimedRow

# The errors that say Kafka will never take this record as it is, whatever the retry, and the code its row is
# set aside with: too large, or content the broker refuses. Not INVALID_TIMESTAMP: the relay's records carry its
# own clock's time, so that answer is about the clock (or the topic's window), and waited out like an outage.
SET_ASIDE_TOO_LARGE = "MESSAGE_TOO_LARGE"
SET_ASIDE_INVALID = "MESSAGE_INVALID"
_REFUSALS: dict[type[KafkaError], str] = {
    MessageSizeTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordListTooLargeError: SET_ASIDE_TOO_LARGE,
    InvalidRecordError: SET_ASIDE_INVALID,  # e.g. a record without a key on a compacted topic (Kafka 2.5 and later)
}
_REFUSED = tuple(_REFUSALS)
# The answer a record's content gets from Kafka before 2.5 (a record without a key on a compacted topic), but a CRC
# error in transit too: the relay sets such a row aside only on evidence (Relay._one_by_one). Any other answer (an
# unexpected server error, a format or compression the topic does not take) is an outage of the topic, waited out:
# setting rows aside for it would reorder their keys.
SUSPECT = (CorruptRecordException,)

# How long the relay waits for the broker's list of topics when a topic's metadata did not come: as long as the
# producer's requests (aiokafka asks the known brokers in turn).
_LISTING_SECONDS = 15.0


class TopicMissing(Exception):
    """The broker answers and has no such topic: the row waits for it, neither published nor set aside."""


def refusals() -> tuple[type[KafkaError], ...]:
    """The refusals, with the class aiokafka answers INVALID_RECORD with: ours once registered, or a later aiokafka's
    own (which `register_error_codes` leaves in place)."""
    invalid_record = kafka_errors.kafka_errors.get(InvalidRecordError.errno)
    if invalid_record is None or invalid_record is InvalidRecordError or issubclass(UnknownError, invalid_record):
        return _REFUSED  # (never a class an unexpected server error is too: that would set rows aside for a fault)
    return (*_REFUSED, invalid_record)


def set_aside_code(refusal: KafkaError) -> str:
    """The code a row Kafka refused for its content is set aside with."""
    return next((code for kind, code in _REFUSALS.items() if isinstance(refusal, kind)), SET_ASIDE_INVALID)


async def send_all(
    producer: AIOKafkaProducer, rows: list[ClaimedRow], answered: Callable[[int, int], None] | None = None
) -> list[BaseException | None]:
    """Send the rows at once; each one's error (`TopicMissing` for a topic the broker does not have), or None once
    Kafka acknowledged it (then `answered`, if given, is told its position and partition as the answer comes: its
    `send` span ends there).

    The rows go out in record batches built here, one partition each (the producer's batch API, much cheaper per
    record than `send`: docs/performance.md). A row goes to the partition `send` would pick, and a partition's rows
    are appended in id order and its batches submitted one after the other, so each key's rows keep their order.
    The relay relies on aiokafka's `BatchBuilder` and `DefaultRecordBatchBuilder.estimate_size_in_bytes` as they
    are in the versions its dependency range allows.
    """
    outcomes: list[BaseException | None] = [None] * len(rows)
    partitions: dict[str, list[int]] = {}
    missing = await _resolve(producer, {row.topic for row in rows}, partitions)
    chains: dict[tuple[str, int], list[tuple[BatchBuilder, list[int]]]] = {}
    for index, row in enumerate(rows):
        headers = list(row.headers)
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(row.kafka_key, row.payload, headers)
        if size > MAX_UNCOMPRESSED_MESSAGE:
            # What `send` would refuse before sending: it never reaches the broker, and is set aside.
            outcomes[index] = MessageSizeTooLargeError(f"{row.size} bytes, over the producer's request limit")
            continue
        if row.topic in missing:
            outcomes[index] = TopicMissing(row.topic)
            continue
        target = (row.topic, await partition_for(producer, row, partitions))
        chain = chains.setdefault(target, [])
        if (
            not chain
            or chain[-1][0].append(timestamp=None, key=row.kafka_key, value=row.payload, headers=headers) is None
        ):
            builder = producer.create_batch()
            builder.append(timestamp=None, key=row.kafka_key, value=row.payload, headers=headers)  # a first always fits
            chain.append((builder, []))
        chain[-1][1].append(index)

    async def one_partition(target: tuple[str, int], chain: list[tuple[BatchBuilder, list[int]]]) -> None:
        # A partition's batches one after the other, each once Kafka took the one before: the broker keeps no
        # sequence for a fresh idempotent producer whose first batch it refused, and would take the next one, whose
        # rows would overtake the refused batch's rows of the same keys. A refused batch's rows and every later
        # batch's go to the relay's one-by-one pass unsent, in order.
        for position, (builder, taken) in enumerate(chain):
            try:
                await (await _submit(producer, builder, target))
            except Exception as error:
                for _, later in chain[position:]:
                    for index in later:
                        outcomes[index] = error
                return
            if answered is not None:
                for index in taken:
                    answered(index, target[1])

    await asyncio.gather(*(one_partition(target, chain) for target, chain in chains.items()))
    return outcomes


async def _resolve(producer: AIOKafkaProducer, topics: set[str], partitions: dict[str, list[int]]) -> set[str]:
    """Ask for the topics' partitions, all at once (into `partitions`); return those the broker does not have.

    aiokafka waits for a topic's metadata up to its request timeout (15 s) before it gives up on it, the same way
    whether the broker is away or has no such topic: asked one after another, three new missing topics held the
    batch for 45 s.
    """
    missing: set[str] = set()

    async def one(topic: str) -> None:
        try:
            partitions[topic] = sorted(await producer.partitions_for(topic))
        except UnknownTopicOrPartitionError:
            present = await broker_topics(producer, _LISTING_SECONDS)
            if present is None or topic in present:
                raise  # the broker is away, or the topic's metadata is late: an outage, waited out
            missing.add(topic)

    asked = [asyncio.ensure_future(one(topic)) for topic in topics]
    try:
        await asyncio.gather(*asked)
    except BaseException:
        # The first failure ends the batch: the other questions go with it, not on into a producer about to stop.
        for question in asked:
            question.cancel()
        await asyncio.gather(*asked, return_exceptions=True)
        raise
    return missing


async def broker_topics(producer: AIOKafkaProducer, within: float) -> frozenset[str] | None:
    """The topics the broker has, or None when no broker answered `within` seconds (aiokafka tries each known broker
    in turn, each up to its request timeout)."""
    try:
        async with asyncio.timeout(within):
            listing = await producer.client.fetch_all_metadata()
    except (KafkaError, TimeoutError):
        return None
    return frozenset(listing.topics())


async def _submit(producer: AIOKafkaProducer, builder: BatchBuilder, target: tuple[str, int]) -> asyncio.Future[Any]:
    """Hand a built batch to the producer; the future of Kafka's answer for all its records.

    The producer queues one built batch per partition at a time: the next waits until the sender has taken it,
    and gives up after the request timeout (`KafkaTimeoutError`) while the broker is away and the sender keeps
    retrying the one before. Giving up here would drop the outcomes of the batches already handed over, and roll
    back rows the producer still holds (they would go out twice), so the relay waits for the broker, as it does
    for a topic's first metadata (the relay says so). A producer that is closed or failed raises.
    """
    builder.close()
    topic, partition = target
    while True:
        try:
            future: asyncio.Future[Any] = await producer.send_batch(builder, topic, partition=partition)
        except KafkaTimeoutError:
            continue
        return future


async def partition_for(producer: AIOKafkaProducer, row: ClaimedRow, partitions: dict[str, list[int]]) -> int:
    """The partition `send` would pick for the row (`partitions`: each topic's, as far as this batch asked).

    A copy of a record that had no key goes out without one, to the partition its ordering key picks (as a keyed
    copy would), so the copies of one order keep their order.
    """
    if row.topic not in partitions:
        partitions[row.topic] = sorted(await producer.partitions_for(row.topic))
    of_topic = partitions[row.topic]
    key = row.kafka_key if row.kafka_key is not None else row.key.encode() if row.key is not None else None
    return partition_of(key, of_topic)


async def send_row(producer: AIOKafkaProducer, row: ClaimedRow, partition: int) -> asyncio.Future[Any]:
    """Hand one row to the producer, for `partition` (`partition_for`)."""
    future: asyncio.Future[Any] = await producer.send(
        row.topic, row.payload, key=row.kafka_key, partition=partition, headers=list(row.headers)
    )
    return future
