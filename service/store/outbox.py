"""The outbox: messages written in the business transaction, published later by the relay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy.headers import Headers, from_json
from service.policy.records import unpack_key
from service.store.recordset import Columns


@dataclass  # not frozen (slower to build): one is built per event
class OutboxMessage:
    """One message to publish."""

    topic: str
    key: str | None
    # Our own headers as {name: text}; a copy's original headers as `service.policy.headers.to_json` stores them.
    headers: dict[str, str] | list[list[str]]
    payload: bytes
    # A copy's original Kafka key, exactly (`service.policy.records.pack_key`); None: publish `key` as UTF-8.
    # `key` stays the ordering key the relay keeps each key's rows in order by.
    kafka_key: bytes | None = None

    @staticmethod
    def json(topic: str, key: str | None, headers: dict[str, str], document: dict[str, Any]) -> OutboxMessage:
        """A message whose value is a compact JSON document."""
        return OutboxMessage(topic, key, headers, orjson.dumps(document))


@dataclass(frozen=True)
class ClaimedRow:
    """An unpublished row this relay holds the lock of."""

    id: int
    topic: str
    key: str | None
    headers: Headers
    payload: bytes
    kafka_key: bytes | None = None

    @property
    def key_bytes(self) -> bytes | None:
        """The key to publish: a copy's original bytes (null included), else the ordering key as UTF-8."""
        if self.kafka_key is not None:
            return unpack_key(self.kafka_key)
        return self.key.encode() if self.key is not None else None

    @property
    def size(self) -> int:
        """The bytes of the payload and the headers, before compression."""
        return len(self.payload) + sum(len(name.encode()) + len(value) for name, value in self.headers)


async def add(connection: AsyncConnection, messages: Sequence[OutboxMessage]) -> list[int]:
    """Add messages in the caller's transaction; return their row ids."""
    if not messages:
        return []
    result = await connection.execute(_ADD, {"outbox_rows": COLUMNS.encode(messages)})
    return [row.id for row in result]


# Also part of a round's one write statement (service/store/batch.py).
COLUMNS = Columns(
    ("topic", "text"), ("key", "text"), ("headers", "jsonb"), ("payload", "bytea"), ("kafka_key", "bytea")
)
ADD_ROWS = f"""
    INSERT INTO outbox (topic, key, headers, payload, kafka_key)
    SELECT topic, key, headers, payload, kafka_key FROM ({COLUMNS.select("outbox_rows")}) AS v"""
_ADD = text(ADD_ROWS + "\n    RETURNING id")


_CLAIM = text(
    """
    SELECT id, topic, key, headers, payload, kafka_key FROM outbox
    WHERE published_at IS NULL AND set_aside_at IS NULL ORDER BY id LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)
# For each key, the oldest unpublished row this relay did not claim: it publishes that key only up to there.
_BARRIERS = text(
    """
    SELECT key, min(id) FROM outbox
    WHERE published_at IS NULL AND set_aside_at IS NULL
      AND key = ANY(CAST(:keys AS text[])) AND id <> ALL(CAST(:claimed AS bigint[]))
    GROUP BY key
    """
)
_UNPUBLISHED = text("SELECT id FROM outbox WHERE published_at IS NULL AND id = ANY(CAST(:ids AS bigint[]))")
_MARK = text("UPDATE outbox SET published_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))")
_SET_ASIDE = text(
    "UPDATE outbox SET set_aside_at = now(), set_aside_code = :code WHERE id = ANY(CAST(:ids AS bigint[]))"
)
_SET_ASIDE_ROWS = text(
    """
    SELECT id, topic, key, set_aside_code AS code, set_aside_at, created_at, length(payload) AS payload_bytes
    FROM outbox WHERE set_aside_at IS NOT NULL AND published_at IS NULL ORDER BY id LIMIT :limit
    """
)
_PUT_BACK = text(
    "UPDATE outbox SET set_aside_at = NULL, set_aside_code = NULL"
    " WHERE id = :id AND set_aside_at IS NOT NULL AND published_at IS NULL"
)


async def claim(connection: AsyncConnection, limit: int) -> list[ClaimedRow]:
    """Lock up to `limit` unpublished rows, skipping rows another relay holds, and keep per-key order.

    Claiming is by state (`published_at IS NULL`), never by an id cursor: ids commit out of order.
    A key's rows are kept only up to the first unpublished row of that key that this relay did not
    claim, so two relays never publish one key's messages out of order.
    """
    result = await connection.execute(_CLAIM, {"limit": limit})
    rows = [
        ClaimedRow(
            r.id,
            r.topic,
            r.key,
            from_json(r.headers),
            bytes(r.payload),
            bytes(r.kafka_key) if r.kafka_key is not None else None,
        )
        for r in result
    ]
    keys = sorted({row.key for row in rows if row.key is not None})
    if not keys:
        return rows
    barriers = await connection.execute(_BARRIERS, {"keys": keys, "claimed": [row.id for row in rows]})
    barrier = {key: first_id for key, first_id in barriers}
    return [row for row in rows if row.key is None or row.id < barrier.get(row.key, row.id + 1)]


async def unpublished(connection: AsyncConnection, ids: Sequence[int]) -> set[int]:
    """Those of `ids` the relay has not published yet."""
    if not ids:
        return set()
    return {row.id for row in await connection.execute(_UNPUBLISHED, {"ids": list(ids)})}


async def mark_published(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Mark rows published in the claiming transaction."""
    if ids:
        await connection.execute(_MARK, {"ids": list(ids)})


async def set_aside(connection: AsyncConnection, ids: Sequence[int], code: str) -> None:
    """Take claimed rows Kafka refused for their content out of the relay's way, with the reason."""
    if ids:
        await connection.execute(_SET_ASIDE, {"ids": list(ids), "code": code})


@dataclass(frozen=True)
class SetAsideRow:
    """A row the relay set aside, as operators list it (no payload)."""

    id: int
    topic: str
    key: str | None
    code: str
    set_aside_at: datetime
    created_at: datetime
    payload_bytes: int


async def set_aside_rows(connection: AsyncConnection, limit: int = 100) -> list[SetAsideRow]:
    """The rows set aside and not published, oldest first."""
    result = await connection.execute(_SET_ASIDE_ROWS, {"limit": limit})
    return [SetAsideRow(**row._mapping) for row in result]


async def put_back(connection: AsyncConnection, row_id: int) -> bool:
    """Hand a set-aside row to the relay again (after the broker's limit was raised); False if there is none."""
    result = await connection.execute(_PUT_BACK, {"id": row_id})
    return bool(result.rowcount)


# As for the inbox (inbox.purge): small ctid batches, never waiting on a locked row.
_PURGE_PUBLISHED = text(
    """
    DELETE FROM outbox WHERE ctid IN (
        SELECT ctid FROM outbox WHERE published_at < now() - CAST(:older_than AS interval)
        LIMIT :limit FOR UPDATE SKIP LOCKED)
    """
)


async def purge_published(connection: AsyncConnection, older_than: timedelta, limit: int) -> int:
    """Delete up to `limit` rows published more than `older_than` ago; return how many."""
    result = await connection.execute(_PURGE_PUBLISHED, {"older_than": older_than, "limit": limit})
    return int(result.rowcount)
