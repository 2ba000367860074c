"""orders.sequence as bigint: a producer's sequence may be an epoch in milliseconds

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.alter_column("orders", "sequence", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=True)


def downgrade() -> None:
    """Revert this revision (fails if a stored sequence no longer fits an int)."""
    op.alter_column("orders", "sequence", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=True)
