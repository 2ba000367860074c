"""quarantine annotations and reprocess audit

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 03:18:51.507841
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "quarantine_annotations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantine_annotations")),
    )
    op.create_index("ix_quarantine_annotations_failure_id", "quarantine_annotations", ["failure_id"], unique=False)
    op.create_table(
        "reprocess_items",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("stage", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "failure_id", name=op.f("pk_reprocess_items")),
    )
    op.create_index("ix_reprocess_items_failure_id", "reprocess_items", ["failure_id"], unique=False)
    op.create_table(
        "reprocess_runs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("selection", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("options", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "counts", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reprocess_runs")),
    )
    op.add_column("quarantine", sa.Column("resolved_by", sa.Text(), nullable=True))
    op.add_column("quarantine", sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_column("quarantine", "annotations")
    # Annotations are an audit trail: refuse changes and deletions at the database itself.
    op.execute(
        """
        CREATE FUNCTION refuse_annotation_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'quarantine annotations are append-only';
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER quarantine_annotations_append_only
        BEFORE UPDATE OR DELETE ON quarantine_annotations
        FOR EACH ROW EXECUTE FUNCTION refuse_annotation_change()
        """
    )


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DROP TRIGGER quarantine_annotations_append_only ON quarantine_annotations")
    op.execute("DROP FUNCTION refuse_annotation_change()")
    op.add_column(
        "quarantine",
        sa.Column(
            "annotations",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            autoincrement=False,
            nullable=False,
        ),
    )
    op.drop_column("quarantine", "resolved_at")
    op.drop_column("quarantine", "resolved_by")
    op.drop_table("reprocess_runs")
    op.drop_index("ix_reprocess_items_failure_id", table_name="reprocess_items")
    op.drop_table("reprocess_items")
    op.drop_index("ix_quarantine_annotations_failure_id", table_name="quarantine_annotations")
    op.drop_table("quarantine_annotations")
