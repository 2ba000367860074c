"""The order domain's table, on the core's metadata (service/store/tables.py)."""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Column, DateTime, String, Table, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB

from service.ports import metadata

orders = Table(
    "orders",
    metadata,
    Column("order_id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("customer_id", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("sequence", BigInteger),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # 1 when placed, one more with every change, under the row lock (events carry it as `orderVersion`).
    Column("version", BigInteger, nullable=False, server_default="1"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("status IN ('placed', 'shipped', 'cancelled')", name="status"),
    CheckConstraint("amount_cents >= 0", name="amount"),
)
