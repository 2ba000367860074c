"""Records in a retry tier: one row per message id between its first tier hand-off and its terminal state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, delete, exists
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import inbox, retries


@dataclass(frozen=True)
class RetryRow:
    """The state of a record that went to a retry tier."""

    message_id: str
    ordering_key: str | None
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


async def drop_finished(connection: AsyncConnection, consumer: str, message_ids: Sequence[str]) -> None:
    """Remove the retry rows of these records that are terminal already (a hand-off that lost a race)."""
    await connection.execute(
        delete(retries).where(
            retries.c.consumer_name == consumer,
            retries.c.message_id.in_(message_ids),
            exists().where(and_(inbox.c.consumer_name == consumer, inbox.c.message_id == retries.c.message_id)),
        )
    )


async def sweep_orphans(connection: AsyncConnection) -> list[tuple[str, str]]:
    """Remove retry rows whose record is terminal (in the inbox): (consumer, message id) of each."""
    result = await connection.execute(
        delete(retries)
        .where(
            exists().where(
                and_(inbox.c.consumer_name == retries.c.consumer_name, inbox.c.message_id == retries.c.message_id)
            )
        )
        .returning(retries.c.consumer_name, retries.c.message_id)
    )
    return [(row.consumer_name, row.message_id) for row in result]
