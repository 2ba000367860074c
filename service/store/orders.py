"""The orders table, read into and written from domain `Order` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.model import Order, OrderStatus
from service.store.recordset import recordset


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


async def lock(connection: AsyncConnection, order_ids: Iterable[str]) -> dict[str, Order]:
    """Load and lock the existing orders; updates of one order serialise on this lock."""
    ids = sorted(set(order_ids))  # a stable lock order keeps two batches from deadlocking
    if not ids:
        return {}
    result = await connection.execute(_LOCK, {"ids": ids})
    return {row.order_id: _to_order(row) for row in result}


async def create(connection: AsyncConnection, new: Sequence[Order]) -> int:
    """Insert new orders; return how many were inserted (fewer than given: one was created concurrently)."""
    if not new:
        return 0
    return int((await connection.execute(_CREATE, {"rows": recordset(new)})).scalar_one())


async def update(connection: AsyncConnection, changed: Sequence[Order]) -> None:
    """Write back orders that were locked by `lock`."""
    if changed:
        await connection.execute(_UPDATE, {"rows": recordset(changed)})


_LOCK = text("SELECT * FROM orders WHERE order_id = ANY(CAST(:ids AS text[])) ORDER BY order_id FOR UPDATE")
# The fields of `Order`, as a recordset (service/store/recordset.py).
_ROWS = """json_to_recordset(CAST(:rows AS json)) AS v(
               order_id text, tenant text, customer_id text, status text, amount_cents bigint, currency text,
               sequence int, details jsonb)"""
_CREATE = text(
    f"""
    WITH inserted AS (
        INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence, details)
        SELECT order_id, tenant, customer_id, status, amount_cents, currency, sequence, details FROM {_ROWS}
        ON CONFLICT (order_id) DO NOTHING
        RETURNING 1)
    SELECT count(*) FROM inserted
    """
)
_UPDATE = text(
    f"""
    UPDATE orders SET status = v.status, sequence = v.sequence, details = v.details, updated_at = now()
    FROM {_ROWS}
    WHERE orders.order_id = v.order_id
    """
)
