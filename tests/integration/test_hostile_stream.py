"""A generated hostile stream among good records, through a real `consume` process on the real broker.

Keys (NUL, LongSerializer and IntegerSerializer bytes, invalid UTF-8, empty, null, 10 KB), header names and
values (binary, NUL, duplicated, 10 KB, names that are not UTF-8), and payloads (random bytes, large and
compressible, deeply nested, out-of-range numbers, NUL in strings, wrong types). Every record must reach a
terminal state, the consumer must stay alive, the good records must be applied, and no generated content may
show in its log or in a failure envelope. Hypothesis draws the generator's seed and prints it on failure;
ORDERS_TEST_HOSTILE_RECORDS sets the stream's length (default 5,000).
"""

from __future__ import annotations

import json
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.policy.records import SourceRecord
from tests.support import ServiceProcess, Topics, eventually, produce_raw_names, rows, scalar
from tests.support import settings_for as base_settings

pytestmark = pytest.mark.slow

RECORDS = int(os.environ.get("ORDERS_TEST_HOSTILE_RECORDS", "5000"))
PARTITIONS = 3
CANARY = "CANARY7Q"  # planted in generated content: it must never show in logs or envelopes


@dataclass
class Stream:
    """The generated records, and what the test expects of them."""

    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]] = field(default_factory=list)
    good_orders: set[str] = field(default_factory=set)


def _key(rng: random.Random, order_id: str) -> bytes | None:
    return rng.choice(
        [
            lambda: order_id.encode(),
            lambda: None,
            lambda: b"",
            lambda: struct.pack(">q", rng.randrange(-(2**63), 2**63)),
            lambda: struct.pack(">i", rng.randrange(-(2**31), 2**31)),
            lambda: rng.randbytes(rng.randrange(1, 24)),
            lambda: b"\xff\xfe" + order_id.encode(),
            lambda: order_id.encode() + b"\x00",
            lambda: rng.randbytes(10_000),
        ]
    )()


def _headers(rng: random.Random, serial: int) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = []
    for _ in range(rng.randrange(0, 5)):
        name = rng.choice(["x-bin", "correlation-id", "a\x00b", "ünïcode", "", "traceparent", f"{CANARY}-name"])
        value = rng.choice(
            [
                lambda: rng.randbytes(16),
                lambda: b"\x00" * rng.randrange(1, 4),
                lambda: f"{CANARY}-{serial}".encode(),
                lambda: rng.randbytes(10_000),
                lambda: b"\xffnot utf-8",
            ]
        )()
        headers.append((name, value))
    if headers and rng.random() < 0.2:
        headers.append(headers[0])  # a duplicated header
    choice = rng.random()
    if choice < 0.3:
        headers.append(("message-id", f"S-{serial}/m".encode()))
    elif choice < 0.4:
        headers.append(("message-id", rng.randbytes(rng.randrange(1, 40))))
    elif choice < 0.45:
        headers.append(("message-id", f"S-{max(serial - 1, 0)}/m".encode()))  # a producer retry's id
    return headers


def _order(order_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": "acme",
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 100}],
    } | fields


def _hostile_value(rng: random.Random, order_id: str) -> bytes | None:
    return rng.choice(
        [
            lambda: rng.randbytes(rng.randrange(0, 200)),
            lambda: None,
            lambda: b"[" * 100_000,
            lambda: json.dumps(_order(order_id, pad=CANARY * 12_500)).encode(),  # 100 KB, compressible, valid
            lambda: json.dumps(_order(f"{order_id}\u0000{CANARY}")).encode(),
            lambda: json.dumps(_order(order_id, tenant=f"{CANARY}\u0000")).encode(),
            lambda: json.dumps(
                _order(order_id, items=[{"sku": "s", "quantity": 10**30, "unit_price_cents": 1}])
            ).encode(),
            lambda: json.dumps(_order(order_id, items=[{"sku": "s", "quantity": "2", "unit_price_cents": 1}])).encode(),
            lambda: json.dumps({"schema": "order.shipped.v1", "order_id": order_id, "sequence": 2**70}).encode(),
            lambda: json.dumps({"schema": f"not a schema {CANARY}", "order_id": order_id}).encode(),
            lambda: json.dumps(_order(order_id, customer_id=f"missing-{CANARY}/../x")).encode(),
        ]
    )()


def generate(seed: int, count: int) -> Stream:
    """`count` records, a third of them good orders, the rest hostile, spread over the partitions."""
    rng = random.Random(seed)
    stream = Stream()
    for serial in range(count):
        order_id = f"S-{seed % 10_000}-{serial}"
        if rng.random() < 0.35:
            key, value, headers = order_id.encode(), json.dumps(_order(order_id)).encode(), []
            stream.good_orders.add(order_id)
        else:
            key, value, headers = _key(rng, order_id), _hostile_value(rng, order_id), _headers(rng, serial)
            if key is None and value is None:
                value = b""  # Kafka takes no record without both
        stream.records.append((rng.randrange(PARTITIONS), key, value, headers))
    return stream


async def _produce(bootstrap: str, topic: str, stream: Stream) -> set[str]:
    """Produce the stream; return the message ids its records have, as the consumer computes them."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, compression_type="gzip", max_request_size=4 << 20
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=headers, partition=partition)
            for partition, key, value, headers in stream.records
        ]
        ids = set()
        for future, (_, key, value, headers) in zip(futures, stream.records, strict=True):
            meta = await future
            ids.add(SourceRecord(topic, meta.partition, meta.offset, 0, key, value, tuple(headers)).message_id)
        return ids
    finally:
        await producer.stop()


async def _all_committed(bootstrap: str, group: str, topic: str) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(partitions)
        committed = [await consumer.committed(tp) for tp in partitions]
        return all((done or 0) >= ends[tp] for tp, done in zip(partitions, committed, strict=True))
    finally:
        await consumer.stop()


# One stream per run, not shrunk (each run produces thousands of records), and no example database on disk.
@settings(
    max_examples=1,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
    database=None,
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
async def test_a_generated_hostile_stream_ends_terminal_with_the_consumer_alive_and_nothing_leaked(
    seed: int,
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    tmp_path: Path,
) -> None:
    # Given a generated stream of hostile records among good ones (Hypothesis prints the seed on failure)
    stream = generate(seed, RECORDS)
    expected = await _produce(kafka, topics.source, stream)
    # and records with header names that are not UTF-8, each in a batch of its own (the Kafka client cannot
    # decode such a batch: they are quarantined by their coordinates)
    rng = random.Random(seed)
    for partition in range(PARTITIONS):
        named = [
            (f"N-{n}".encode(), rng.randbytes(8), [(rng.choice([b"\xff", b"\xc3(", b"a\x80"]), f"{CANARY}".encode())])
            for n in range(max(1, RECORDS // 300))
        ]
        offsets = await produce_raw_names(kafka, topics.source, named, partition, batch_each=True)
        expected |= {f"{topics.source}/{partition}/{offset}" for offset in offsets}
    config = base_settings(database_url, kafka, topics, customers_url=downstream.url)
    consumer = ServiceProcess("consume", config, tmp_path / "consume.log")
    try:
        # When a real consumer reads the whole stream
        await eventually(lambda: scalar(engine, "SELECT count(*) >= :n FROM inbox", n=len(expected)), timeout=240)
        await eventually(lambda: _all_committed(kafka, config.consumer_name, topics.source), timeout=60)
        # Then it is alive, and every message id has exactly its terminal row
        assert consumer.process.poll() is None, consumer.log()[-3000:]
    finally:
        code = consumer.terminate()
    assert code == 0, consumer.log()[-3000:]
    found = {row["message_id"] for row in await rows(engine, "SELECT message_id FROM inbox")}
    assert found == expected
    # And the good records are applied, nothing generated shows in the log or an envelope, nothing is left over
    applied = {row["order_id"] for row in await rows(engine, "SELECT order_id FROM orders")}
    assert stream.good_orders <= applied
    log = consumer.log()
    assert CANARY not in log
    assert "Traceback" not in log
    envelopes = await rows(engine, "SELECT envelope::text AS e FROM quarantine")
    assert not [row for row in envelopes if CANARY in row["e"]]
    assert await scalar(engine, "SELECT count(*) FROM retries") == 0
