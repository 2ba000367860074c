"""Order-domain records for tests: the source messages of contract §5, valid unless a test changes them."""

from __future__ import annotations

from typing import Any


def placed(order_id: str, customer: str = "c-1", tenant: str = "acme") -> dict[str, Any]:
    """An `order.placed.v1` of one item (2 × 12.50 EUR)."""
    return {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": tenant,
        "customer_id": customer,
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250}],
    }


def shipped(order_id: str) -> dict[str, Any]:
    """An `order.shipped.v1`."""
    return {"schema": "order.shipped.v1", "order_id": order_id, "carrier": "dhl", "tracking_number": "JD0001"}


def cancelled(order_id: str) -> dict[str, Any]:
    """An `order.cancelled.v1`."""
    return {"schema": "order.cancelled.v1", "order_id": order_id, "reason": "changed my mind"}
