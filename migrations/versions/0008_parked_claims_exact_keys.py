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
    # Records parked twice before (a redelivery): keep the first row of each.
    op.execute(
        "DELETE FROM parked a USING parked b WHERE a.consumer_name = b.consumer_name"
        " AND a.message_id = b.message_id AND a.id > b.id"
    )
    op.create_index("ux_parked_consumer_name_message_id", "parked", ["consumer_name", "message_id"], unique=True)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ux_parked_consumer_name_message_id", table_name="parked")
    op.drop_column("outbox", "kafka_key")
    op.drop_column("parked", "source_key")
    op.drop_column("parked", "claimed_until")
    op.drop_column("parked", "claimed_by")
