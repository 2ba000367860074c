"""The outbox: messages written in the business transaction, published later by the relay."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import outbox


@dataclass(frozen=True)
class OutboxMessage:
    """One message to publish."""

    topic: str
    key: str | None
    headers: dict[str, str]
    payload: bytes

    @staticmethod
    def json(topic: str, key: str | None, headers: dict[str, str], document: dict[str, Any]) -> OutboxMessage:
        """A message whose value is a compact JSON document."""
        return OutboxMessage(topic, key, headers, json.dumps(document, separators=(",", ":")).encode())


@dataclass(frozen=True)
class ClaimedRow:
    """An unpublished row this relay holds the lock of."""

    id: int
    topic: str
    key: str | None
    headers: dict[str, str]
    payload: bytes


async def add(connection: AsyncConnection, messages: Sequence[OutboxMessage]) -> None:
    """Add messages in the caller's transaction."""
    if messages:
        await connection.execute(
            _ADD,
            {
                "topics": [m.topic for m in messages],
                "keys": [m.key for m in messages],
                "headers": [json.dumps(m.headers) for m in messages],
                "payloads": [m.payload for m in messages],
            },
        )


_ADD = text(
    """
    INSERT INTO outbox (topic, key, headers, payload)
    SELECT t, k, CAST(h AS jsonb), p
    FROM unnest(CAST(:topics AS text[]), CAST(:keys AS text[]), CAST(:headers AS text[]), CAST(:payloads AS bytea[]))
         AS v(t, k, h, p)
    """
)


async def claim(connection: AsyncConnection, limit: int) -> list[ClaimedRow]:
    """Lock up to `limit` unpublished rows, skipping rows another relay holds, and keep per-key order.

    Claiming is by state (`published_at IS NULL`), never by an id cursor: ids commit out of order.
    A key's rows are kept only up to the first unpublished row of that key that this relay did not
    claim, so two relays never publish one key's messages out of order.
    """
    result = await connection.execute(
        select(outbox.c.id, outbox.c.topic, outbox.c.key, outbox.c.headers, outbox.c.payload)
        .where(outbox.c.published_at.is_(None))
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    rows = [ClaimedRow(r.id, r.topic, r.key, dict(r.headers), bytes(r.payload)) for r in result]
    keys = sorted({row.key for row in rows if row.key is not None})
    if not keys:
        return rows
    barriers = await connection.execute(
        select(outbox.c.key, func.min(outbox.c.id))
        .where(
            outbox.c.published_at.is_(None),
            outbox.c.key.in_(keys),
            outbox.c.id.not_in([row.id for row in rows]),
        )
        .group_by(outbox.c.key)
    )
    barrier = {key: first_id for key, first_id in barriers}
    return [row for row in rows if row.key is None or row.id < barrier.get(row.key, row.id + 1)]


async def mark_published(connection: AsyncConnection, ids: Sequence[int]) -> None:
    """Mark rows published in the claiming transaction."""
    if ids:
        await connection.execute(update(outbox).where(outbox.c.id.in_(ids)).values(published_at=func.now()))


async def pending_count(connection: AsyncConnection) -> int:
    """How many rows wait to be published."""
    result = await connection.execute(select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None)))
    return int(result.scalar_one())
