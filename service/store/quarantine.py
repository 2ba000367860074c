"""The quarantine table: an operational queue of records that could not be processed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import quarantine


@dataclass(frozen=True)
class QuarantineRow:
    """A record to quarantine, with its envelope and original bytes."""

    failure_id: str
    message_id: str
    error_code: str
    owner: str
    order_key: str | None
    envelope: dict[str, Any]
    payload: bytes | None
    source_headers: list[list[str]]
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime


async def add(connection: AsyncConnection, consumer: str, rows: Sequence[QuarantineRow]) -> None:
    """Insert rows; a failure id quarantined already keeps its row (a redelivery after a crash)."""
    if rows:
        values = [{"consumer_name": consumer, **row.__dict__} for row in rows]
        await connection.execute(insert(quarantine).values(values).on_conflict_do_nothing())


_SUMMARY = (
    quarantine.c.failure_id,
    quarantine.c.message_id,
    quarantine.c.error_code,
    quarantine.c.status,
    quarantine.c.owner,
    quarantine.c.order_key,
    quarantine.c.attempts,
    quarantine.c.first_failed_at,
    quarantine.c.last_failed_at,
)


async def listing(
    connection: AsyncConnection,
    *,
    error_code: str | None = None,
    status: str | None = None,
    older_than: timedelta | None = None,
    key: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Quarantined records, oldest first, filtered."""
    query = select(*_SUMMARY).order_by(quarantine.c.first_failed_at, quarantine.c.failure_id).limit(limit)
    if error_code:
        query = query.where(quarantine.c.error_code == error_code)
    if status:
        query = query.where(quarantine.c.status == status)
    if key:
        query = query.where(quarantine.c.order_key == key)
    if older_than:
        query = query.where(quarantine.c.first_failed_at <= func.now() - older_than)
    return [dict(row._mapping) for row in await connection.execute(query)]


async def get(connection: AsyncConnection, failure_id: str) -> dict[str, Any] | None:
    """One quarantined record with its envelope, annotations and original bytes."""
    row = (await connection.execute(select(quarantine).where(quarantine.c.failure_id == failure_id))).first()
    return dict(row._mapping) if row else None


async def stats(connection: AsyncConnection) -> dict[str, Any]:
    """Counts per error code and owner, rates over the last hour, and the age of the oldest open record."""
    open_ = quarantine.c.status == "open"
    by_code = await connection.execute(
        select(
            quarantine.c.error_code,
            quarantine.c.owner,
            func.count().filter(open_).label("open"),
            func.count().label("total"),
            func.count().filter(quarantine.c.created_at > func.now() - timedelta(hours=1)).label("last_hour"),
        )
        .group_by(quarantine.c.error_code, quarantine.c.owner)
        .order_by(quarantine.c.error_code, quarantine.c.owner)
    )
    oldest = await connection.execute(
        select(func.extract("epoch", func.now() - func.min(quarantine.c.first_failed_at))).where(open_)
    )
    age = oldest.scalar_one()
    groups = [
        {
            "error_code": row.error_code,
            "owner": row.owner,
            "open": row.open,
            "total": row.total,
            "rate_per_hour": row.last_hour,
        }
        for row in by_code
    ]
    return {
        "open": sum(group["open"] for group in groups),
        "oldest_open_age_seconds": float(age) if age is not None else None,
        "by_code": groups,
    }
