"""Reprocess audit and selection: which quarantined records a run takes, and what became of each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import effects, inbox, quarantine, reprocess_items, reprocess_runs


@dataclass(frozen=True)
class Candidate:
    """A quarantined record a run may send back."""

    failure_id: str
    message_id: str
    ordering_key: str | None
    error_code: str
    status: str
    payload: bytes | None
    source_headers: list[list[str]]
    envelope: dict[str, Any]
    repeat_failures: int


@dataclass(frozen=True)
class ItemState:
    """The business state of one item: what verification compares before and after."""

    inbox_status: str | None
    quarantine_status: str
    repeat_failures: int
    effects: int


def _selected(
    query: Any,
    *,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    consumer: str | None = None,
) -> Any:
    if consumer is not None:
        query = query.where(quarantine.c.consumer_name == consumer)
    if failure_ids:
        query = query.where(quarantine.c.failure_id.in_(list(failure_ids)))
    else:
        query = query.where(quarantine.c.status == "open")
    if error_code:
        query = query.where(quarantine.c.error_code == error_code)
    if since:
        query = query.where(quarantine.c.first_failed_at >= since)
    if until:
        query = query.where(quarantine.c.first_failed_at < until)
    return query


async def owners(
    connection: AsyncConnection,
    *,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[tuple[str, str]]:
    """The (consumer name, source topic) pairs the selected records were quarantined under."""
    topic = quarantine.c.envelope["source"]["topic"].astext
    query = select(quarantine.c.consumer_name, topic).distinct()
    query = _selected(query, failure_ids=failure_ids, error_code=error_code, since=since, until=until)
    return sorted((name, source) for name, source in await connection.execute(query))


async def select_candidates(
    connection: AsyncConnection,
    *,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    consumer: str | None = None,
) -> list[Candidate]:
    """Named failure ids (whatever their status), or the open records matching the filters, of one consumer when
    it is given; oldest first."""
    query = select(quarantine).order_by(quarantine.c.first_failed_at, quarantine.c.failure_id)
    query = _selected(
        query, failure_ids=failure_ids, error_code=error_code, since=since, until=until, consumer=consumer
    )
    return [
        Candidate(
            failure_id=row.failure_id,
            message_id=row.message_id,
            ordering_key=row.ordering_key,
            error_code=row.error_code,
            status=row.status,
            payload=bytes(row.payload) if row.payload is not None else None,
            source_headers=list(row.source_headers),
            envelope=dict(row.envelope),
            repeat_failures=row.repeat_failures,
        )
        for row in await connection.execute(query)
    ]


async def state_of(connection: AsyncConnection, consumer: str, item: Candidate) -> ItemState:
    """Inbox status, quarantine status and repeat count, and the number of effects of the item's order."""
    status = (
        await connection.execute(
            select(inbox.c.status).where(inbox.c.consumer_name == consumer, inbox.c.message_id == item.message_id)
        )
    ).scalar()
    row = (
        await connection.execute(
            select(quarantine.c.status, quarantine.c.repeat_failures).where(quarantine.c.failure_id == item.failure_id)
        )
    ).one()
    count = (
        await connection.execute(
            select(func.count()).select_from(effects).where(effects.c.aggregate_id == item.ordering_key)
        )
    ).scalar_one()
    return ItemState(status, row.status, row.repeat_failures, int(count))


async def attempts_so_far(connection: AsyncConnection, failure_id: str) -> int:
    """How many times runs have sent this record back already."""
    count = await connection.execute(
        select(func.count()).select_from(reprocess_items).where(reprocess_items.c.failure_id == failure_id)
    )
    return int(count.scalar_one())


async def start_run(connection: AsyncConnection, run_id: str, **values: Any) -> None:
    """Open the audit row of a run."""
    await connection.execute(insert(reprocess_runs).values(id=run_id, outcome="running", **values))


async def finish_run(
    connection: AsyncConnection, run_id: str, outcome: str, stop_reason: str | None, counts: dict[str, Any]
) -> None:
    """Close the audit row of a run."""
    await connection.execute(
        update(reprocess_runs)
        .where(reprocess_runs.c.id == run_id)
        .values(outcome=outcome, stop_reason=stop_reason, counts=counts, finished_at=func.now())
    )


async def add_item(connection: AsyncConnection, **values: Any) -> None:
    """Record one item of a run."""
    await connection.execute(insert(reprocess_items).values(**values))


async def settle_item(connection: AsyncConnection, run_id: str, failure_id: str, outcome: str, detail: str) -> None:
    """Record what verification found for one item."""
    await connection.execute(
        update(reprocess_items)
        .where(reprocess_items.c.run_id == run_id, reprocess_items.c.failure_id == failure_id)
        .values(outcome=outcome, detail=detail, verified_at=func.now())
    )


async def runs(connection: AsyncConnection, *, limit: int = 50, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Reprocess runs, newest first: one page of them, and how many there are."""
    rows = [
        dict(row._mapping)
        for row in await connection.execute(
            select(reprocess_runs, func.count().over().label("matching"))
            .order_by(reprocess_runs.c.started_at.desc(), reprocess_runs.c.id)
            .limit(limit)
            .offset(offset)
        )
    ]
    total = (
        int(rows[0]["matching"])
        if rows
        else int((await connection.execute(select(func.count()).select_from(reprocess_runs))).scalar_one())
    )
    for row in rows:
        del row["matching"]
    return rows, total


async def run_with_items(connection: AsyncConnection, run_id: str) -> dict[str, Any] | None:
    """One run's audit row with its items, in the order they were sent."""
    found = (await connection.execute(select(reprocess_runs).where(reprocess_runs.c.id == run_id))).first()
    if found is None:
        return None
    run = dict(found._mapping)
    items = await connection.execute(
        select(
            reprocess_items.c.failure_id,
            reprocess_items.c.message_id,
            reprocess_items.c.stage,
            reprocess_items.c.attempt,
            reprocess_items.c.outcome,
            reprocess_items.c.detail,
            reprocess_items.c.published_at,
            reprocess_items.c.verified_at,
        )
        .where(reprocess_items.c.run_id == run_id)
        .order_by(reprocess_items.c.published_at.nulls_last(), reprocess_items.c.failure_id)
    )
    run["items"] = [dict(item._mapping) for item in items]
    return run
