"""the quarantine keyed by (consumer_name, failure_id), its history with it; the backpressure pause log dropped

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# Two consumer names reading one source topic each quarantine a bad record under the same failure id (its source
# coordinates). Keyed by the failure id alone, the second consumer's insert was skipped (ON CONFLICT DO NOTHING): its
# inbox said `quarantined` and its envelope was published, but no row held the record, so nobody could select or
# reprocess it. Now the key is the pair (contract §7), and every row of the record's history (events, notes,
# reprocess items) names the consumer whose record it is; the triggers of 0009 write that name.

# The console's pages end in the record's key, so that two rows sharing a sort value and a failure id (two
# consumers) cannot straddle a page boundary (one of them would be skipped).
_PAGES = (
    ("ix_quarantine_first_failed_at_failure_id", "ix_quarantine_page_by_first_failed_at", ["first_failed_at"]),
    ("ix_quarantine_last_failed_at_failure_id", "ix_quarantine_page_by_last_failed_at", ["last_failed_at"]),
    (
        "ix_quarantine_error_code_first_failed_at_failure_id",
        "ix_quarantine_page_by_error_code",
        ["error_code", "first_failed_at"],
    ),
    ("ix_quarantine_owner_first_failed_at_failure_id", "ix_quarantine_page_by_owner", ["owner", "first_failed_at"]),
)
# The tables that hold a record's history: each row gets the consumer name of the record it belongs to, from the
# quarantine row of its failure id (one per failure id before this revision). The append-only ones refuse updates:
# their trigger is set aside for this one backfill, inside the migration's transaction.
_HISTORY = (
    ("quarantine_events", "quarantine_events_append_only", "ix_quarantine_events_failure_id", ["failure_id", "id"]),
    (
        "quarantine_annotations",
        "quarantine_annotations_append_only",
        "ix_quarantine_annotations_failure_id",
        ["failure_id"],
    ),
    ("reprocess_items", None, "ix_reprocess_items_failure_id", ["failure_id"]),
)

_RECORD_EVENTS = """
CREATE OR REPLACE FUNCTION quarantine_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.attempts > 1 THEN
            INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)
            VALUES (NEW.consumer_name, NEW.failure_id, NEW.first_failed_at, 'failed', NULL, 1),
                   (NEW.consumer_name, NEW.failure_id, NEW.last_failed_at, 'failed', NEW.error_code, NEW.attempts);
        ELSE
            INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)
            VALUES (NEW.consumer_name, NEW.failure_id, NEW.first_failed_at, 'failed', NEW.error_code, 1);
        END IF;
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)
        VALUES (NEW.consumer_name, NEW.failure_id, now(), 'quarantined', NEW.error_code, NEW.attempts);
    ELSIF NEW.repeat_failures > OLD.repeat_failures THEN
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)
        VALUES (NEW.consumer_name, NEW.failure_id, NEW.last_failed_at, 'failed again', NEW.error_code, NEW.attempts);
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)
        VALUES (NEW.consumer_name, NEW.failure_id, now(), 'quarantined again', NEW.error_code, NEW.attempts);
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, actor, detail)
        VALUES (NEW.consumer_name, NEW.failure_id, now(), NEW.status,
                CASE WHEN NEW.status = 'resolved' THEN NEW.resolved_by END,
                CASE WHEN NEW.status = 'resolved' THEN NEW.resolution END);
    END IF;
    RETURN NULL;
END $$
"""
_ANNOTATION_EVENTS = """
CREATE OR REPLACE FUNCTION quarantine_annotation_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO quarantine_events (consumer_name, failure_id, at, event, actor, detail)
    VALUES (NEW.consumer_name, NEW.failure_id, NEW.created_at, 'annotated', NEW.author, NEW.note);
    RETURN NULL;
END $$
"""
_REPROCESS_EVENTS = """
CREATE OR REPLACE FUNCTION quarantine_reprocess_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published_at IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.published_at IS NULL) THEN
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, actor, detail)
        SELECT NEW.consumer_name, NEW.failure_id, NEW.published_at, 'reprocess sent', r.actor,
               'run ' || NEW.run_id || ', attempt ' || NEW.attempt
        FROM reprocess_runs r WHERE r.id = NEW.run_id;
    END IF;
    IF NEW.verified_at IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.verified_at IS NULL) THEN
        INSERT INTO quarantine_events (consumer_name, failure_id, at, event, detail)
        VALUES (NEW.consumer_name, NEW.failure_id, NEW.verified_at, 'reprocess ' || NEW.outcome, 'run ' || NEW.run_id);
    END IF;
    RETURN NULL;
END $$
"""
# Migration 0009's functions, for the downgrade.
_RECORD_EVENTS_0009 = """
CREATE OR REPLACE FUNCTION quarantine_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
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
_ANNOTATION_EVENTS_0009 = """
CREATE OR REPLACE FUNCTION quarantine_annotation_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO quarantine_events (failure_id, at, event, actor, detail)
    VALUES (NEW.failure_id, NEW.created_at, 'annotated', NEW.author, NEW.note);
    RETURN NULL;
END $$
"""
_REPROCESS_EVENTS_0009 = """
CREATE OR REPLACE FUNCTION quarantine_reprocess_event() RETURNS trigger LANGUAGE plpgsql AS $$
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


def upgrade() -> None:
    """Apply this revision."""
    # No write may commit between a backfill and the new triggers: its rows would have no consumer name.
    op.execute(
        "LOCK TABLE quarantine, quarantine_events, quarantine_annotations, reprocess_items IN SHARE ROW EXCLUSIVE MODE"
    )
    for table, append_only, old_index, columns in _HISTORY:
        op.add_column(table, sa.Column("consumer_name", sa.Text(), nullable=True))
        if append_only:
            op.execute(f"ALTER TABLE {table} DISABLE TRIGGER {append_only}")
        # A row whose record is gone (a quarantine row deleted by hand) keeps the history under no consumer ('').
        op.execute(
            f"UPDATE {table} h SET consumer_name = coalesce("
            "(SELECT q.consumer_name FROM quarantine q WHERE q.failure_id = h.failure_id), '')"
        )
        if append_only:
            op.execute(f"ALTER TABLE {table} ENABLE TRIGGER {append_only}")
        op.alter_column(table, "consumer_name", nullable=False)
        op.drop_index(old_index, table_name=table)
        op.create_index(f"ix_{table}_consumer_name_{'_'.join(columns)}", table, ["consumer_name", *columns])
    op.drop_constraint("pk_quarantine", "quarantine", type_="primary")
    op.create_primary_key("pk_quarantine", "quarantine", ["consumer_name", "failure_id"])
    op.create_index("ix_quarantine_failure_id", "quarantine", ["failure_id"])
    for old, new, columns in _PAGES:
        op.drop_index(old, table_name="quarantine")
        op.create_index(new, "quarantine", [*columns, "failure_id", "consumer_name"])
    op.execute(_RECORD_EVENTS)
    op.execute(_ANNOTATION_EVENTS)
    op.execute(_REPROCESS_EVENTS)
    # Backpressure pauses gave way to each downstream's circuit breaker, which keeps its state in the process
    # (its metrics and `status`): nothing writes this log any more.
    op.drop_index("ix_pauses_paused_at", table_name="pauses")
    op.drop_table("pauses")


def downgrade() -> None:
    """Revert this revision: possible only while no failure id is quarantined under two consumer names."""
    shared = (
        op.get_bind()
        .execute(sa.text("SELECT failure_id FROM quarantine GROUP BY failure_id HAVING count(*) > 1 LIMIT 5"))
        .scalars()
        .all()
    )
    if shared:
        raise RuntimeError(
            "cannot downgrade below 0015: these failure ids are quarantined under several consumer names, which "
            f"revision 0014 cannot hold: {', '.join(shared)}"
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
    op.execute(_RECORD_EVENTS_0009)
    op.execute(_ANNOTATION_EVENTS_0009)
    op.execute(_REPROCESS_EVENTS_0009)
    for old, new, columns in reversed(_PAGES):
        op.drop_index(new, table_name="quarantine")
        op.create_index(old, "quarantine", [*columns, "failure_id"])
    op.drop_index("ix_quarantine_failure_id", table_name="quarantine")
    op.drop_constraint("pk_quarantine", "quarantine", type_="primary")
    op.create_primary_key("pk_quarantine", "quarantine", ["failure_id"])
    for table, _, old_index, columns in reversed(_HISTORY):
        op.drop_index(f"ix_{table}_consumer_name_{'_'.join(columns)}", table_name=table)
        op.create_index(old_index, table, columns)
        op.drop_column(table, "consumer_name")
