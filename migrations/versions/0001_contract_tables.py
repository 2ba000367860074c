"""contract tables: inbox, orders, outbox, effects, quarantine

Revision ID: 0001
Revises:
Create Date: 2026-11-30 02:40:14.304021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "effects",
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("order_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("reconcile_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("provider_ref", sa.Text(), nullable=True),
        sa.Column("last_error_code", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "state IN ('pending', 'in_flight', 'sent', 'uncertain', 'failed')", name=op.f("ck_effects_state")
        ),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_effects")),
    )
    op.create_index("ix_effects_order_id", "effects", ["order_id"], unique=False)
    op.create_index("ix_effects_state_next_attempt_at", "effects", ["state", "next_attempt_at"], unique=False)
    op.create_table(
        "inbox",
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("source_topic", sa.Text(), nullable=False),
        sa.Column("source_partition", sa.Integer(), nullable=False),
        sa.Column("source_offset", sa.BigInteger(), nullable=False),
        sa.Column("order_id", sa.Text(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('processed', 'rejected', 'quarantined')", name=op.f("ck_inbox_status")),
        sa.PrimaryKeyConstraint("consumer_name", "message_id", name=op.f("pk_inbox")),
    )
    op.create_index("ix_inbox_processed_at", "inbox", ["processed_at"], unique=False)
    op.create_table(
        "orders",
        sa.Column("order_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=True),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('placed', 'shipped', 'cancelled')", name=op.f("ck_orders_status")),
        sa.CheckConstraint("amount_cents >= 0", name=op.f("ck_orders_amount")),
        sa.PrimaryKeyConstraint("order_id", name=op.f("pk_orders")),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column(
            "headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_index(
        "ix_outbox_unpublished_key",
        "outbox",
        ["key", "id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "quarantine",
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("error_code", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="open", nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("order_key", sa.Text(), nullable=True),
        sa.Column("envelope", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=True),
        sa.Column(
            "source_headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("repeat_failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("first_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "annotations",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "status IN ('open', 'resolved', 'reprocessing', 'reprocessed')", name=op.f("ck_quarantine_status")
        ),
        sa.PrimaryKeyConstraint("failure_id", name=op.f("pk_quarantine")),
    )
    op.create_index("ix_quarantine_error_code", "quarantine", ["error_code"], unique=False)
    op.create_index("ix_quarantine_message_id", "quarantine", ["consumer_name", "message_id"], unique=False)
    op.create_index("ix_quarantine_status_first_failed_at", "quarantine", ["status", "first_failed_at"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_quarantine_status_first_failed_at", table_name="quarantine")
    op.drop_index("ix_quarantine_message_id", table_name="quarantine")
    op.drop_index("ix_quarantine_error_code", table_name="quarantine")
    op.drop_table("quarantine")
    op.drop_index("ix_outbox_unpublished_key", table_name="outbox", postgresql_where=sa.text("published_at IS NULL"))
    op.drop_index("ix_outbox_unpublished", table_name="outbox", postgresql_where=sa.text("published_at IS NULL"))
    op.drop_table("outbox")
    op.drop_table("orders")
    op.drop_index("ix_inbox_processed_at", table_name="inbox")
    op.drop_table("inbox")
    op.drop_index("ix_effects_state_next_attempt_at", table_name="effects")
    op.drop_index("ix_effects_order_id", table_name="effects")
    op.drop_table("effects")
