"""The inbox: one row per message id that reached a terminal state (processed, rejected, quarantined)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import inbox


@dataclass(frozen=True)
class InboxRow:
    """A terminal record, ready to insert."""

    message_id: str
    status: str
    source_topic: str
    source_partition: int
    source_offset: int
    order_id: str | None
    error_code: str | None
    received_at: datetime


async def known(connection: AsyncConnection, consumer: str, message_ids: Iterable[str]) -> set[str]:
    """The message ids that already have a terminal row: redeliveries."""
    ids = list(set(message_ids))
    if not ids:
        return set()
    rows = await connection.execute(
        select(inbox.c.message_id).where(inbox.c.consumer_name == consumer, inbox.c.message_id.in_(ids))
    )
    return set(rows.scalars())


async def add(connection: AsyncConnection, consumer: str, rows: Sequence[InboxRow]) -> set[str]:
    """Insert terminal rows; return the ids actually inserted (a missing one lost a race to a concurrent
    consumer, and the caller must not apply its business change)."""
    if not rows:
        return set()
    statement = (
        insert(inbox)
        .values([{"consumer_name": consumer, **row.__dict__} for row in rows])
        .on_conflict_do_nothing(index_elements=[inbox.c.consumer_name, inbox.c.message_id])
        .returning(inbox.c.message_id)
    )
    result = await connection.execute(statement)
    return set(result.scalars())
