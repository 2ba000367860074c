"""Record timestamps are producer input: any int64 a broker takes must leave the consumer alive and the record
terminal."""

from __future__ import annotations

import json
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidTimestampError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.policy.envelope import iso
from service.policy.records import time_of
from tests.support import ServiceProcess, Topics, eventually, rows, scalar, settings_for
from tests.support.orders import placed

# The epoch, the last millisecond Python's datetime holds (9999-12-31), the first one past it, the last one a
# PostgreSQL timestamp holds (294276 AD), past that, and the largest int64.
STAMPS = (0, 253_402_300_799_999, 253_402_300_800_000, 9_224_318_015_999_999, 2**62, 2**63 - 1)


async def _accept_any_timestamp(bootstrap: str, topic: str) -> None:
    """Kafka 4 refuses records more than an hour ahead (`message.timestamp.after.max.ms`); older brokers, and
    topics configured so, take any."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"message.timestamp.after.max.ms": str(2**63 - 1)})
        await admin.alter_configs([resource])
    finally:
        await admin.close()


async def _send_once_taken(producer: AIOKafkaProducer, topic: str, value: bytes, stamp: int) -> None:
    """Send until the broker takes the record: the controller answers the change of config before the broker
    applies it, and a record it refuses is not written, so sending it again cannot duplicate it."""

    async def taken() -> bool:
        try:
            await producer.send_and_wait(topic, value, key=b"T", partition=0, timestamp_ms=stamp)
        except InvalidTimestampError:
            return False
        return True

    await eventually(taken, timeout=30)


async def test_records_with_any_timestamp_end_terminal_with_the_consumer_alive(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given, for each extreme timestamp, a good order and a malformed record, then one ordinary order
    await _accept_any_timestamp(kafka, topics.source)
    producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True)
    await producer.start()
    try:
        for n, stamp in enumerate(STAMPS):
            for value in (json.dumps(placed(f"T-{n}")).encode(), b"{not json"):
                await _send_once_taken(producer, topics.source, value, stamp)
        await producer.send_and_wait(topics.source, json.dumps(placed("T-last")).encode(), key=b"T", partition=0)
    finally:
        await producer.stop()

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
