"""an insert into effects notifies once per kind it added, with the kind as the payload: only that kind's lanes wake

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 13:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# Migration 0012 notified the effects' channel with an empty payload, and every idle lane of every kind looked: a
# consumer's round that added captures sent each worker's refund lanes to the database for nothing, most of the
# effect workers' claims at a steady rate (docs/performance.md). Now the trigger reads the statement's inserted rows
# (a transition table: only rows that were inserted, not those an ON CONFLICT skipped) and notifies each kind among
# them; a statement that inserted none notifies nothing. A payload must stay under PostgreSQL's 8,000 bytes or the
# insert fails: a kind name that long (no domain registers one) notifies with the empty payload, which wakes all.
_NOTIFY = """
CREATE FUNCTION notify_effect_kinds_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], CASE WHEN octet_length(kind) <= 1000 THEN kind ELSE '' END)
    FROM (SELECT DISTINCT kind FROM added) AS kinds;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    """Apply this revision."""
    op.execute(_NOTIFY)
    op.execute("DROP TRIGGER effects_rows_added ON effects")
    op.execute(
        "CREATE TRIGGER effects_rows_added AFTER INSERT ON effects REFERENCING NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION notify_effect_kinds_added('effects_rows_added')"
    )


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DROP TRIGGER effects_rows_added ON effects")
    op.execute(
        "CREATE TRIGGER effects_rows_added AFTER INSERT ON effects"
        " FOR EACH STATEMENT EXECUTE FUNCTION notify_rows_added('effects_rows_added')"
    )
    op.execute("DROP FUNCTION notify_effect_kinds_added()")
