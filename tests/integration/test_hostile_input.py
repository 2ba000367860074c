"""Hostile input on real Kafka and PostgreSQL: every record terminal, the consumer alive, identities byte-exact.

Regressions of issue 13: NUL in a key, message id or order id took the consumer down; a NUL byte in a header
value looped forever; parking turned `\\xffA` and `\\xfeA` into one message id; a valid sequence or total
overflowed its column.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.policy.headers import from_json
from service.policy.records import SourceRecord
from tests.support import (
    ServiceProcess,
    Topics,
    cli,
    eventually,
    produce_raw,
    produce_raw_names,
    read_topic,
    rows,
    running,
    scalar,
    settings_for,
)


def placed(order_id: str, **fields: Any) -> bytes:
    """An `order.placed.v1` value for a known tenant and an active customer, as JSON bytes."""
    document = {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": "acme",
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 500}],
    }
    return json.dumps(document | fields).encode()


def cancelled(order_id: str) -> bytes:
    """An `order.cancelled.v1` value."""
    return json.dumps({"schema": "order.cancelled.v1", "order_id": order_id, "reason": "changed my mind"}).encode()


async def statuses(engine: AsyncEngine) -> dict[str, tuple[str, str | None]]:
    """Each inbox row's (status, error code), by message id."""
    found = await rows(engine, "SELECT message_id, status, error_code FROM inbox")
    return {row["message_id"]: (row["status"], row["error_code"]) for row in found}


async def test_keys_ids_and_headers_with_nul_or_binary_bytes_reach_a_terminal_state_and_the_consumer_lives_on(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given, in one partition: a LongSerializer key, a NUL in an order id, a binary message id, a raw UUID
    # correlation id with a NUL byte, a key that is not UTF-8 on bytes that are not JSON, then good records
    correlation = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff").bytes
    hostile = [
        (struct.pack(">q", 12345), placed("H-1"), [("message-id", b"H-1/placed")]),
        (b"H-2", placed("H-\u00002"), [("message-id", b"H-2/placed")]),
        (b"H-3", placed("H-3"), [("message-id", b"\x00\x01H-3")]),
        (b"H-4", placed("H-4"), [("message-id", b"H-4/placed"), ("correlation-id", correlation)]),
        (b"\xff\xfe", b"\x00not json", [("message-id", b"H-5/bad"), ("x-bin", b"\x00\xff")]),
    ]
    good = [(f"G-{n}".encode(), placed(f"G-{n}"), [("message-id", f"G-{n}/placed".encode())]) for n in range(3)]
    await produce_raw(kafka, topics.source, [*hostile, *good], partition=0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    try:
        # When a real consumer process reads them
        await eventually(lambda: scalar(engine, "SELECT count(*) = 8 FROM inbox"), timeout=60)
        # Then every record is terminal with the code that says what happened, and the consumer lives on
        assert consumer.process.poll() is None, consumer.log()[-3000:]
    finally:
        code = consumer.terminate()
    binary_id = "base64:" + base64.b64encode(b"\x00\x01H-3").decode()
    assert await statuses(engine) == {
        "H-1/placed": ("processed", None),
        "H-2/placed": ("quarantined", "INVALID_FIELD"),
        binary_id: ("processed", None),
        "H-4/placed": ("processed", None),
        "H-5/bad": ("quarantined", "MALFORMED_PAYLOAD"),
        **{f"G-{n}/placed": ("processed", None) for n in range(3)},
    }
    assert code == 0
    assert "Traceback" not in consumer.log()

    # And the quarantined record keeps its header bytes exactly, its envelope carries the key as base64
    [row] = await rows(engine, "SELECT envelope, source_headers FROM quarantine WHERE message_id = 'H-5/bad'")
    assert row["envelope"]["source"]["keyBase64"] == base64.b64encode(b"\xff\xfe").decode()
    assert "key" not in row["envelope"]["source"]


async def test_parked_records_keep_message_ids_that_differ_only_in_bytes_that_are_not_utf8(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given K's placement that never succeeds, and two cancellations behind it whose ids differ in one byte
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    records = [
        (b"K", placed("K", customer_id="c-down"), [("message-id", b"K.1/placed")]),
        (b"K", cancelled("K"), [("message-id", b"\xffA")]),
        (b"K", cancelled("K"), [("message-id", b"\xfeA")]),
    ]
    await produce_raw(kafka, topics.source, records, partition=1)
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        retry_tiers="1s",
        blocking_attempts=1,
        max_attempts=None,
        max_elapsed="60s",
    )

    async with running(settings, "consumer_loop", "relay"):
        # When the head is quarantined, its key held, and an operator releases the key
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM parked"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        await cli(settings, "parked", "release", "K")

        # Then both parked records are applied, each under its own message id
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM inbox"), timeout=30)
    found = await statuses(engine)
    assert found["base64:" + base64.b64encode(b"\xffA").decode()] == ("rejected", "ORDER_NOT_FOUND")
    assert found["base64:" + base64.b64encode(b"\xfeA").decode()] == ("rejected", "ORDER_NOT_FOUND")
    assert await scalar(engine, "SELECT count(*) FROM parked") == 0


async def test_numbers_a_column_holds_are_applied_and_numbers_it_cannot_hold_are_invalid_at_once(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given an epoch-millisecond sequence (versioned ordering) and an order total beyond bigint
    epoch_ms = 1_764_000_000_000
    placed_v2 = json.loads(placed("N-1")) | {"schema": "order.placed.v2", "placed_at": "2026-12-01T09:00:00Z"}
    huge = [{"sku": "s", "quantity": 1_000_000, "unit_price_cents": 10**12}] * 10
    records = [
        (b"N-1", json.dumps(placed_v2 | {"sequence": epoch_ms}).encode(), [("message-id", b"N-1/placed")]),
        (b"N-2", placed("N-2", items=huge), [("message-id", b"N-2/placed")]),
        (b"N-3", placed("N-3", items=[{"sku": "s", "quantity": 1, "unit_price_cents": 2**63}]), []),
    ]
    await produce_raw(kafka, topics.source, records, partition=2)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, ordering="versioned")

    # When the service runs
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM inbox"), timeout=60)

    # Then the sequence is stored as sent, and the totals that cannot be stored are INVALID_FIELD, not retried
    assert await scalar(engine, "SELECT sequence FROM orders WHERE order_id = 'N-1'") == epoch_ms
    found = await statuses(engine)
    assert found["N-2/placed"] == ("quarantined", "INVALID_FIELD")
    assert found[f"{topics.source}/2/2"] == ("quarantined", "INVALID_FIELD")
    attempts = await rows(engine, "SELECT attempts FROM quarantine")
    assert [row["attempts"] for row in attempts] == [1, 1]


async def test_a_record_whose_quarantine_write_fails_is_quarantined_by_the_last_resort_and_neighbours_apply(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a store that refuses every ordinary quarantine write, and a bad record between two good ones
    settings = settings_for(database_url, kafka, topics, fault_fail_at="quarantine-write")
    records = [
        SourceRecord(topics.source, 0, 0, 0, b"G-1", placed("G-1")),
        SourceRecord(topics.source, 0, 1, 0, b"B-1", b"\x00not json", (("x-binary", b"\x00\xff"),)),
        SourceRecord(topics.source, 0, 2, 0, b"G-2", placed("G-2")),
    ]

    # When one processor round attempts them
    async with running(settings) as container:
        processor = await container.processor()
        pending = [processor.pending(record) for record in records]
        left = await processor.attempt(pending, asyncio.Event())

    # Then all three are terminal in that one round: the good ones applied, the bad one quarantined by the last
    # resort with its bytes and headers kept exactly, its envelope saying so
    assert left == set(pending)
    assert await scalar(engine, "SELECT count(*) FROM orders") == 2
    [row] = await rows(engine, "SELECT error_code, ordering_key, payload, source_headers, envelope FROM quarantine")
    assert row["error_code"] == "MALFORMED_PAYLOAD"
    assert row["ordering_key"] is None
    assert bytes(row["payload"]) == b"\x00not json"
    assert from_json(row["source_headers"]) == (("x-binary", b"\x00\xff"),)
    assert row["envelope"]["lastResort"] is True
    assert row["envelope"]["payloadSchema"] is None
    assert await scalar(engine, "SELECT status FROM inbox WHERE source_offset = 1") == "quarantined"
    assert await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.quarantine}'") == 1


async def test_a_batch_the_kafka_client_cannot_decode_is_quarantined_by_coordinates_and_nothing_else_is_lost(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given, on partition 0, a batch of four records, one of them with a header NAME that is not UTF-8 (the
    # Kafka client cannot decode that batch at all), then good records; and good records on partition 1
    batch = [(f"U-{n}".encode(), placed(f"U-{n}"), [(b"x-ok", b"1")]) for n in range(4)]
    batch[2] = (b"U-2", placed("U-2"), [(b"\xffname", b"v")])
    await produce_raw_names(kafka, topics.source, batch, partition=0)
    after = [(f"A-{n}".encode(), placed(f"A-{n}"), [("message-id", f"A-{n}/placed".encode())]) for n in range(3)]
    await produce_raw(kafka, topics.source, after, partition=0)
    beside = [(f"B-{n}".encode(), placed(f"B-{n}"), [("message-id", f"B-{n}/placed".encode())]) for n in range(3)]
    await produce_raw(kafka, topics.source, beside, partition=1)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When a consumer reads them
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 10 FROM inbox"), timeout=60)

    # Then the record with that name, and the records of its batch the client could not return, are quarantined
    # UNREADABLE_RECORD by their coordinates; every other record is applied, and no offset of either partition
    # is missing
    found = await rows(engine, "SELECT source_partition, source_offset, status, error_code, message_id FROM inbox")
    by_offset = {(row["source_partition"], row["source_offset"]): row for row in found}
    assert sorted(by_offset) == [*((0, n) for n in range(7)), *((1, n) for n in range(3))]
    assert by_offset[0, 2]["error_code"] == "UNREADABLE_RECORD"
    assert by_offset[0, 2]["message_id"] == f"{topics.source}/0/2"
    for n in range(4):
        assert (by_offset[0, n]["status"], by_offset[0, n]["error_code"]) in {
            ("processed", None),
            ("quarantined", "UNREADABLE_RECORD"),
        }
    assert (
        {by_offset[0, n]["status"] for n in range(4, 7)}
        == {by_offset[1, n]["status"] for n in range(3)}
        == {"processed"}
    )
    assert await scalar(engine, "SELECT owner FROM quarantine LIMIT 1") == "order-producers"


async def test_a_binary_key_stays_byte_exact_through_its_tier_copy_and_its_parked_record(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a LongSerializer key on a placement that fails until it is quarantined, and a cancellation behind it
    # (the key is not text: the order id orders them)
    key = struct.pack(">q", 4242)
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    records = [
        (key, placed("L", customer_id="c-down"), [("message-id", b"L.1/placed")]),
        (key, cancelled("L"), [("message-id", b"L.2/cancel")]),
    ]
    await produce_raw(kafka, topics.source, records, partition=0)
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        retry_tiers="1s",
        blocking_attempts=1,
        max_attempts=None,
        max_elapsed="60s",
    )

    # When the head goes through its tier and is quarantined
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        [parked_row] = await rows(engine, "SELECT ordering_key, source_key FROM parked")

    # Then the tier copy carried the key's own bytes, the parked record kept them, and so does the envelope
    [copy] = await read_topic(kafka, topics.retry("1s"), expect=1, timeout=10)
    assert copy.key == key
    assert parked_row["ordering_key"] == "L"
    assert bytes(parked_row["source_key"]) == b"\x01" + key
    envelope = await scalar(engine, "SELECT envelope FROM quarantine")
    assert envelope["source"]["keyBase64"] == base64.b64encode(key).decode()
