"""Records in a retry tier: one row per message id between its first tier hand-off and its terminal state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import retries


@dataclass(frozen=True)
class RetryRow:
    """The state of a record that went to a retry tier."""

    message_id: str
    order_key: str | None
    failure_id: str
    attempts: int
    tier_step: int
    first_failed_at: datetime
    last_failed_at: datetime
    due_at: datetime
    error_code: str


async def upsert(connection: AsyncConnection, consumer: str, rows: Sequence[RetryRow]) -> None:
    """Record that these records were handed to their next tier."""
    if not rows:
        return
    statement = insert(retries).values([{"consumer_name": consumer, **row.__dict__} for row in rows])
    statement = statement.on_conflict_do_update(
        index_elements=[retries.c.consumer_name, retries.c.message_id],
        set_={
            name: statement.excluded[name]
            for name in ("attempts", "tier_step", "last_failed_at", "due_at", "error_code")
        },
    )
    await connection.execute(statement)


async def finish(connection: AsyncConnection, consumer: str, message_ids: Sequence[str]) -> None:
    """Forget records that reached a terminal state."""
    if message_ids:
        await connection.execute(
            delete(retries).where(retries.c.consumer_name == consumer, retries.c.message_id.in_(message_ids))
        )
