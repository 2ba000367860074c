"""The second domain's rules (examples/inventory/inventory/model.py) and schemas (messages.py), without I/O."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from inventory.codes import InventoryCode
from inventory.messages import StockReleasedV1, StockReservedV1, decode, invalid_field
from inventory.model import HOLD, UNHOLD, Applied, Reservation, Status, Stock, apply
from service.codes import Code, ErrorCode, FailureKind, registered
from service.policy.handling import DecodeFailure, Rejected
from tests.support.inventory import released, reserved

IN_STOCK = Stock("SKU-1", known=True, available={"berlin": 5})
RESERVATION = Reservation("R-1", "SKU-1", 2, "berlin", Status.RESERVED)


def message(document: dict[str, Any]) -> StockReservedV1 | StockReleasedV1:
    """The decoded message (a test fails if the document is not valid)."""
    decoded = decode(json.dumps(document).encode())
    assert not isinstance(decoded, DecodeFailure), decoded
    return decoded


@pytest.mark.parametrize(
    ("document", "current", "stock", "code"),
    [
        pytest.param(reserved("R-1"), RESERVATION, IN_STOCK, InventoryCode.RESERVATION_EXISTS, id="reserved twice"),
        pytest.param(reserved("R-1"), None, Stock("SKU-1", known=False), InventoryCode.UNKNOWN_SKU, id="unknown sku"),
        pytest.param(reserved("R-1", quantity=6), None, IN_STOCK, InventoryCode.INSUFFICIENT_STOCK, id="too few"),
        pytest.param(
            reserved("R-1", warehouse="paris"), None, IN_STOCK, InventoryCode.INSUFFICIENT_STOCK, id="not stocked there"
        ),
        pytest.param(released("R-1"), None, None, InventoryCode.RESERVATION_NOT_FOUND, id="release of nothing"),
        pytest.param(
            released("R-1"),
            replace(RESERVATION, status=Status.RELEASED),
            None,
            InventoryCode.ALREADY_RELEASED,
            id="released twice",
        ),
    ],
)
def test_a_message_the_rules_refuse_is_rejected_with_its_code(
    document: dict[str, Any], current: Reservation | None, stock: Stock | None, code: Code
) -> None:
    assert apply(message(document), current, stock) == Rejected(code)


@pytest.mark.parametrize(
    ("quantity", "stock"),
    [
        pytest.param(5, IN_STOCK, id="exactly what the warehouse has"),
        pytest.param(1, IN_STOCK, id="less than it has"),
        pytest.param(1000, None, id="the stock API is not configured: the hold is the only check"),
    ],
)
def test_a_reserve_creates_the_reservation_a_hold_and_an_accepted_event(quantity: int, stock: Stock | None) -> None:
    result = apply(message(reserved("R-1", quantity=quantity)), None, stock)

    assert isinstance(result, Applied)
    assert result.aggregate == Reservation("R-1", "SKU-1", quantity, "berlin", Status.RESERVED, sequence=1, version=1)
    [hold] = result.effects
    assert (hold.kind, hold.idempotency_key, hold.aggregate_id) == (HOLD, "R-1/warehouse.hold", "R-1")
    assert hold.payload == {"reservation_id": "R-1", "sku": "SKU-1", "quantity": quantity, "warehouse": "berlin"}
    assert [(e.type, e.payload) for e in result.events] == [
        ("reservation.accepted", {"sku": "SKU-1", "quantity": quantity, "warehouse": "berlin"})
    ]


@pytest.mark.parametrize(
    ("sequence", "stored", "expected"),
    [(None, 1, 2), (7, 1, 7), (None, None, None)],
    ids=["the next one", "the producer's", "none kept"],
)
def test_a_release_releases_the_reservation_and_unholds_by_the_holds_key(
    sequence: int | None, stored: int | None, expected: int | None
) -> None:
    current = replace(RESERVATION, sequence=stored, version=2)

    result = apply(message(released("R-1", sequence=sequence)), current, None)

    assert isinstance(result, Applied)
    assert result.aggregate == replace(current, status=Status.RELEASED, sequence=expected, version=3)
    [unhold] = result.effects
    assert (unhold.kind, unhold.idempotency_key) == (UNHOLD, "R-1/warehouse.unhold")
    assert unhold.payload == {"reservation_id": "R-1", "hold_key": "R-1/warehouse.hold", "warehouse": "berlin"}
    assert [(e.type, e.payload) for e in result.events] == [("reservation.released", {"reason": "order cancelled"})]


@pytest.mark.parametrize(
    ("value", "code", "schema"),
    [
        (b"not json", ErrorCode.MALFORMED_PAYLOAD, None),
        (b"[1, 2]", ErrorCode.MALFORMED_PAYLOAD, None),
        (None, ErrorCode.MALFORMED_PAYLOAD, None),
        (b'{"reservation_id": "R-1"}', ErrorCode.INVALID_FIELD, None),
        (b'{"schema": "stock.moved.v1", "reservation_id": "R-1"}', ErrorCode.SCHEMA_UNSUPPORTED, "stock.moved.v1"),
        (json.dumps({**reserved("R-1"), "quantity": 0}).encode(), ErrorCode.INVALID_FIELD, "stock.reserved.v1"),
        (json.dumps({**reserved("R-1"), "quantity": "2"}).encode(), ErrorCode.INVALID_FIELD, "stock.reserved.v1"),
        (json.dumps({**reserved("R-1"), "sku": "a\x00b"}).encode(), ErrorCode.INVALID_FIELD, "stock.reserved.v1"),
        (json.dumps({**released("R-1"), "reason": " "}).encode(), ErrorCode.INVALID_FIELD, "stock.released.v1"),
        # (the reservation id becomes the holds' Idempotency-Key header, which cannot carry a control character)
        (json.dumps(reserved("R\r\n1")).encode(), ErrorCode.INVALID_FIELD, "stock.reserved.v1"),
        (json.dumps(released("R-\x7f1")).encode(), ErrorCode.INVALID_FIELD, "stock.released.v1"),
    ],
    ids=[
        "not json",
        "not an object",
        "no value",
        "no schema",
        "unknown schema",
        "quantity 0",
        "quantity as text",
        "NUL in a text",
        "blank reason",
        "line break in the reservation id",
        "DEL in the reservation id",
    ],
)
def test_bytes_that_are_not_a_valid_message_decode_to_a_failure_never_an_exception(
    value: bytes | None, code: ErrorCode, schema: str | None
) -> None:
    assert decode(value) == DecodeFailure(code, schema)


def test_a_decoded_message_names_its_aggregate_and_schema() -> None:
    decoded = message(released("R-9", sequence=3))

    assert (decoded.aggregate_id, decoded.schema_name) == ("R-9", "stock.released.v1")


def test_an_invalid_field_is_named_for_the_operator_without_its_value() -> None:
    value = json.dumps({**reserved("R-1"), "quantity": -3}).encode()

    assert invalid_field(value) == ("quantity", "greater_than")
    assert invalid_field(json.dumps(reserved("R-1")).encode()) is None


def test_the_domains_codes_are_rejections_and_clash_with_no_core_code() -> None:
    codes = registered(InventoryCode)

    assert {codes[code.value] for code in InventoryCode} == {FailureKind.REJECTED}
