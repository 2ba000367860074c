"""reservations: the inventory domain's aggregate, on a branch of its own

Revision ID: inv_0001
Revises:
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "inv_0001"
down_revision = None
# A branch of its own: the core's history stays linear, and `upgrade heads` brings both to their heads.
branch_labels = ("inventory",)
# The core's tables (the effects ledger, the inbox) exist before the first reservation does.
depends_on = "0010"


def upgrade() -> None:
    """Create the reservations table."""
    op.create_table(
        "reservations",
        sa.Column("reservation_id", sa.Text(), nullable=False),
        sa.Column("sku", sa.Text(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.Column("warehouse", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        # What the warehouse did with the hold (and later the release): set by the effects' outcomes.
        sa.Column("hold_status", sa.String(16), nullable=True),
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        sa.Column("version", sa.BigInteger(), server_default="1", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("reservation_id", name="pk_reservations"),
        sa.CheckConstraint("status IN ('reserved', 'released')", name="ck_reservations_status"),
        sa.CheckConstraint(
            "hold_status IN ('held', 'hold_failed', 'unheld', 'unhold_failed')", name="ck_reservations_hold_status"
        ),
        sa.CheckConstraint("quantity > 0", name="ck_reservations_quantity"),
    )


def downgrade() -> None:
    """Drop the reservations table."""
    op.drop_table("reservations")
