"""notifications when rows are inserted into outbox or effects: the relay and the effect workers wake at once

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 20:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# One notification per inserting statement, on the channel the trigger names (service/store/wakeups.py);
# PostgreSQL folds a transaction's identical notifications into one and delivers it at the commit. A statement-
# level trigger costs nothing per row: a statement that inserts none notifies too, and its waiters look once
# and find nothing (a transition table to tell would copy every inserted row).
_NOTIFY = """
CREATE FUNCTION notify_rows_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END $$
"""

_TRIGGERS = (
    ("outbox_rows_added", "outbox", "outbox_rows_added"),
    ("effects_rows_added", "effects", "effects_rows_added"),
)


def upgrade() -> None:
    """Apply this revision."""
    op.execute(_NOTIFY)
    for name, table, channel in _TRIGGERS:
        op.execute(
            f"CREATE TRIGGER {name} AFTER INSERT ON {table}"
            f" FOR EACH STATEMENT EXECUTE FUNCTION notify_rows_added('{channel}')"
        )


def downgrade() -> None:
    """Revert this revision."""
    for name, table, _ in reversed(_TRIGGERS):
        op.execute(f"DROP TRIGGER {name} ON {table}")
    op.execute("DROP FUNCTION notify_rows_added()")
