"""the effects' state index takes the kind before the due time: a lane claims its own kind's due effects

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 08:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    # Each effect kind has lanes of its own, and a lane claims its kind's pending effects in due order. With the
    # kind outside the index, a lane of a kind with nothing to do walked every pending effect of the other kinds,
    # each found in the table and filtered there, at every claim: behind a backlog of captures the refund lanes'
    # claims took most of PostgreSQL's time (docs/performance.md). Its first column still serves the counts by state.
    op.create_index(
        "ix_effects_state_kind_next_attempt_at", "effects", ["state", "kind", "next_attempt_at"], unique=False
    )
    op.drop_index("ix_effects_state_next_attempt_at", table_name="effects")


def downgrade() -> None:
    """Revert this revision."""
    op.create_index("ix_effects_state_next_attempt_at", "effects", ["state", "next_attempt_at"], unique=False)
    op.drop_index("ix_effects_state_kind_next_attempt_at", table_name="effects")
