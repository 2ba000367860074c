"""The bench's data and its PostgreSQL limit (scripts/bench.py): deterministic records (new orders, producer retries,
bytes that are not JSON), and the rows order-service writes for them, as column arrays one `unnest` per table writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from service.codes import ErrorCode
from service.orders import model as order_rules
from service.orders.domain import DOMAIN
from service.orders.handler import event_document
from service.orders.messages import decode as decode_order
from service.policy.envelope import event_headers, failure_envelope
from service.policy.handling import DecodeFailure
from service.policy.owners import owner_for
from service.policy.records import SourceRecord
from service.policy.retry import AttemptHistory

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]

PARTITIONS = 3
TENANTS = ("acme", "globex", "initech")
# Of every 20 records: 18 new orders, one producer retry of an earlier order, one record that is not JSON.
BLOCK = 20
ORDERS_PER_BLOCK = 18


@dataclass(frozen=True)
class Mix:
    """What the first n records of the data are made of."""

    orders: int
    duplicates: int
    invalid: int

    @staticmethod
    def of(n: int) -> Mix:
        """The mix of records 0 … n-1 (see `record_at`)."""
        blocks, rest = divmod(n, BLOCK)
        return Mix(
            orders=blocks * ORDERS_PER_BLOCK + min(rest, ORDERS_PER_BLOCK),
            duplicates=blocks + (rest > ORDERS_PER_BLOCK),
            invalid=blocks,
        )

    @property
    def unique(self) -> int:
        """Message ids that each get one inbox row: the orders and the invalid records."""
        return self.orders + self.invalid


def record_at(index: int) -> Record:
    """Record `index` of the data; deterministic, so a duplicate is an exact re-send of an earlier record."""
    block, slot = divmod(index, BLOCK)
    if slot < ORDERS_PER_BLOCK:
        return placed_order(block * ORDERS_PER_BLOCK + slot)
    if slot == ORDERS_PER_BLOCK:
        return placed_order(block * ORDERS_PER_BLOCK + block % ORDERS_PER_BLOCK)
    # No message-id header: the service identifies it by its coordinates (contract §5).
    return f"X-{block:08d}".encode(), b"\xff\xfe not json " + str(block).encode(), []


def placed_order(number: int, order_id: str | None = None) -> Record:
    """An `order.placed.v1` record with its producer's message id."""
    order_id = order_id or f"B-{number:08d}"
    document = {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": TENANTS[number % len(TENANTS)],
        "customer_id": f"c-{number % 1000}",
        "currency": "EUR",
        "items": [{"sku": f"sku-{number % 97}", "quantity": 1 + number % 3, "unit_price_cents": 1999}],
    }
    return order_id.encode(), json.dumps(document).encode(), [("message-id", f"{order_id}.1/order.placed".encode())]


@dataclass
class RawRows:
    """The rows order-service writes for a batch of records, as column arrays for `unnest`."""

    topic: str
    inbox: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(7)])
    orders: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(7)])
    effects: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(4)])
    outbox: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(4)])
    quarantine: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(8)])

    @staticmethod
    def of(indices: range, topic: str) -> RawRows:
        """A new order: inbox + order + payment.capture effect + order.accepted event; an invalid record:
        inbox (quarantined) + quarantine row (and the two timeline events its trigger appends) + envelope; a
        duplicate: nothing (its original is in the same block of 20, so in the same batch: the rows are the ones
        that persist, written by plain inserts, as order-service writes them but for the quarantine row, which it
        inserts `ON CONFLICT DO NOTHING`)."""
        rows = RawRows(topic)
        now = datetime.now(UTC)
        for index in indices:
            key, value, headers = record_at(index)
            # Coordinates as the topic would give them; PostgreSQL's work does not depend on their values.
            partition, offset = index % PARTITIONS, index // PARTITIONS
            if not headers:
                rows.add_invalid(
                    SourceRecord(topic, partition, offset, int(now.timestamp() * 1000), key, value, ()), now
                )
                continue
            if index % BLOCK == ORDERS_PER_BLOCK:
                continue
            message_id = headers[0][1].decode()
            append(rows.inbox, message_id, "processed", partition, offset, key.decode(), None, now)
            rows.add_order(value, message_id)
        return rows

    def add_invalid(self, record: SourceRecord, now: datetime) -> None:
        """A quarantined record's inbox row, its quarantine row (envelope and original bytes) and its envelope
        on the quarantine topic, as the service builds them."""
        code = ErrorCode.MALFORMED_PAYLOAD
        envelope = failure_envelope(
            record,
            record.coordinates,
            consumer="bench-raw",
            history=AttemptHistory.first(now),
            code=code,
            payload_schema=None,
        )
        document = json.dumps(envelope.document)
        message_id, key = record.message_id, record.key_text
        append(self.inbox, message_id, "quarantined", record.partition, record.offset, None, code.value, now)
        append(
            self.quarantine,
            envelope.failure_id,
            code.value,
            owner_for(code, DOMAIN.owners),
            key,
            document,
            record.value,
            now,
            now,
        )
        append(self.outbox, f"{self.topic}.quarantine", key, json.dumps(envelope.headers()), document.encode())

    def add_order(self, value: bytes, message_id: str) -> None:
        """A new order's row, its capture effect and its order.accepted event, as the service's own rule and
        documents make them (before run BF the event had four of its eight fields, and no `event-type` header)."""
        message = decode_order(value)
        assert not isinstance(message, DecodeFailure), message
        applied = order_rules.apply(message, None, order_rules.Context(frozenset(TENANTS)))
        assert isinstance(applied, order_rules.Applied), applied
        order, (capture,), (accepted,) = applied.aggregate, applied.effects, applied.events
        append(
            self.orders,
            order.order_id,
            order.tenant,
            order.customer_id,
            order.status.value,
            order.amount_cents,
            order.currency,
            order.sequence,
        )
        append(self.effects, capture.idempotency_key, capture.aggregate_id, capture.kind, json.dumps(capture.payload))
        headers = event_headers(message_id, accepted.type, None)
        document = orjson.dumps(event_document(accepted, order.version, message_id))
        append(self.outbox, f"{self.topic}.events", order.order_id, json.dumps(headers), document)

    async def write(self, connection: asyncpg.Connection, consumer: str) -> None:
        """Five statements, whatever the batch size."""
        await connection.execute(RAW_INBOX, consumer, self.topic, *self.inbox)
        await connection.execute(RAW_QUARANTINE, consumer, *self.quarantine)
        await connection.execute(RAW_ORDERS, *self.orders)
        await connection.execute(RAW_EFFECTS, *self.effects)
        await connection.execute(RAW_OUTBOX, *self.outbox)


def append(columns: list[list[Any]], *values: Any) -> None:
    """Append one row to column arrays."""
    for column, value in zip(columns, values, strict=True):
        column.append(value)


RAW_INBOX = """
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                       aggregate_id, error_code, received_at)
    SELECT $1, m, s, $2, p, o, i, e, r
    FROM unnest($3::text[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[], $9::timestamptz[])
         AS v(m, s, p, o, i, e, r)
"""
# Its trigger (migration 0009) appends the record's first timeline events, as it does for the service's rows.
RAW_QUARANTINE = """
    INSERT INTO quarantine (consumer_name, failure_id, message_id, error_code, owner, ordering_key, envelope, payload,
                            attempts, first_failed_at, last_failed_at)
    SELECT $1, f, f, c, o, k, e::jsonb, p, 1, t, l
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::timestamptz[],
                $9::timestamptz[]) AS v(f, c, o, k, e, p, t, l)
"""
RAW_ORDERS = """
    INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[])
"""
RAW_EFFECTS = """
    INSERT INTO effects (idempotency_key, aggregate_id, kind, payload)
    SELECT k, o, c, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS v(k, o, c, p)
"""
RAW_OUTBOX = """
    INSERT INTO outbox (topic, key, headers, payload)
    SELECT t, k, h::jsonb, p FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) AS v(t, k, h, p)
"""
