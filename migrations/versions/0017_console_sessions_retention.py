"""console sessions held in the database; erasure marks on quarantined records; retention may purge audit tables

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# The append-only tables still refuse every UPDATE, and every DELETE but the reconciler's retention purge: it sets
# `core.retention_purge` for its own transaction alone (service/store/retention.py), which nothing else does.
_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('core.retention_purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION {message};
END $$
"""
_REFUSE_CHANGE = {"name": "refuse_change", "message": "'% is append-only', TG_TABLE_NAME"}
_REFUSE_ANNOTATION_CHANGE = {"name": "refuse_annotation_change", "message": "'quarantine annotations are append-only'"}
_BEFORE = """
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION {message};
END $$
"""


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "console_sessions",
        sa.Column("id_hash", sa.Text(), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("tokens_digest", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"], unique=False)
    op.add_column("quarantine", sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("quarantine", sa.Column("erased_by", sa.Text(), nullable=True))
    op.execute(_APPEND_ONLY.format(**_REFUSE_CHANGE))
    op.execute(_APPEND_ONLY.format(**_REFUSE_ANNOTATION_CHANGE))


def downgrade() -> None:
    """Revert this revision."""
    op.execute(_BEFORE.format(**_REFUSE_ANNOTATION_CHANGE))
    op.execute(_BEFORE.format(**_REFUSE_CHANGE))
    op.drop_column("quarantine", "erased_by")
    op.drop_column("quarantine", "erased_at")
    op.drop_index("ix_console_sessions_expires_at", table_name="console_sessions")
    op.drop_table("console_sessions")
