"""The effects ledger: external calls recorded in the business transaction, executed later."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.model import Effect
from service.store.tables import effects


async def add(connection: AsyncConnection, new: Sequence[Effect]) -> None:
    """Record effects as `pending`; an idempotency key that exists already keeps its row."""
    if not new:
        return
    rows = [
        {"idempotency_key": e.idempotency_key, "order_id": e.order_id, "kind": e.kind, "payload": e.payload}
        for e in new
    ]
    await connection.execute(insert(effects).values(rows).on_conflict_do_nothing())
