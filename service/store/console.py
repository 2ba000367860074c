"""What the console reads beyond the CLI's own queries: the overview's last day and the detail of a held key.

Each query reads an index or a bounded range (the last 24 hours, one key): cheap whatever the history size.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Records quarantined per error code and hour over the last day (a range of the created_at index), grouped by
# the truncated time first: a few hundred groups hashed, rather than the day's rows sorted.
_RATE = text(
    """
    SELECT error_code, extract(epoch FROM hour) AS hour, quarantined FROM (
        SELECT error_code, date_trunc('hour', created_at) AS hour, count(*) AS quarantined
        FROM quarantine WHERE created_at > now() - interval '24 hours'
        GROUP BY 1, 2) AS per_hour
    ORDER BY 1, 2
    """
)
_LAST_RECONCILE = text(
    "SELECT id, started_at, finished_at, outcome, summary FROM reconcile_runs ORDER BY finished_at DESC LIMIT 1"
)
_NOW = text("SELECT extract(epoch FROM now())")


async def last_day(connection: AsyncConnection) -> tuple[float, list[dict[str, Any]]]:
    """The database's clock (seconds since the epoch) and the records quarantined per error code and hour
    over the 24 hours before it."""
    now = float((await connection.execute(_NOW)).scalar_one())
    return now, [dict(row._mapping) for row in await connection.execute(_RATE)]


async def last_reconcile(connection: AsyncConnection) -> dict[str, Any] | None:
    """The last reconciler pass (None: never run)."""
    row = (await connection.execute(_LAST_RECONCILE)).first()
    return dict(row._mapping) if row is not None else None


_PARKED_OF = text(
    """
    SELECT id, message_id, source_topic, source_partition, source_offset, parked_at, claimed_by, claimed_until
    FROM parked WHERE consumer_name = :consumer AND ordering_key = :key
    ORDER BY id LIMIT :limit
    """
)
_BLOCK_OF = text("SELECT failure_id FROM key_blocks WHERE consumer_name = :consumer AND ordering_key = :key")
_RETRYING_OF = text(
    "SELECT message_id FROM retries WHERE consumer_name = :consumer AND ordering_key = :key ORDER BY message_id"
)


async def held_key(connection: AsyncConnection, consumer: str, key: str, *, limit: int = 200) -> dict[str, Any]:
    """One held key: the quarantined head that blocks it, the retrying heads that hold it, and the first
    records parked behind it, in the order they will be applied."""
    params = {"consumer": consumer, "key": key}
    blocked_by = (await connection.execute(_BLOCK_OF, params)).scalar()
    retrying = [row.message_id for row in await connection.execute(_RETRYING_OF, params)]
    parked = [dict(row._mapping) for row in await connection.execute(_PARKED_OF, {**params, "limit": limit})]
    return {
        "consumer_name": consumer,
        "ordering_key": key,
        "blocked_by": blocked_by,
        "retrying": retrying,
        "parked": parked,
    }
