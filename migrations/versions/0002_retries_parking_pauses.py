"""retries, key blocks, parked records, backpressure pauses

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 02:59:33.795117
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "key_blocks",
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("order_key", sa.Text(), nullable=False),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("consumer_name", "order_key", name=op.f("pk_key_blocks")),
    )
    op.create_table(
        "parked",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("order_key", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("source_topic", sa.Text(), nullable=False),
        sa.Column("source_partition", sa.Integer(), nullable=False),
        sa.Column("source_offset", sa.BigInteger(), nullable=False),
        sa.Column("timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column(
            "headers", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("parked_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_parked")),
    )
    op.create_index(
        "ix_parked_consumer_name_order_key_id", "parked", ["consumer_name", "order_key", "id"], unique=False
    )
    op.create_table(
        "pauses",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("downstream", sa.Text(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pauses")),
    )
    op.create_index("ix_pauses_paused_at", "pauses", ["paused_at"], unique=False)
    op.create_table(
        "retries",
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("order_key", sa.Text(), nullable=True),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("tier_step", sa.Integer(), nullable=False),
        sa.Column("first_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error_code", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("consumer_name", "message_id", name=op.f("pk_retries")),
    )
    op.create_index("ix_retries_consumer_name_order_key", "retries", ["consumer_name", "order_key"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_retries_consumer_name_order_key", table_name="retries")
    op.drop_table("retries")
    op.drop_index("ix_pauses_paused_at", table_name="pauses")
    op.drop_table("pauses")
    op.drop_index("ix_parked_consumer_name_order_key_id", table_name="parked")
    op.drop_table("parked")
    op.drop_table("key_blocks")
