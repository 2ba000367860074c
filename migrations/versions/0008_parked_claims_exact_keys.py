"""parked claims (one member releases a parked record, under a lease); original keys of copies, byte-exact

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 14:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (rows parked before it are unclaimed)."""
    op.add_column("parked", sa.Column("claimed_by", sa.Text(), nullable=True))
    op.add_column("parked", sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("parked", sa.Column("source_key", sa.LargeBinary(), nullable=True))
    op.add_column("outbox", sa.Column("kafka_key", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("outbox", "kafka_key")
    op.drop_column("parked", "source_key")
    op.drop_column("parked", "claimed_until")
    op.drop_column("parked", "claimed_by")
