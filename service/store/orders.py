"""The orders table, read into and written from domain `Order` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.model import Order, OrderStatus
from service.store.tables import orders


def _to_order(row: Any) -> Order:
    return Order(
        order_id=row.order_id,
        tenant=row.tenant,
        customer_id=row.customer_id,
        status=OrderStatus(row.status),
        amount_cents=row.amount_cents,
        currency=row.currency,
        sequence=row.sequence,
        details=dict(row.details),
    )


def _to_row(order: Order) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "tenant": order.tenant,
        "customer_id": order.customer_id,
        "status": order.status.value,
        "amount_cents": order.amount_cents,
        "currency": order.currency,
        "sequence": order.sequence,
        "details": order.details,
    }


async def existing(connection: AsyncConnection, order_ids: Iterable[str]) -> set[str]:
    """Which of these orders exist (no lock: a hint for which customers to look up)."""
    ids = list(set(order_ids))
    if not ids:
        return set()
    result = await connection.execute(select(orders.c.order_id).where(orders.c.order_id.in_(ids)))
    return set(result.scalars())


async def lock(connection: AsyncConnection, order_ids: Iterable[str]) -> dict[str, Order]:
    """Load and lock the existing orders; updates of one order serialise on this lock."""
    ids = sorted(set(order_ids))  # a stable lock order keeps two batches from deadlocking
    if not ids:
        return {}
    result = await connection.execute(
        select(orders).where(orders.c.order_id.in_(ids)).order_by(orders.c.order_id).with_for_update()
    )
    return {row.order_id: _to_order(row) for row in result}


async def create(connection: AsyncConnection, new: Sequence[Order]) -> set[str]:
    """Insert new orders; return the ids inserted (a missing one was created concurrently)."""
    if not new:
        return set()
    statement = (
        insert(orders).values([_to_row(order) for order in new]).on_conflict_do_nothing().returning(orders.c.order_id)
    )
    return set((await connection.execute(statement)).scalars())


async def update(connection: AsyncConnection, changed: Sequence[Order]) -> None:
    """Write back orders that were locked by `lock`."""
    if not changed:
        return
    statement = insert(orders).values([_to_row(order) for order in changed])
    statement = statement.on_conflict_do_update(
        index_elements=[orders.c.order_id],
        set_={
            "status": statement.excluded.status,
            "sequence": statement.excluded.sequence,
            "details": statement.excluded.details,
            "updated_at": func.now(),
        },
    )
    await connection.execute(statement)
