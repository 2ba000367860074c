"""indexes for the console's reads of the quarantine: its pages by key, filters, overview and stats

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 01:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Without them each of these reads was a scan of the whole table (envelopes and payloads live in its rows) and a
# sort; with them it reads one range of an index (the figures: docs/performance.md, "The console at 100,000
# quarantined records"). The listing pages by (first_failed_at, failure_id), so an index that ends in
# those two columns returns a page, the first or the thousandth, in order and stops.
_NEW = (
    ("ix_quarantine_first_failed_at_failure_id", ["first_failed_at", "failure_id"]),
    # "Newest first" (the list sorted by the last failure), otherwise a sort of the whole table.
    ("ix_quarantine_last_failed_at_failure_id", ["last_failed_at", "failure_id"]),
    ("ix_quarantine_error_code_first_failed_at_failure_id", ["error_code", "first_failed_at", "failure_id"]),
    ("ix_quarantine_owner_first_failed_at_failure_id", ["owner", "first_failed_at", "failure_id"]),
    ("ix_quarantine_ordering_key", ["ordering_key"]),
    # The overview's last day per error code, read from the index alone.
    ("ix_quarantine_created_at_error_code", ["created_at", "error_code"]),
    # Open records per error code and owner (the overview and the gauges), and the stats, from the index alone.
    ("ix_quarantine_status_error_code_owner", ["status", "error_code", "owner"]),
)


def upgrade() -> None:
    """Apply this revision."""
    for name, columns in _NEW:
        op.create_index(name, "quarantine", columns, unique=False)
    # Its first columns do what it did: a look-up by code.
    op.drop_index("ix_quarantine_error_code", table_name="quarantine")
    # The message id first: the console finds a record by message id alone, whatever consumer quarantined it.
    op.drop_index("ix_quarantine_message_id", table_name="quarantine")
    op.create_index("ix_quarantine_message_id", "quarantine", ["message_id", "consumer_name"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_quarantine_message_id", table_name="quarantine")
    op.create_index("ix_quarantine_message_id", "quarantine", ["consumer_name", "message_id"], unique=False)
    op.create_index("ix_quarantine_error_code", "quarantine", ["error_code"], unique=False)
    for name, _ in reversed(_NEW):
        op.drop_index(name, table_name="quarantine")
