"""scripts/bench's PostgreSQL limit writes, per record, the rows `consume` writes: the same orders, effects and
event messages, byte for byte, so that `service_vs_limit` compares like with like."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support import ServiceProcess, Topics, eventually, settings_for
from tests.support import committed as _committed

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
import bench_data  # a script, not a package: from scripts/ on the path

RECORDS = 60  # three blocks of the bench's data: orders, a duplicate and an invalid record in each

_ORDERS = (
    "SELECT order_id, tenant, customer_id, status, amount_cents, currency, sequence, details::text, version FROM orders"
)
_EFFECTS = "SELECT idempotency_key, aggregate_id, kind, state, payload::text FROM effects"
_EVENTS = "SELECT topic, key, headers::text, payload FROM outbox WHERE topic = $1"


async def _written(connection: Any, events: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows, in a stable order (`jsonb` as PostgreSQL's canonical text)."""
    return {
        "orders": sorted(map(tuple, await connection.fetch(_ORDERS)), key=str),
        "effects": sorted(map(tuple, await connection.fetch(_EFFECTS)), key=str),
        "events": sorted(map(tuple, await connection.fetch(_EVENTS, events)), key=str),
    }


async def test_the_raw_write_writes_the_orders_effects_and_events_the_consumer_writes(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given the bench's first records on a topic
    producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True)
    await producer.start()
    try:
        for index in range(RECORDS):
            key, value, headers = bench_data.record_at(index)
            await producer.send_and_wait(topics.source, value, key=key, headers=headers, partition=index % 3)
    finally:
        await producer.stop()

    # When the bench's raw write writes their rows (rolled back), and `consume` applies the records
    connection = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        transaction = connection.transaction()
        await transaction.start()
        await bench_data.RawRows.of(range(RECORDS), topics.source).write(connection, "bench-raw")
        raw = await _written(connection, topics.events)
        await transaction.rollback()
        settings = settings_for(database_url, kafka, topics)
        consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
        try:
            for partition in range(3):
                await eventually(lambda p=partition: _committed(kafka, settings.consumer_name, topics.source, p, 20))
        finally:
            assert consumer.terminate() == 0
        served = await _written(connection, topics.events)
    finally:
        await connection.close()

    # Then the two wrote the same orders, effects and event messages (headers and payload bytes)
    assert len(served["orders"]) == len(served["events"]) == 3 * 18
    assert served == raw
