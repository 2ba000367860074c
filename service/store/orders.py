"""The orders table, read into and written from domain `Order` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.model import Order, OrderStatus


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


async def existing(connection: AsyncConnection, order_ids: Iterable[str]) -> set[str]:
    """Which of these orders exist (no lock: a hint for which customers to look up)."""
    ids = list(set(order_ids))
    if not ids:
        return set()
    result = await connection.execute(_EXISTING, {"ids": ids})
    return set(result.scalars())


async def lock(connection: AsyncConnection, order_ids: Iterable[str]) -> dict[str, Order]:
    """Load and lock the existing orders; updates of one order serialise on this lock."""
    ids = sorted(set(order_ids))  # a stable lock order keeps two batches from deadlocking
    if not ids:
        return {}
    result = await connection.execute(_LOCK, {"ids": ids})
    return {row.order_id: _to_order(row) for row in result}


async def create(connection: AsyncConnection, new: Sequence[Order]) -> set[str]:
    """Insert new orders; return the ids inserted (a missing one was created concurrently)."""
    if not new:
        return set()
    return set((await connection.execute(_CREATE, _columns(new))).scalars())


async def update(connection: AsyncConnection, changed: Sequence[Order]) -> None:
    """Write back orders that were locked by `lock`."""
    if changed:
        await connection.execute(_UPDATE, _columns(changed))


def _columns(batch: Sequence[Order]) -> dict[str, list[Any]]:
    return {
        "ids": [o.order_id for o in batch],
        "tenants": [o.tenant for o in batch],
        "customers": [o.customer_id for o in batch],
        "statuses": [o.status.value for o in batch],
        "amounts": [o.amount_cents for o in batch],
        "currencies": [o.currency for o in batch],
        "sequences": [o.sequence for o in batch],
        "details": [orjson.dumps(o.details).decode() for o in batch],
    }


_EXISTING = text("SELECT order_id FROM orders WHERE order_id = ANY(CAST(:ids AS text[]))")
_LOCK = text("SELECT * FROM orders WHERE order_id = ANY(CAST(:ids AS text[])) ORDER BY order_id FOR UPDATE")
_UNNEST = """unnest(CAST(:ids AS text[]), CAST(:tenants AS text[]), CAST(:customers AS text[]),
                    CAST(:statuses AS text[]), CAST(:amounts AS bigint[]), CAST(:currencies AS text[]),
                    CAST(:sequences AS int[]), CAST(:details AS text[]))
             AS v(order_id, tenant, customer_id, status, amount_cents, currency, sequence, details)"""
_CREATE = text(
    f"""
    INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence, details)
    SELECT order_id, tenant, customer_id, status, amount_cents, currency, sequence, CAST(details AS jsonb)
    FROM {_UNNEST}
    ON CONFLICT (order_id) DO NOTHING
    RETURNING order_id
    """
)
_UPDATE = text(
    f"""
    UPDATE orders SET status = v.status, sequence = v.sequence, details = CAST(v.details AS jsonb), updated_at = now()
    FROM {_UNNEST}
    WHERE orders.order_id = v.order_id
    """
)
