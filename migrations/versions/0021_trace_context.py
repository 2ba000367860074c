"""trace context: the span context of the attempt that wrote an outbox row, an effect, a parked record or a quarantined
one (W3C `traceparent` text, NULL when tracing was off), and a trace id in every quarantine envelope

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 18:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_TABLES = ("outbox", "effects", "parked", "quarantine")

# An envelope written before every record had a trace id gets the one the service derives now
# (service/policy/traces.py `derived_trace_id`): the first 32 hex digits of sha256(consumer name, LF, message id).
_BACKFILL = """
UPDATE quarantine
SET envelope = jsonb_set(
    envelope, '{traceId}',
    to_jsonb(substr(encode(sha256(convert_to(consumer_name || E'\\n' || message_id, 'UTF8')), 'hex'), 1, 32))
)
WHERE envelope->>'traceId' IS NULL
"""


def upgrade() -> None:
    # The long part first: the backfill takes row locks on the quarantine only (readers and new rows go on). The
    # columns after it, each an instant change of the catalogue whose exclusive lock is then held only until the
    # commit that follows at once, not through the backfill.
    op.execute(_BACKFILL)
    for table in _TABLES:
        op.add_column(table, sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "trace_context")
