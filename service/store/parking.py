"""Parked records and blocked keys (ORDERS_ORDERING=key), and the log of backpressure pauses."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, delete, exists, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import key_blocks, parked, pauses, retries


@dataclass(frozen=True)
class ParkedRecord:
    """A record waiting behind its key, stored with everything needed to apply it later."""

    ordering_key: str
    message_id: str
    source_topic: str
    source_partition: int
    source_offset: int
    timestamp_ms: int
    value: bytes | None
    headers: list[list[str]]
    source_key: bytes | None = None  # the original Kafka key, `pack_key`ed; None in rows parked before 0008


@dataclass(frozen=True)
class StoredParked:
    """A parked row read back for release."""

    id: int
    record: ParkedRecord


async def park(connection: AsyncConnection, consumer: str, records: Sequence[ParkedRecord]) -> None:
    """Park records in the caller's transaction (ids keep their arrival order)."""
    if records:
        statement = insert(parked).values([{"consumer_name": consumer, **r.__dict__} for r in records])
        # Two members parking one record at once (a rebalance): the second one's row is not needed.
        await connection.execute(
            statement.on_conflict_do_nothing(index_elements=[parked.c.consumer_name, parked.c.message_id])
        )


async def unpark(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Delete parked rows whose records reached a terminal state."""
    if ids:
        await connection.execute(delete(parked).where(parked.c.id.in_(ids)))


async def block(connection: AsyncConnection, consumer: str, blocks: Sequence[tuple[str, str]]) -> None:
    """Block keys whose head was quarantined: (key, failure id)."""
    if blocks:
        rows = [
            {"consumer_name": consumer, "ordering_key": key, "failure_id": failure_id, "reason": "quarantined"}
            for key, failure_id in blocks
        ]
        await connection.execute(insert(key_blocks).values(rows).on_conflict_do_nothing())


async def unblock_failures(connection: AsyncConnection, failure_ids: Sequence[str]) -> None:
    """Free the keys held by these quarantined heads (resolved or reprocessed), under whichever consumer: a
    failure id is one record's, whoever acts on it."""
    if failure_ids:
        await connection.execute(delete(key_blocks).where(key_blocks.c.failure_id.in_(failure_ids)))


@dataclass(frozen=True)
class Released:
    """What `release` freed a key from: a quarantined head, a retrying head, or nothing."""

    blocked_by: str | None  # the failure id of the quarantined head that held it
    retrying: list[str]  # message ids of retry-tier heads that no longer hold it (they keep retrying)
    parked: int  # parked records of the key, which a consumer now applies in order

    @property
    def freed(self) -> bool:
        """Whether anything held the key."""
        return self.blocked_by is not None or bool(self.retrying)


async def release(connection: AsyncConnection, consumer: str, key: str) -> Released:
    """Free a key whatever holds it; its parked records are then applied in order by a consumer.

    A quarantined head's block is removed (the record stays quarantined). A head waiting in a retry tier keeps
    its retry row, so its tier copy is still recognised and retried, but no longer holds the key: the records
    behind it are applied now, before it, as the operator asked.
    """
    blocked_by = (
        await connection.execute(
            delete(key_blocks)
            .where(key_blocks.c.consumer_name == consumer, key_blocks.c.ordering_key == key)
            .returning(key_blocks.c.failure_id)
        )
    ).scalar()
    retrying = (
        await connection.execute(
            update(retries)
            .where(retries.c.consumer_name == consumer, retries.c.ordering_key == key)
            .values(ordering_key=None)
            .returning(retries.c.message_id)
        )
    ).scalars()
    waiting = (
        await connection.execute(
            select(func.count()).where(parked.c.consumer_name == consumer, parked.c.ordering_key == key)
        )
    ).scalar_one()
    return Released(blocked_by, sorted(retrying), int(waiting))


async def releasable(
    connection: AsyncConnection,
    consumer: str,
    member: str,
    *,
    exclude: Collection[str],
    keys: int,
    per_key: int,
    lease: timedelta,
) -> list[StoredParked]:
    """Claim parked records of keys that nothing holds any more, oldest first, a bounded number per key.

    Claims are taken one member at a time (a transaction-scoped advisory lock per consumer name), so exactly one
    member releases a key's records: a key is skipped while another member's lease on any of its records runs.
    The caller's keys in `exclude` are in its memory already: their leases are renewed instead. Commit after.
    """
    await connection.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('parked-release'), hashtext(:consumer))"), {"consumer": consumer}
    )
    until = func.now() + lease
    if exclude:
        # Only leases past their half, and never a row a round of this member holds (SKIP LOCKED: the round
        # deletes or releases rows in id order; waiting on it here, in key order, could deadlock with it).
        renew = (
            select(parked.c.id)
            .where(
                parked.c.consumer_name == consumer,
                parked.c.claimed_by == member,
                parked.c.ordering_key.in_(list(exclude)),
                parked.c.claimed_until < func.now() + lease / 2,
            )
            .order_by(parked.c.id)
            .with_for_update(skip_locked=True, key_share=False, read=False)
        )
        await connection.execute(update(parked).where(parked.c.id.in_(renew)).values(claimed_until=until))
    other = parked.alias("other")
    free = (
        select(parked.c.ordering_key)
        .where(
            parked.c.consumer_name == consumer,
            parked.c.ordering_key.not_in(list(exclude)),
            ~exists().where(and_(retries.c.consumer_name == consumer, retries.c.ordering_key == parked.c.ordering_key)),
            ~exists().where(
                and_(key_blocks.c.consumer_name == consumer, key_blocks.c.ordering_key == parked.c.ordering_key)
            ),
            ~exists().where(
                and_(
                    other.c.consumer_name == consumer,
                    other.c.ordering_key == parked.c.ordering_key,
                    other.c.claimed_by != member,
                    other.c.claimed_until > func.now(),
                )
            ),
        )
        .group_by(parked.c.ordering_key)
        .order_by(func.min(parked.c.id))
        .limit(keys)
    )
    free_keys = list((await connection.execute(free)).scalars())
    if not free_keys:
        return []
    numbered = (
        select(parked.c.id, func.row_number().over(partition_by=parked.c.ordering_key, order_by=parked.c.id).label("n"))
        .where(parked.c.consumer_name == consumer, parked.c.ordering_key.in_(free_keys))
        .subquery()
    )
    claimed = await connection.execute(
        update(parked)
        .where(parked.c.id.in_(select(numbered.c.id).where(numbered.c.n <= per_key)))
        .values(claimed_by=member, claimed_until=until)
        .returning(*parked.c)
    )
    return sorted((_stored(row) for row in claimed), key=lambda stored: stored.id)


async def unclaim(connection: AsyncConnection, member: str, ids: Sequence[int] | None = None) -> None:
    """Give up claims: on these parked rows (left parked, their key held again), or all of the member's."""
    statement = update(parked).where(parked.c.claimed_by == member).values(claimed_by=None, claimed_until=None)
    if ids is not None:
        if not ids:
            return
        statement = statement.where(parked.c.id.in_(ids))
    await connection.execute(statement)


def _stored(row: Any) -> StoredParked:
    return StoredParked(
        row.id,
        ParkedRecord(
            ordering_key=row.ordering_key,
            message_id=row.message_id,
            source_topic=row.source_topic,
            source_partition=row.source_partition,
            source_offset=row.source_offset,
            timestamp_ms=row.timestamp_ms,
            value=bytes(row.value) if row.value is not None else None,
            headers=list(row.headers),
            source_key=bytes(row.source_key) if row.source_key is not None else None,
        ),
    )


_SUMMARY = text(
    """
    WITH held AS (
        SELECT consumer_name, ordering_key FROM parked
        UNION
        SELECT consumer_name, ordering_key FROM key_blocks
    )
    SELECT held.consumer_name, held.ordering_key,
           (SELECT count(*) FROM parked p
             WHERE p.consumer_name = held.consumer_name AND p.ordering_key = held.ordering_key) AS parked,
           (SELECT min(parked_at) FROM parked p
             WHERE p.consumer_name = held.consumer_name AND p.ordering_key = held.ordering_key) AS oldest_parked_at,
           (SELECT min(source_topic) FROM parked p
             WHERE p.consumer_name = held.consumer_name AND p.ordering_key = held.ordering_key) AS source_topic,
           (SELECT failure_id FROM key_blocks b
             WHERE b.consumer_name = held.consumer_name AND b.ordering_key = held.ordering_key) AS blocked_by,
           (SELECT min(message_id) FROM retries r
             WHERE r.consumer_name = held.consumer_name AND r.ordering_key = held.ordering_key) AS retrying,
           (SELECT min(claimed_by) FROM parked p
             WHERE p.consumer_name = held.consumer_name AND p.ordering_key = held.ordering_key
               AND p.claimed_until > now()) AS releasing_by
    FROM held
    WHERE CAST(:consumer AS text) IS NULL OR held.consumer_name = :consumer
    ORDER BY oldest_parked_at NULLS LAST, held.consumer_name, held.ordering_key
    """
)


async def summary(connection: AsyncConnection, consumer: str | None = None) -> list[dict[str, Any]]:
    """Held keys of every consumer (or of one): parked records per key, since when, and what holds the key: a
    quarantined head (its failure id), a head in a retry tier (its message id), or nothing, the records then
    being released by a member (`releasing_by`) or waiting for a consumer to take them."""
    return [dict(row._mapping) for row in await connection.execute(_SUMMARY, {"consumer": consumer})]


async def holders(connection: AsyncConnection, key: str) -> list[str]:
    """The consumer names under which this key is held or has parked records."""
    result = await connection.execute(
        text(
            """
            SELECT consumer_name FROM parked WHERE ordering_key = :key
            UNION SELECT consumer_name FROM key_blocks WHERE ordering_key = :key
            UNION SELECT consumer_name FROM retries WHERE ordering_key = :key
            ORDER BY 1
            """
        ),
        {"key": key},
    )
    return list(result.scalars())


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
