"""orders: the order domain's aggregate, on the domain's own branch

Revision ID: orders_0001
Revises:
Create Date: 2026-12-07 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "orders_0001"
down_revision = None
# A branch of its own: the core's history names no domain, and `upgrade heads` brings both to their heads.
branch_labels = ("orders",)
# The core's revision 0016 drops an empty `orders` left by the core's early history and keeps one with rows; this
# branch starts after it, so that it creates the table in a fresh database and adopts the one with rows as it is.
depends_on = "0016"


def upgrade() -> None:
    """Create the orders table, unless the database already holds it (with its rows, from before this branch)."""
    op.create_table(
        "orders",
        sa.Column("order_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        sa.Column(
            "details", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        # 1 when placed, one more with every change, under the row lock (events carry it as `orderVersion`).
        sa.Column("version", sa.BigInteger(), server_default="1", nullable=False),
        sa.CheckConstraint("status IN ('placed', 'shipped', 'cancelled')", name=op.f("ck_orders_status")),
        sa.CheckConstraint("amount_cents >= 0", name=op.f("ck_orders_amount")),
        sa.PrimaryKeyConstraint("order_id", name=op.f("pk_orders")),
        if_not_exists=True,
    )


def downgrade() -> None:
    """Revert this revision: the table and its rows stay, for the core's revisions below (0016 and earlier)."""
