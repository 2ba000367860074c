"""Parked records and blocked keys (ORDERS_ORDERING=key), and the log of backpressure pauses."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, exists, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import key_blocks, parked, pauses, retries


@dataclass(frozen=True)
class ParkedRecord:
    """A record waiting behind its key, stored with everything needed to apply it later."""

    order_key: str
    message_id: str
    source_topic: str
    source_partition: int
    source_offset: int
    timestamp_ms: int
    value: bytes | None
    headers: list[list[str]]


@dataclass(frozen=True)
class StoredParked:
    """A parked row read back for release."""

    id: int
    record: ParkedRecord


async def park(connection: AsyncConnection, consumer: str, records: Sequence[ParkedRecord]) -> None:
    """Park records in the caller's transaction (ids keep their arrival order)."""
    if records:
        await connection.execute(insert(parked).values([{"consumer_name": consumer, **r.__dict__} for r in records]))


async def unpark(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Delete parked rows whose records reached a terminal state."""
    if ids:
        await connection.execute(delete(parked).where(parked.c.id.in_(ids)))


async def block(connection: AsyncConnection, consumer: str, blocks: Sequence[tuple[str, str]]) -> None:
    """Block keys whose head was quarantined: (key, failure id)."""
    if blocks:
        rows = [
            {"consumer_name": consumer, "order_key": key, "failure_id": failure_id, "reason": "quarantined"}
            for key, failure_id in blocks
        ]
        await connection.execute(insert(key_blocks).values(rows).on_conflict_do_nothing())


async def unblock_failures(connection: AsyncConnection, consumer: str, failure_ids: Sequence[str]) -> None:
    """Free the keys held by these quarantined heads (resolved or reprocessed)."""
    if failure_ids:
        await connection.execute(
            delete(key_blocks).where(key_blocks.c.consumer_name == consumer, key_blocks.c.failure_id.in_(failure_ids))
        )


async def release(connection: AsyncConnection, consumer: str, key: str) -> bool:
    """Unblock a key; its parked records are then applied in order by a consumer. True if it was blocked."""
    result = await connection.execute(
        delete(key_blocks).where(key_blocks.c.consumer_name == consumer, key_blocks.c.order_key == key)
    )
    return bool(result.rowcount)


async def releasable(
    connection: AsyncConnection, consumer: str, *, exclude: Iterable[str], keys: int, per_key: int
) -> list[StoredParked]:
    """Parked records of keys that nothing holds any more, oldest first, a bounded number per key."""
    free = (
        select(parked.c.order_key)
        .where(
            parked.c.consumer_name == consumer,
            parked.c.order_key.not_in(list(exclude)),
            ~exists().where(and_(retries.c.consumer_name == consumer, retries.c.order_key == parked.c.order_key)),
            ~exists().where(and_(key_blocks.c.consumer_name == consumer, key_blocks.c.order_key == parked.c.order_key)),
        )
        .group_by(parked.c.order_key)
        .order_by(func.min(parked.c.id))
        .limit(keys)
    )
    free_keys = list((await connection.execute(free)).scalars())
    if not free_keys:
        return []
    numbered = (
        select(parked, func.row_number().over(partition_by=parked.c.order_key, order_by=parked.c.id).label("n"))
        .where(parked.c.consumer_name == consumer, parked.c.order_key.in_(free_keys))
        .subquery()
    )
    result = await connection.execute(select(numbered).where(numbered.c.n <= per_key).order_by(numbered.c.id))
    return [_stored(row) for row in result]


def _stored(row: Any) -> StoredParked:
    return StoredParked(
        row.id,
        ParkedRecord(
            order_key=row.order_key,
            message_id=row.message_id,
            source_topic=row.source_topic,
            source_partition=row.source_partition,
            source_offset=row.source_offset,
            timestamp_ms=row.timestamp_ms,
            value=bytes(row.value) if row.value is not None else None,
            headers=list(row.headers),
        ),
    )


_SUMMARY = text(
    """
    WITH held AS (
        SELECT order_key FROM parked WHERE consumer_name = :consumer
        UNION
        SELECT order_key FROM key_blocks WHERE consumer_name = :consumer
    )
    SELECT held.order_key,
           (SELECT count(*) FROM parked p WHERE p.consumer_name = :consumer AND p.order_key = held.order_key)
               AS parked,
           (SELECT min(parked_at) FROM parked p WHERE p.consumer_name = :consumer AND p.order_key = held.order_key)
               AS oldest_parked_at,
           (SELECT failure_id FROM key_blocks b WHERE b.consumer_name = :consumer AND b.order_key = held.order_key)
               AS blocked_by,
           (SELECT failure_id FROM retries r WHERE r.consumer_name = :consumer AND r.order_key = held.order_key)
               AS retrying
    FROM held
    ORDER BY oldest_parked_at NULLS LAST, held.order_key
    """
)


async def summary(connection: AsyncConnection, consumer: str) -> list[dict[str, Any]]:
    """Held keys: parked records per key, since when, and what holds the key (a quarantined or retrying head)."""
    return [dict(row._mapping) for row in await connection.execute(_SUMMARY, {"consumer": consumer})]


async def log_pause(
    connection: AsyncConnection,
    consumer: str,
    topic: str,
    partition: int,
    downstream: str | None,
    error_code: str,
    seconds: float,
) -> None:
    """Record one backpressure pause (visible to operators and tests)."""
    await connection.execute(
        insert(pauses).values(
            consumer_name=consumer,
            topic=topic,
            partition=partition,
            downstream=downstream,
            error_code=error_code,
            seconds=seconds,
        )
    )
