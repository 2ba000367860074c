"""Parked records and blocked keys (ORDERS_ORDERING=key)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.recordset import Columns


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
    trace_context: str | None = None  # the span context of the attempt that parked it (`traceparent`), if traced


@dataclass(frozen=True)
class StoredParked:
    """A parked row read back for release."""

    id: int
    record: ParkedRecord

    @property
    def trace_context(self) -> str | None:
        """The span context of the attempt that parked it."""
        return self.record.trace_context


# `ParkedRecord` values as a recordset (service/store/recordset.py): a round's parked records in one statement,
# inserted in the order given, so ids keep their arrival order.
COLUMNS = Columns(
    ("ordering_key", "text"),
    ("message_id", "text"),
    ("source_topic", "text"),
    ("source_partition", "int"),
    ("source_offset", "bigint"),
    ("timestamp_ms", "bigint"),
    ("value", "bytea"),
    ("headers", "jsonb"),
    ("source_key", "bytea"),
    ("trace_context", "text"),
)
# Two members parking one record at once (a rebalance): the second one's row is not needed.
_PARK = text(
    f"""
    INSERT INTO parked (consumer_name, ordering_key, message_id, source_topic, source_partition, source_offset,
                        timestamp_ms, value, headers, source_key, trace_context)
    SELECT :consumer, * FROM ({COLUMNS.select("parked_rows")}) AS v
    ON CONFLICT (consumer_name, message_id) DO NOTHING
    """
)
_UNPARK = text("DELETE FROM parked WHERE id = ANY(CAST(:ids AS bigint[]))")
_BLOCK = text(
    """
    INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)
    SELECT :consumer, b.ordering_key, b.failure_id, 'quarantined'
    FROM unnest(CAST(:keys AS text[]), CAST(:failure_ids AS text[])) AS b(ordering_key, failure_id)
    ON CONFLICT DO NOTHING
    """
)
_UNBLOCK_FAILURES = text(
    "DELETE FROM key_blocks WHERE consumer_name = :consumer AND failure_id = ANY(CAST(:failure_ids AS text[]))"
)


async def park(connection: AsyncConnection, consumer: str, records: Sequence[ParkedRecord]) -> None:
    """Park records in the caller's transaction (ids keep their arrival order)."""
    if records:
        await connection.execute(_PARK, {"consumer": consumer, "parked_rows": COLUMNS.encode(records)})


async def unpark(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Delete parked rows whose records reached a terminal state."""
    if ids:
        await connection.execute(_UNPARK, {"ids": list(ids)})


async def block(connection: AsyncConnection, consumer: str, blocks: Sequence[tuple[str, str]]) -> None:
    """Block keys whose head was quarantined: (key, failure id)."""
    if blocks:
        await connection.execute(
            _BLOCK,
            {
                "consumer": consumer,
                "keys": [key for key, _ in blocks],
                "failure_ids": [failure_id for _, failure_id in blocks],
            },
        )


async def unblock_failures(connection: AsyncConnection, consumer: str, failure_ids: Sequence[str]) -> None:
    """Free the keys this consumer's quarantined heads held (resolved or reprocessed): another consumer name's
    record of the same failure id holds that consumer's keys, until its own record is resolved or reprocessed."""
    if failure_ids:
        await connection.execute(_UNBLOCK_FAILURES, {"consumer": consumer, "failure_ids": list(failure_ids)})


_UNBLOCK_KEY = text(
    "DELETE FROM key_blocks WHERE consumer_name = :consumer AND ordering_key = :key RETURNING failure_id"
)
_UNHOLD_RETRYING = text(
    "UPDATE retries SET ordering_key = NULL WHERE consumer_name = :consumer AND ordering_key = :key"
    " RETURNING message_id"
)
_COUNT_PARKED = text("SELECT count(*) FROM parked WHERE consumer_name = :consumer AND ordering_key = :key")


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
    params = {"consumer": consumer, "key": key}
    blocked_by = (await connection.execute(_UNBLOCK_KEY, params)).scalar()
    retrying = (await connection.execute(_UNHOLD_RETRYING, params)).scalars()
    waiting = (await connection.execute(_COUNT_PARKED, params)).scalar_one()
    return Released(blocked_by, sorted(retrying), int(waiting))


# Claims are taken one member at a time per consumer name (see `releasable`).
_RELEASE_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('parked-release'), hashtext(:consumer))")
# Only leases past their half, and never a row a round of this member holds (SKIP LOCKED: the round deletes or
# releases rows in id order; waiting on it here, in key order, could deadlock with it).
_RENEW = text(
    """
    UPDATE parked SET claimed_until = now() + CAST(:lease AS interval)
    WHERE id IN (
        SELECT id FROM parked
        WHERE consumer_name = :consumer AND claimed_by = :member AND ordering_key = ANY(CAST(:exclude AS text[]))
          AND claimed_until < now() + CAST(:lease AS interval) / 2
        ORDER BY id
        FOR UPDATE SKIP LOCKED)
    """
)
# Keys that nothing holds (no retrying head, no block, no other member's running lease), oldest first. The keys in
# memory are looked up in a hash of them, in a generic plan too (as the relay's claim: service/store/outbox.py).
_FREE_KEYS = text(
    """
    SELECT p.ordering_key FROM parked p
    WHERE p.consumer_name = :consumer AND p.ordering_key NOT IN (SELECT unnest(CAST(:exclude AS text[])))
      AND NOT EXISTS (SELECT FROM retries r WHERE r.consumer_name = :consumer AND r.ordering_key = p.ordering_key)
      AND NOT EXISTS (SELECT FROM key_blocks b WHERE b.consumer_name = :consumer AND b.ordering_key = p.ordering_key)
      AND NOT EXISTS (
            SELECT FROM parked o
            WHERE o.consumer_name = :consumer AND o.ordering_key = p.ordering_key
              AND o.claimed_by <> :member AND o.claimed_until > now())
    GROUP BY p.ordering_key
    ORDER BY min(p.id)
    LIMIT :keys
    """
)
# The first `per_key` records of each free key.
_CLAIM = text(
    """
    UPDATE parked SET claimed_by = :member, claimed_until = now() + CAST(:lease AS interval)
    WHERE id IN (
        SELECT id FROM (
            SELECT id, row_number() OVER (PARTITION BY ordering_key ORDER BY id) AS n FROM parked
            WHERE consumer_name = :consumer AND ordering_key = ANY(CAST(:free AS text[]))) AS numbered
        WHERE n <= :per_key)
    RETURNING id, ordering_key, message_id, source_topic, source_partition, source_offset, timestamp_ms, value,
              headers, source_key, trace_context
    """
)


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
    await connection.execute(_RELEASE_LOCK, {"consumer": consumer})
    if exclude:
        await connection.execute(
            _RENEW, {"consumer": consumer, "member": member, "exclude": list(exclude), "lease": lease}
        )
    free = await connection.execute(
        _FREE_KEYS, {"consumer": consumer, "member": member, "exclude": list(exclude), "keys": keys}
    )
    free_keys = list(free.scalars())
    if not free_keys:
        return []
    claimed = await connection.execute(
        _CLAIM,
        {"consumer": consumer, "member": member, "free": free_keys, "per_key": per_key, "lease": lease},
    )
    return sorted((_stored(row) for row in claimed), key=lambda stored: stored.id)


# Every claim of the member when :ids is NULL.
_UNCLAIM = text(
    """
    UPDATE parked SET claimed_by = NULL, claimed_until = NULL
    WHERE claimed_by = :member AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
    """
)


async def unclaim(connection: AsyncConnection, member: str, ids: Sequence[int] | None = None) -> None:
    """Give up claims: on these parked rows (left parked, their key held again), or all of the member's."""
    if ids is not None and not ids:
        return
    await connection.execute(_UNCLAIM, {"member": member, "ids": list(ids) if ids is not None else None})


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
            trace_context=row.trace_context,
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


_HOLDERS = text(
    """
    SELECT consumer_name FROM parked WHERE ordering_key = :key
    UNION SELECT consumer_name FROM key_blocks WHERE ordering_key = :key
    UNION SELECT consumer_name FROM retries WHERE ordering_key = :key
    ORDER BY 1
    """
)


async def holders(connection: AsyncConnection, key: str) -> list[str]:
    """The consumer names under which this key is held or has parked records."""
    return list((await connection.execute(_HOLDERS, {"key": key})).scalars())
