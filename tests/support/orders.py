"""Order-domain records for tests: the source messages of contract §5, valid unless a test changes them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from service.store.quarantine import QuarantineRow


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


def quarantined_placement(
    failure_id: str, order_id: str, failed_at: datetime, code: str = "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"
) -> QuarantineRow:
    """The quarantine row of a valid placement whose look-ups ran out of budget (`failure_id`: its coordinates), as
    a consumer's round writes it: one a reprocess run sends back and a consumer applies."""
    topic, partition, offset = failure_id.rsplit("/", 2)
    message_id = f"{order_id}.1/placed"
    source = {"topic": topic, "partition": int(partition), "offset": int(offset), "key": order_id}
    return QuarantineRow(
        failure_id=failure_id,
        message_id=message_id,
        error_code=code,
        owner="order-service-oncall",
        ordering_key=order_id,
        envelope={"failureId": failure_id, "messageId": message_id, "source": source, "errorCode": code},
        payload=json.dumps(placed(order_id)).encode(),
        source_headers=[["message-id", message_id]],
        attempts=3,
        first_failed_at=failed_at,
        last_failed_at=failed_at,
    )
