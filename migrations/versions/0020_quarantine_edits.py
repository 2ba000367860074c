"""quarantine edits (an operator's corrected payload or headers, audited with its diff, sent once) and every failed
attempt of a record that went through the retry tiers in its timeline

Revision ID: 0020
Revises: 0018
Create Date: 2026-12-07 14:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None

# Each hand-off to a retry tier is a failed attempt (the `retries` row takes its attempt number, code and time):
# appended to the failure's timeline by the database, as migration 0009's triggers do for the quarantine, so that
# a record quarantined after its tiers shows every attempt that moved it, not only its first and last.
_ATTEMPT_EVENTS = """
CREATE FUNCTION retry_attempt_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.attempts > OLD.attempts THEN
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts, detail)
        VALUES (NEW.consumer_name, NEW.failure_id, NEW.last_failed_at, 'failed', NEW.error_code, NEW.attempts,
                'to retry tier ' || NEW.tier_step);
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "quarantine_edits",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("consumer_name", sa.Text(), nullable=False),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("payload_before", sa.LargeBinary(), nullable=True),
        sa.Column("payload_after", sa.LargeBinary(), nullable=False),
        sa.Column("headers_before", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("headers_after", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.Column("repeat_failures", sa.Integer(), nullable=False),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('pending_approval', 'sent', 'rejected')", name=op.f("ck_quarantine_edits_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantine_edits")),
    )
    op.create_index(
        "ix_quarantine_edits_consumer_name_failure_id_id",
        "quarantine_edits",
        ["consumer_name", "failure_id", "id"],
        unique=False,
    )
    op.execute(_ATTEMPT_EVENTS)
    op.execute(
        "CREATE TRIGGER retry_attempt_events AFTER INSERT OR UPDATE ON retries"
        " FOR EACH ROW EXECUTE FUNCTION retry_attempt_event()"
    )


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DROP TRIGGER retry_attempt_events ON retries")
    op.execute("DROP FUNCTION retry_attempt_event()")
    op.drop_index("ix_quarantine_edits_consumer_name_failure_id_id", table_name="quarantine_edits")
    op.drop_table("quarantine_edits")
