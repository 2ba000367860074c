"""The orders table, read into and written from domain `Order` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.orders.model import Order, OrderStatus
from service.ports import AggregateRows, Columns


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
        version=row.version,
    )


async def lock(connection: AsyncConnection, order_ids: Iterable[str]) -> dict[str, Order]:
    """Load and lock the existing orders; updates of one order serialise on this lock."""
    ids = sorted(set(order_ids))  # a stable lock order keeps two batches from deadlocking
    if not ids:
        return {}
    result = await connection.execute(_LOCK, {"ids": ids})
    return {row.order_id: _to_order(row) for row in result}


_LOCK = text("SELECT * FROM orders WHERE order_id = ANY(CAST(:ids AS text[])) ORDER BY order_id FOR UPDATE")


@dataclass  # not frozen (slower to build): one per settled payment
class PaymentStatus:
    """A payment's outcome on its order (`details.payment_status`)."""

    order_id: str
    status: str


_PAYMENT_STATUSES = Columns(("order_id", "text"), ("status", "text"))


async def set_payment_statuses(connection: AsyncConnection, changes: Sequence[PaymentStatus]) -> dict[str, int]:
    """Record payments' outcomes on their orders, each a new version of its order; return each order's version
    after its change (an order that does not exist is left out). One change per order."""
    if not changes:
        return {}
    result = await connection.execute(_SET_PAYMENT_STATUSES, {"changes": _PAYMENT_STATUSES.encode(changes)})
    return {row.order_id: int(row.version) for row in result}


# The orders are locked in id order first, as the consumer's round locks them (`lock`), so the two never wait on
# each other in a cycle.
_SET_PAYMENT_STATUSES = text(
    f"""
    WITH c AS MATERIALIZED ({_PAYMENT_STATUSES.select("changes")}),
    locked AS MATERIALIZED (
        SELECT o.order_id, c.status FROM orders o JOIN c USING (order_id) ORDER BY o.order_id FOR UPDATE OF o)
    UPDATE orders o SET details = o.details || jsonb_build_object('payment_status', locked.status),
                        version = o.version + 1, updated_at = now()
    FROM locked
    WHERE o.order_id = locked.order_id
    RETURNING o.order_id, o.version
    """
)

# The fields of `Order`, as a recordset (service/store/recordset.py): new orders and changed ones, parts of a
# round's one write statement (service/store/batch.py). A new order that exists already (created concurrently)
# is a unique violation of `pk_orders`, which fails the round's transaction.
COLUMNS = Columns(
    ("order_id", "text"),
    ("tenant", "text"),
    ("customer_id", "text"),
    ("status", "text"),
    ("amount_cents", "bigint"),
    ("currency", "text"),
    ("sequence", "bigint"),
    ("details", "jsonb"),
    ("version", "bigint"),
)
CREATE_ROWS = f"""
    INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence, details, version)
    SELECT order_id, tenant, customer_id, status, amount_cents, currency, sequence, details, version
    FROM ({COLUMNS.select("created_aggregates")}) AS v"""
UPDATE_ROWS = f"""
    UPDATE orders SET status = v.status, sequence = v.sequence, details = v.details, version = v.version,
                      updated_at = now()
    FROM ({COLUMNS.select("changed_aggregates")}) AS v
    WHERE orders.order_id = v.order_id"""

# The orders as the round's one write statement writes them (service/store/batch.py).
ROWS = AggregateRows(
    COLUMNS, CREATE_ROWS, UPDATE_ROWS, raced_key="pk_orders", exists="SELECT FROM orders WHERE order_id = m.id"
)
