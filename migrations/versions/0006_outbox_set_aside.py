"""outbox rows set aside: a row Kafka refuses for its content stops blocking the rows after it

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("outbox", sa.Column("set_aside_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("outbox", sa.Column("set_aside_code", sa.Text(), nullable=True))
    op.create_index("ix_outbox_set_aside", "outbox", ["id"], postgresql_where=sa.text("set_aside_at IS NOT NULL"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_outbox_set_aside", table_name="outbox", postgresql_where=sa.text("set_aside_at IS NOT NULL"))
    op.drop_column("outbox", "set_aside_code")
    op.drop_column("outbox", "set_aside_at")
