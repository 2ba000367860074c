"""Record timestamps are producer input: any int64 a broker takes must leave the consumer alive and the record
terminal."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidTimestampError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.policy.envelope import iso
from service.policy.records import time_of
from tests.support import ServiceProcess, Topics, eventually, read_topic, rows, scalar, settings_for
from tests.support.orders import placed

# The epoch, the last millisecond Python's datetime holds (9999-12-31), the first one past it, the last one a
# PostgreSQL timestamp holds (294276 AD), past that, and the largest int64.
STAMPS = (0, 253_402_300_799_999, 253_402_300_800_000, 9_224_318_015_999_999, 2**62, 2**63 - 1)


_AFTER_MAX = "message.timestamp.after.max.ms"
# How long, and how often, a refused far-future record is sent again while the broker has not applied the topic's
# new config.
_APPLIED_WITHIN = 30.0
_RESEND_EVERY = 0.1


async def _takes_any_timestamp_by_default(admin: AIOKafkaAdminClient, topic: str) -> bool:
    """Whether the broker has no `message.timestamp.after.max.ms` (before Kafka 3.6): then it takes any timestamp."""
    [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {_AFTER_MAX: None})])
    [resource] = response.resources
    assert resource[0] == 0, f"describe_configs of {topic}: {resource}"
    return not any(entry[0] == _AFTER_MAX for entry in resource[4])


async def _accept_any_timestamp(bootstrap: str, topic: str) -> None:
    """Kafka 4 refuses records more than an hour ahead (`message.timestamp.after.max.ms`); older brokers, and
    topics configured so, take any."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if await _takes_any_timestamp_by_default(admin, topic):
            return
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {_AFTER_MAX: str(2**63 - 1)})
        for response in await admin.alter_configs([resource]):
            assert all(entry[0] == 0 for entry in response.resources), f"alter_configs of {topic}: {response}"
    finally:
        await admin.close()


class _Writer:
    """Writes records with given timestamps to partition 0 of a topic, in order, each once.

    The controller answers a change of a topic's config before the broker applies it (KRaft), so a far-future
    record sent right after may be refused. A refused record is not written, and is sent again, by a new producer:
    an idempotent producer has spent the refused batch's sequence number, and the broker, which did not, would
    refuse its next batch as out of order. Gives up `_APPLIED_WITHIN` seconds after the first refusal."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self.refused = 0

    async def write(self, records: list[tuple[bytes, int | None]]) -> None:
        """Write (value, timestamp or None for now) records; raise if the broker still refuses one at the end."""
        left = list(records)
        deadline: float | None = None
        while left:
            producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, enable_idempotence=True)
            await producer.start()
            try:
                while left:
                    value, stamp = left[0]
                    await producer.send_and_wait(self._topic, value, key=b"T", partition=0, timestamp_ms=stamp)
                    left.pop(0)
            except InvalidTimestampError as error:
                self.refused += 1
                deadline = deadline or time.monotonic() + _APPLIED_WITHIN
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the broker still refuses timestamp {left[0][1]} on {self._topic} after {_APPLIED_WITHIN}s:"
                        f" its {_AFTER_MAX} was not applied"
                    ) from error
            finally:
                await producer.stop()
            if left:
                await asyncio.sleep(_RESEND_EVERY)


async def test_a_record_refused_until_the_topic_takes_its_timestamp_is_written_once_it_does(
    kafka: str, topics: Topics
) -> None:
    # Given a broker that refuses far-future records (Kafka 3.6 and later), and a writer refused on one
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        if await _takes_any_timestamp_by_default(admin, topics.source):
            pytest.skip("this broker takes any timestamp")
    finally:
        await admin.close()
    writer = _Writer(kafka, topics.source)
    far, later = STAMPS[1], STAMPS[-1]
    writing = asyncio.create_task(writer.write([(b"first", 0), (b"far", far), (b"later", later)]))

    async def refused() -> bool:
        return writer.refused > 0

    try:
        await eventually(refused)

        # When the topic's config changes to take any timestamp
        await _accept_any_timestamp(kafka, topics.source)
        await asyncio.wait_for(writing, _APPLIED_WITHIN + 10)
    finally:
        writing.cancel()

    # Then each record is on the partition once, in order, with its own timestamp
    read = await read_topic(kafka, topics.source, expect=3)
    assert [(record.partition, record.value, record.timestamp) for record in read] == [
        (0, b"first", 0),
        (0, b"far", far),
        (0, b"later", later),
    ]


async def test_records_with_any_timestamp_end_terminal_with_the_consumer_alive(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given, for each extreme timestamp, a good order and a malformed record, then one ordinary order
    await _accept_any_timestamp(kafka, topics.source)
    records: list[tuple[bytes, int | None]] = [
        (value, stamp)
        for n, stamp in enumerate(STAMPS)
        for value in (json.dumps(placed(f"T-{n}")).encode(), b"{not json")
    ]
    await _Writer(kafka, topics.source).write([*records, (json.dumps(placed("T-last")).encode(), None)])

    # When a consumer reads them
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    try:
        await eventually(lambda: scalar(engine, "SELECT count(*) FROM inbox"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = :n FROM inbox", n=2 * len(STAMPS) + 1), timeout=60)
        assert consumer.process.poll() is None, consumer.log()[-3000:]
    finally:
        code = consumer.terminate()

    # Then every record is terminal, each order applied, each malformed record quarantined, and no traceback
    assert code == 0, consumer.log()[-3000:]
    statuses = await rows(engine, "SELECT status, count(*) AS n FROM inbox GROUP BY status ORDER BY status")
    assert statuses == [
        {"status": "processed", "n": len(STAMPS) + 1},
        {"status": "quarantined", "n": len(STAMPS)},
    ], consumer.log()[-3000:]
    assert "Traceback" not in consumer.log()
    # And each record's time is its timestamp, or the nearest instant a datetime holds, in its inbox row and its
    # failure envelope alike
    expected = [time_of(stamp) for stamp in STAMPS]
    received = await rows(engine, "SELECT received_at FROM inbox WHERE status = 'processed' ORDER BY source_offset")
    assert [row["received_at"] for row in received][:-1] == expected
    envelopes = await rows(engine, "SELECT envelope FROM quarantine ORDER BY first_failed_at, failure_id")
    assert sorted(row["envelope"]["source"]["timestamp"] for row in envelopes) == sorted(map(iso, expected))
