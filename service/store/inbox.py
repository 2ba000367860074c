"""The inbox: one row per message id that reached a terminal state (processed, rejected, quarantined)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.recordset import recordset


@dataclass  # neither frozen (slow to build) nor slotted (slow for orjson): one is built per record
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


# One statement per batch, whatever its size: a recordset, not a VALUES list compiled per row.
_ADD = text(
    """
    WITH inserted AS (
        INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                           order_id, error_code, received_at)
        SELECT :consumer, * FROM json_to_recordset(CAST(:rows AS json)) AS v(
            message_id text, status text, source_topic text, source_partition int, source_offset bigint,
            order_id text, error_code text, received_at timestamptz)
        ON CONFLICT (consumer_name, message_id) DO NOTHING
        RETURNING 1)
    SELECT count(*) FROM inserted
    """
)


async def add(connection: AsyncConnection, consumer: str, rows: Sequence[InboxRow]) -> int:
    """Insert terminal rows; return how many were inserted (fewer than given: a concurrent consumer won a race
    for one of them, and the caller must not apply its business change)."""
    if not rows:
        return 0
    result = await connection.execute(_ADD, {"consumer": consumer, "rows": recordset(rows)})
    return int(result.scalar_one())


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
