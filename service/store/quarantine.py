"""The quarantine table: an operational queue of records that could not be processed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.recordset import Columns
from service.store.tables import quarantine, quarantine_annotations, quarantine_events, reprocess_items


@dataclass(frozen=True)
class QuarantineRow:
    """A record to quarantine, with its envelope and original bytes."""

    failure_id: str
    message_id: str
    error_code: str
    owner: str
    ordering_key: str | None
    envelope: dict[str, Any]
    payload: bytes | None
    source_headers: list[list[str]]
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime


# Quarantines a round's records, part of its one write statement (service/store/batch.py); a failure id
# quarantined already keeps its row (a redelivery after a crash).
COLUMNS = Columns(
    ("failure_id", "text"),
    ("message_id", "text"),
    ("error_code", "text"),
    ("owner", "text"),
    ("ordering_key", "text"),
    ("envelope", "jsonb"),
    ("payload", "bytea"),
    ("source_headers", "jsonb"),
    ("attempts", "int"),
    ("first_failed_at", "timestamptz"),
    ("last_failed_at", "timestamptz"),
)
ADD_ROWS = f"""
    INSERT INTO quarantine (consumer_name, failure_id, message_id, error_code, owner, ordering_key, envelope, payload,
                            source_headers, attempts, first_failed_at, last_failed_at)
    SELECT :consumer, * FROM ({COLUMNS.select("quarantine_rows")}) AS v
    ON CONFLICT (failure_id) DO NOTHING"""


_SUMMARY = (
    quarantine.c.failure_id,
    quarantine.c.message_id,
    quarantine.c.error_code,
    quarantine.c.status,
    quarantine.c.owner,
    quarantine.c.ordering_key,
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
    message_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Quarantined records, oldest first, filtered: one page of them, and how many match in all."""
    conditions = []
    if error_code:
        conditions.append(quarantine.c.error_code == error_code)
    if status:
        conditions.append(quarantine.c.status == status)
    if key:
        conditions.append(quarantine.c.ordering_key == key)
    if message_id:
        conditions.append(quarantine.c.message_id == message_id)
    if older_than:
        conditions.append(quarantine.c.first_failed_at <= func.now() - older_than)
    if since:
        conditions.append(quarantine.c.first_failed_at >= since)
    if until:
        conditions.append(quarantine.c.first_failed_at < until)
    query = (
        select(*_SUMMARY, func.count().over().label("matching"))
        .where(*conditions)
        .order_by(quarantine.c.first_failed_at, quarantine.c.failure_id)
        .limit(limit)
        .offset(offset)
    )
    rows = [dict(row._mapping) for row in await connection.execute(query)]
    if rows:
        total = int(rows[0]["matching"])
    else:
        total = int(
            (await connection.execute(select(func.count()).select_from(quarantine).where(*conditions))).scalar_one()
        )
    for row in rows:
        del row["matching"]
    return rows, total


async def get(connection: AsyncConnection, failure_id: str) -> dict[str, Any] | None:
    """One quarantined record with its envelope, original bytes, annotations, reprocess history and timeline."""
    row = (await connection.execute(select(quarantine).where(quarantine.c.failure_id == failure_id))).first()
    if row is None:
        return None
    record = dict(row._mapping)
    notes = await connection.execute(
        select(quarantine_annotations.c.author, quarantine_annotations.c.note, quarantine_annotations.c.created_at)
        .where(quarantine_annotations.c.failure_id == failure_id)
        .order_by(quarantine_annotations.c.id)
    )
    record["annotations"] = [dict(note._mapping) for note in notes]
    items = await connection.execute(
        select(
            reprocess_items.c.run_id,
            reprocess_items.c.attempt,
            reprocess_items.c.outcome,
            reprocess_items.c.published_at,
            reprocess_items.c.verified_at,
        )
        .where(reprocess_items.c.failure_id == failure_id)
        .order_by(reprocess_items.c.attempt)
    )
    record["reprocessing"] = [dict(item._mapping) for item in items]
    events = await connection.execute(
        select(
            quarantine_events.c.at,
            quarantine_events.c.event,
            quarantine_events.c.error_code,
            quarantine_events.c.attempts,
            quarantine_events.c.actor,
            quarantine_events.c.detail,
        )
        .where(quarantine_events.c.failure_id == failure_id)
        .order_by(quarantine_events.c.id)
    )
    # In the order the database appended them (migration 0009's triggers): every failure and change, none
    # rewritten; the times are the clocks that saw each one.
    record["timeline"] = [dict(event._mapping) for event in events]
    return record


async def annotate(connection: AsyncConnection, failure_id: str, author: str, note: str) -> bool:
    """Append a note; False when there is no such record."""
    found = (
        await connection.execute(select(quarantine.c.failure_id).where(quarantine.c.failure_id == failure_id))
    ).first()
    if found is None:
        return False
    await connection.execute(insert(quarantine_annotations).values(failure_id=failure_id, author=author, note=note))
    return True


async def resolve(connection: AsyncConnection, failure_id: str, reason: str, author: str) -> str | None:
    """Close an open record without reprocessing it; returns its previous status (None: no such record)."""
    current = (
        await connection.execute(
            select(quarantine.c.status).where(quarantine.c.failure_id == failure_id).with_for_update()
        )
    ).scalar()
    if current != "open":
        return str(current) if current is not None else None
    await connection.execute(
        update(quarantine)
        .where(quarantine.c.failure_id == failure_id)
        .values(status="resolved", resolution=reason, resolved_by=author, resolved_at=func.now(), updated_at=func.now())
    )
    return "open"


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


async def mark_reprocessed(connection: AsyncConnection, failure_ids: Sequence[str]) -> None:
    """Records whose reprocessed copy was applied: `reprocessed` (terminal)."""
    if failure_ids:
        await connection.execute(
            update(quarantine)
            .where(quarantine.c.failure_id.in_(failure_ids))
            .values(status="reprocessed", updated_at=func.now())
        )


async def requarantine(
    connection: AsyncConnection, failure_id: str, code: str, attempts: int, failed_at: datetime
) -> None:
    """A reprocessed record failed again: open again, with its repeat-failure count raised."""
    await connection.execute(
        update(quarantine)
        .where(quarantine.c.failure_id == failure_id)
        .values(
            status="open",
            error_code=code,
            owner=quarantine.c.owner,
            repeat_failures=quarantine.c.repeat_failures + 1,
            attempts=quarantine.c.attempts + attempts,
            last_failed_at=failed_at,
            envelope=quarantine.c.envelope.op("||")(
                func.jsonb_build_object("errorCode", code, "lastFailedAt", failed_at.isoformat())
            ),
            updated_at=func.now(),
        )
    )
