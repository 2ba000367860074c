"""quarantine events (the true timeline of each record, kept by triggers) and the operator audit

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 17:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Every change of a quarantined record is an event, appended by the database itself whatever path made the
# change (a round, a reprocess run, the CLI, the console): the timeline cannot miss one or rewrite one.
_RECORD_EVENTS = """
CREATE FUNCTION quarantine_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.attempts > 1 THEN
            INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts)
            VALUES (NEW.failure_id, NEW.first_failed_at, 'failed', NULL, 1),
                   (NEW.failure_id, NEW.last_failed_at, 'failed', NEW.error_code, NEW.attempts);
        ELSE
            INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts)
            VALUES (NEW.failure_id, NEW.first_failed_at, 'failed', NEW.error_code, 1);
        END IF;
        INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts)
        VALUES (NEW.failure_id, now(), 'quarantined', NEW.error_code, NEW.attempts);
    ELSIF NEW.repeat_failures > OLD.repeat_failures THEN
        INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts)
        VALUES (NEW.failure_id, NEW.last_failed_at, 'failed again', NEW.error_code, NEW.attempts);
        INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts)
        VALUES (NEW.failure_id, now(), 'quarantined again', NEW.error_code, NEW.attempts);
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO quarantine_events (failure_id, at, event, actor, detail)
        VALUES (NEW.failure_id, now(), NEW.status,
                CASE WHEN NEW.status = 'resolved' THEN NEW.resolved_by END,
                CASE WHEN NEW.status = 'resolved' THEN NEW.resolution END);
    END IF;
    RETURN NULL;
END $$
"""
_ANNOTATION_EVENTS = """
CREATE FUNCTION quarantine_annotation_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO quarantine_events (failure_id, at, event, actor, detail)
    VALUES (NEW.failure_id, NEW.created_at, 'annotated', NEW.author, NEW.note);
    RETURN NULL;
END $$
"""
_REPROCESS_EVENTS = """
CREATE FUNCTION quarantine_reprocess_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published_at IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.published_at IS NULL) THEN
        INSERT INTO quarantine_events (failure_id, at, event, actor, detail)
        SELECT NEW.failure_id, NEW.published_at, 'reprocess sent', r.actor,
               'run ' || NEW.run_id || ', attempt ' || NEW.attempt
        FROM reprocess_runs r WHERE r.id = NEW.run_id;
    END IF;
    IF NEW.verified_at IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.verified_at IS NULL) THEN
        INSERT INTO quarantine_events (failure_id, at, event, detail)
        VALUES (NEW.failure_id, NEW.verified_at, 'reprocess ' || NEW.outcome, 'run ' || NEW.run_id);
    END IF;
    RETURN NULL;
END $$
"""
_APPEND_ONLY = """
CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END $$
"""
# The timeline of the records quarantined before this revision, from what their rows still say. A record that
# failed again after a reprocess shows its current code and attempts (the row kept no earlier ones).
_BACKFILL = """
INSERT INTO quarantine_events (failure_id, at, event, error_code, attempts, actor, detail)
SELECT failure_id, at, event, error_code, attempts, actor, detail FROM (
    SELECT failure_id, first_failed_at AS at, 'failed' AS event,
           CASE WHEN attempts = 1 AND repeat_failures = 0 THEN error_code END AS error_code, 1 AS attempts,
           NULL AS actor, NULL AS detail, 0 AS rank FROM quarantine
    UNION ALL
    SELECT failure_id, last_failed_at, 'failed', error_code, attempts, NULL, NULL, 1 FROM quarantine
    WHERE attempts > 1
    UNION ALL
    SELECT failure_id, created_at, 'quarantined', error_code, attempts, NULL, NULL, 2 FROM quarantine
    UNION ALL
    SELECT failure_id, created_at, 'annotated', NULL, NULL, author, note, 3 FROM quarantine_annotations
    UNION ALL
    SELECT i.failure_id, i.published_at, 'reprocess sent', NULL, NULL, r.actor,
           'run ' || i.run_id || ', attempt ' || i.attempt, 3
    FROM reprocess_items i JOIN reprocess_runs r ON r.id = i.run_id WHERE i.published_at IS NOT NULL
    UNION ALL
    SELECT failure_id, verified_at, 'reprocess ' || outcome, NULL, NULL, NULL, 'run ' || run_id, 3
    FROM reprocess_items WHERE verified_at IS NOT NULL
    UNION ALL
    SELECT failure_id, resolved_at, 'resolved', NULL, NULL, resolved_by, resolution, 4 FROM quarantine
    WHERE resolved_at IS NOT NULL
) AS history
ORDER BY failure_id, rank < 3 DESC, CASE WHEN rank < 3 THEN rank END, at
"""


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "quarantine_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("failure_id", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantine_events")),
    )
    op.create_index("ix_quarantine_events_failure_id", "quarantine_events", ["failure_id", "id"], unique=False)
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("selection", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"], unique=False)
    op.execute(_APPEND_ONLY)
    for table in ("quarantine_events", "audit_log"):
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION refuse_change()"
        )
    # No write may commit between the backfill's snapshot and the triggers: it would have no events at all.
    op.execute("LOCK TABLE quarantine, quarantine_annotations, reprocess_items IN SHARE ROW EXCLUSIVE MODE")
    op.execute(_BACKFILL)
    op.execute(_RECORD_EVENTS)
    op.execute(
        "CREATE TRIGGER quarantine_events_of_record AFTER INSERT OR UPDATE ON quarantine"
        " FOR EACH ROW EXECUTE FUNCTION quarantine_record_event()"
    )
    op.execute(_ANNOTATION_EVENTS)
    op.execute(
        "CREATE TRIGGER quarantine_events_of_annotation AFTER INSERT ON quarantine_annotations"
        " FOR EACH ROW EXECUTE FUNCTION quarantine_annotation_event()"
    )
    op.execute(_REPROCESS_EVENTS)
    op.execute(
        "CREATE TRIGGER quarantine_events_of_reprocess AFTER INSERT OR UPDATE ON reprocess_items"
        " FOR EACH ROW EXECUTE FUNCTION quarantine_reprocess_event()"
    )


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DROP TRIGGER quarantine_events_of_reprocess ON reprocess_items")
    op.execute("DROP FUNCTION quarantine_reprocess_event()")
    op.execute("DROP TRIGGER quarantine_events_of_annotation ON quarantine_annotations")
    op.execute("DROP FUNCTION quarantine_annotation_event()")
    op.execute("DROP TRIGGER quarantine_events_of_record ON quarantine")
    op.execute("DROP FUNCTION quarantine_record_event()")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_quarantine_events_failure_id", table_name="quarantine_events")
    op.drop_table("quarantine_events")
    op.execute("DROP FUNCTION refuse_change()")
