"""Inventory-domain records for tests (the second domain, examples/inventory): the source messages, valid unless a
test changes them."""

from __future__ import annotations

from typing import Any


def reserved(reservation_id: str, sku: str = "SKU-1", quantity: int = 2, warehouse: str = "berlin") -> dict[str, Any]:
    """A `stock.reserved.v1`."""
    return {
        "schema": "stock.reserved.v1",
        "reservation_id": reservation_id,
        "sku": sku,
        "quantity": quantity,
        "warehouse": warehouse,
    }


def released(reservation_id: str, reason: str = "order cancelled", sequence: int | None = None) -> dict[str, Any]:
    """A `stock.released.v1`."""
    message: dict[str, Any] = {"schema": "stock.released.v1", "reservation_id": reservation_id, "reason": reason}
    if sequence is not None:
        message["sequence"] = sequence
    return message
