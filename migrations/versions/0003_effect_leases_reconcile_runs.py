"""effect leases and reconcile runs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 03:14:30.846385
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "reconcile_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("summary", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconcile_runs")),
    )
    op.create_index("ix_reconcile_runs_finished_at", "reconcile_runs", ["finished_at"], unique=False)
    op.add_column("effects", sa.Column("lease_owner", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("effects", "lease_owner")
    op.drop_index("ix_reconcile_runs_finished_at", table_name="reconcile_runs")
    op.drop_table("reconcile_runs")
