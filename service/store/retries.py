"""Records in a retry tier: one row per message id between its first tier hand-off and its terminal state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.recordset import Columns


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


# `RetryRow` values as a recordset (service/store/recordset.py): a round's hand-offs in one statement.
COLUMNS = Columns(
    ("message_id", "text"),
    ("ordering_key", "text"),
    ("failure_id", "text"),
    ("attempts", "int"),
    ("tier_step", "int"),
    ("first_failed_at", "timestamptz"),
    ("last_failed_at", "timestamptz"),
    ("due_at", "timestamptz"),
    ("error_code", "text"),
)
_UPSERT = text(
    f"""
    INSERT INTO retries (consumer_name, message_id, ordering_key, failure_id, attempts, tier_step, first_failed_at,
                         last_failed_at, due_at, error_code)
    SELECT :consumer, * FROM ({COLUMNS.select("retry_rows")}) AS v
    ON CONFLICT (consumer_name, message_id) DO UPDATE
    SET attempts = excluded.attempts, tier_step = excluded.tier_step, last_failed_at = excluded.last_failed_at,
        due_at = excluded.due_at, error_code = excluded.error_code
    """
)
_FINISH = text("DELETE FROM retries WHERE consumer_name = :consumer AND message_id = ANY(CAST(:ids AS text[]))")
_DROP_FINISHED = text(
    """
    DELETE FROM retries
    WHERE consumer_name = :consumer AND message_id = ANY(CAST(:ids AS text[]))
      AND EXISTS (SELECT FROM inbox i WHERE i.consumer_name = :consumer AND i.message_id = retries.message_id)
    """
)
_SWEEP_ORPHANS = text(
    """
    DELETE FROM retries r
    WHERE EXISTS (SELECT FROM inbox i WHERE i.consumer_name = r.consumer_name AND i.message_id = r.message_id)
    RETURNING r.consumer_name, r.message_id
    """
)


async def upsert(connection: AsyncConnection, consumer: str, rows: Sequence[RetryRow]) -> None:
    """Record that these records were handed to their next tier."""
    if rows:
        await connection.execute(_UPSERT, {"consumer": consumer, "retry_rows": COLUMNS.encode(rows)})


async def finish(connection: AsyncConnection, consumer: str, message_ids: Sequence[str]) -> None:
    """Forget records that reached a terminal state."""
    if message_ids:
        await connection.execute(_FINISH, {"consumer": consumer, "ids": list(message_ids)})


async def drop_finished(connection: AsyncConnection, consumer: str, message_ids: Sequence[str]) -> None:
    """Remove the retry rows of these records that are terminal already (a hand-off that lost a race)."""
    await connection.execute(_DROP_FINISHED, {"consumer": consumer, "ids": list(message_ids)})


async def sweep_orphans(connection: AsyncConnection) -> list[tuple[str, str]]:
    """Remove retry rows whose record is terminal (in the inbox): (consumer, message id) of each."""
    result = await connection.execute(_SWEEP_ORPHANS)
    return [(row.consumer_name, row.message_id) for row in result]
