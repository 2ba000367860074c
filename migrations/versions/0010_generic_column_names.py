"""generic column names in the core's tables: aggregate_id and ordering_key

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 21:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The core's tables name what a domain's records are about generically, so that a domain other than orders
# reads them without translation (README, "Contract changelog"). A rename keeps the data, the indexes and the
# constraints; only the indexes whose names spell the column are renamed with it.
_COLUMNS = (
    ("inbox", "order_id", "aggregate_id"),
    ("effects", "order_id", "aggregate_id"),
    ("quarantine", "order_key", "ordering_key"),
    ("retries", "order_key", "ordering_key"),
    ("key_blocks", "order_key", "ordering_key"),
    ("parked", "order_key", "ordering_key"),
)
_INDEXES = (
    ("ix_effects_order_id", "ix_effects_aggregate_id"),
    ("ix_retries_consumer_name_order_key", "ix_retries_consumer_name_ordering_key"),
    ("ix_parked_consumer_name_order_key_id", "ix_parked_consumer_name_ordering_key_id"),
)


def upgrade() -> None:
    for table, old, new in _COLUMNS:
        op.alter_column(table, old, new_column_name=new)
    for old, new in _INDEXES:
        op.execute(f"ALTER INDEX {old} RENAME TO {new}")


def downgrade() -> None:
    for old, new in _INDEXES:
        op.execute(f"ALTER INDEX {new} RENAME TO {old}")
    for table, old, new in _COLUMNS:
        op.alter_column(table, new, new_column_name=old)
