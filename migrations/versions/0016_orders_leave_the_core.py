"""the core's history stops at its own tables: the order domain's table moves to that domain's branch

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 08:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# Revisions 0001, 0005 and 0007 created and changed the order domain's `orders` table, from when that domain's table
# was in the core's history. They are applied, so they stay; from here on the core's history holds only the core's
# tables, and the order domain's own branch (`orders`: service/orders/migrations/, which depends on this revision)
# holds its table. A database whose `orders` holds rows keeps it, every row, for that branch to adopt. An empty one
# (a fresh database, or a service of another domain, which never writes it) is dropped here, so that a database has
# the table only when its domain's branch creates it. The lock keeps a running release from adding a row between
# the count and the drop; it waits, and finds the branch's new table, in this same transaction.
_DROP_IF_EMPTY = """
DO $$
BEGIN
    IF to_regclass('orders') IS NOT NULL THEN
        LOCK TABLE orders IN ACCESS EXCLUSIVE MODE;
        IF NOT EXISTS (SELECT FROM orders) THEN
            DROP TABLE orders;
        END IF;
    END IF;
END $$
"""


def upgrade() -> None:
    """Apply this revision."""
    op.execute(_DROP_IF_EMPTY)


def downgrade() -> None:
    """Revert this revision: the revisions below expect the table as 0007 left it (empty, when it was dropped)."""
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS orders (
            order_id text NOT NULL,
            tenant text NOT NULL,
            customer_id text NOT NULL,
            status varchar(16) NOT NULL,
            amount_cents bigint NOT NULL,
            currency varchar(3) NOT NULL,
            sequence bigint,
            details jsonb DEFAULT '{}'::jsonb NOT NULL,
            created_at timestamptz DEFAULT now() NOT NULL,
            updated_at timestamptz DEFAULT now() NOT NULL,
            version bigint DEFAULT '1' NOT NULL,
            CONSTRAINT pk_orders PRIMARY KEY (order_id),
            CONSTRAINT ck_orders_status CHECK (status IN ('placed', 'shipped', 'cancelled')),
            CONSTRAINT ck_orders_amount CHECK (amount_cents >= 0)
        )
        """
    )
