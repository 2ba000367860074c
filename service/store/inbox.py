"""The inbox: one row per message id that reached a terminal state (processed, rejected, quarantined)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text
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


async def known(connection: AsyncConnection, consumer: str, message_ids: Iterable[str]) -> dict[str, str]:
    """The status of each of these message ids that already has a terminal row (a redelivery, or a reprocess)."""
    ids = list(set(message_ids))
    if not ids:
        return {}
    rows = await connection.execute(
        select(inbox.c.message_id, inbox.c.status).where(inbox.c.consumer_name == consumer, inbox.c.message_id.in_(ids))
    )
    return {message_id: status for message_id, status in rows}


async def reopen(connection: AsyncConnection, consumer: str, rows: Sequence[InboxRow]) -> set[str]:
    """Move quarantined messages that a reprocess applied to their new status; return the ids moved.

    Only a `quarantined` row moves: a message may become `processed` once, never twice.
    """
    if not rows:
        return set()
    result = await connection.execute(
        text(
            """
            UPDATE inbox SET status = v.status, error_code = v.error_code, processed_at = now()
            FROM unnest(CAST(:ids AS text[]), CAST(:statuses AS text[]), CAST(:codes AS text[]))
                 AS v(message_id, status, error_code)
            WHERE inbox.consumer_name = :consumer AND inbox.message_id = v.message_id
              AND inbox.status = 'quarantined'
            RETURNING inbox.message_id
            """
        ),
        {
            "consumer": consumer,
            "ids": [row.message_id for row in rows],
            "statuses": [row.status for row in rows],
            "codes": [row.error_code for row in rows],
        },
    )
    return set(result.scalars())


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
