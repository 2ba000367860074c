"""orders.version: the order's version, carried by its events as orderVersion

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 10:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (orders that exist start at version 1)."""
    op.add_column("orders", sa.Column("version", sa.BigInteger(), server_default="1", nullable=False))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("orders", "version")
