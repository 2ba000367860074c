"""The reservations table (created by this domain's own migration, `migrations/versions/inv_0001_reservations.py`),
read into and written from `Reservation` values: the aggregate store seam (`service.ports.AggregateRows`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from inventory.model import Reservation, Status
from service.ports import AggregateRows, Columns


def _to_reservation(row: Any) -> Reservation:
    return Reservation(
        reservation_id=row.reservation_id,
        sku=row.sku,
        quantity=row.quantity,
        warehouse=row.warehouse,
        status=Status(row.status),
        sequence=row.sequence,
        version=row.version,
    )


async def lock(connection: AsyncConnection, reservation_ids: Iterable[str]) -> dict[str, Reservation]:
    """Load and lock the existing reservations; changes of one reservation serialise on this lock."""
    ids = sorted(set(reservation_ids))  # a stable lock order keeps two rounds from deadlocking
    if not ids:
        return {}
    result = await connection.execute(_LOCK, {"ids": ids})
    return {row.reservation_id: _to_reservation(row) for row in result}


_LOCK = text(
    "SELECT reservation_id, sku, quantity, warehouse, status, sequence, version FROM reservations"
    " WHERE reservation_id = ANY(CAST(:ids AS text[])) ORDER BY reservation_id FOR UPDATE"
)

# The fields of `Reservation` as a recordset (`service.ports.Columns`), for the new and the changed ones.
COLUMNS = Columns(
    ("reservation_id", "text"),
    ("sku", "text"),
    ("quantity", "bigint"),
    ("warehouse", "text"),
    ("status", "text"),
    ("sequence", "bigint"),
    ("version", "bigint"),
)
CREATE_ROWS = f"""
    INSERT INTO reservations (reservation_id, sku, quantity, warehouse, status, sequence, version)
    SELECT reservation_id, sku, quantity, warehouse, status, sequence, version
    FROM ({COLUMNS.select("created_aggregates")}) AS v"""
# `hold_status` is the effects' to write (`inventory/effects.py`): a change from a record leaves it.
UPDATE_ROWS = f"""
    UPDATE reservations SET status = v.status, sequence = v.sequence, version = v.version, updated_at = now()
    FROM ({COLUMNS.select("changed_aggregates")}) AS v
    WHERE reservations.reservation_id = v.reservation_id"""

# The reservations as the round's one write statement writes them; a new one that a concurrent member created
# first violates `pk_reservations`, and the round is redone.
ROWS = AggregateRows(
    COLUMNS,
    CREATE_ROWS,
    UPDATE_ROWS,
    raced_key="pk_reservations",
    exists="SELECT FROM reservations WHERE reservation_id = m.id",
)


async def set_hold_status(connection: AsyncConnection, reservation_id: str, status: str) -> int | None:
    """Record a hold's outcome on its reservation, a new version of it; return that version (None: no such
    reservation)."""
    version = await connection.scalar(_SET_HOLD_STATUS, {"status": status, "reservation_id": reservation_id})
    return int(version) if version is not None else None


_SET_HOLD_STATUS = text(
    """
    UPDATE reservations SET hold_status = :status, version = version + 1, updated_at = now()
    WHERE reservation_id = :reservation_id
    RETURNING version
    """
)
