"""Decoding source record values (contract §5): a valid message or a failure code, never an exception."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.orders.messages import (
    DecodeFailure,
    OrderCancelledV1,
    OrderPlacedV1,
    OrderPlacedV2,
    OrderShippedV1,
    decode,
    invalid_field,
)

MISSING = object()

VALID: dict[str, dict[str, Any]] = {
    "order.placed.v1": {
        "schema": "order.placed.v1",
        "order_id": "A-1001",
        "tenant": "acme",
        "customer_id": "C-7",
        "currency": "EUR",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}],
    },
    "order.placed.v2": {
        "schema": "order.placed.v2",
        "order_id": "A-1001",
        "tenant": "acme",
        "customer_id": "C-7",
        "currency": "EUR",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}],
        "placed_at": "2026-07-31T09:10:00Z",
        "sequence": 1,
    },
    "order.shipped.v1": {
        "schema": "order.shipped.v1",
        "order_id": "A-1001",
        "carrier": "DHL",
        "tracking_number": "JD0001",
        "sequence": 2,
    },
    "order.cancelled.v1": {"schema": "order.cancelled.v1", "order_id": "A-1001", "reason": "changed my mind"},
}


def document(schema: str, /, **changes: Any) -> dict[str, Any]:
    """A valid document of `schema` with some fields replaced (`schema` too), or removed when set to MISSING."""
    result = json.loads(json.dumps(VALID[schema]))
    for name, value in changes.items():
        if value is MISSING:
            del result[name]
        else:
            result[name] = value
    return result


def encode(value: dict[str, Any]) -> bytes:
    """The record value a producer would send."""
    return json.dumps(value).encode("utf-8")


def item(**changes: Any) -> dict[str, Any]:
    """A valid order line with some fields replaced, or removed when set to MISSING."""
    line: dict[str, Any] = {"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}
    for name, value in changes.items():
        if value is MISSING:
            del line[name]
        else:
            line[name] = value
    return line


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="no-value"),
        pytest.param(b"", id="empty"),
        pytest.param(b"not json", id="text"),
        pytest.param(b'{"schema": "order.placed.v1",', id="truncated"),
        pytest.param(b"\xff\xfe\x00garbage", id="not-utf8"),
        pytest.param(b"[1, 2, 3]", id="array"),
        pytest.param(b'"order.placed.v1"', id="string"),
        pytest.param(b"42", id="number"),
        pytest.param(b"null", id="null"),
        pytest.param(b"true", id="boolean"),
    ],
)
def test_a_value_that_is_not_a_json_object_is_a_malformed_payload(value: bytes | None) -> None:
    assert decode(value) == DecodeFailure(code=ErrorCode.MALFORMED_PAYLOAD)


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_a_deeply_nested_document_is_a_malformed_payload_rather_than_a_crash(opening: bytes) -> None:
    # A few kilobytes of nesting: well under Kafka's record size limit, deeper than the JSON parser's recursion.
    value = opening * 5000

    assert decode(value) == DecodeFailure(code=ErrorCode.MALFORMED_PAYLOAD)


def test_decode_never_raises_for_arbitrary_bytes() -> None:
    rng = random.Random(20260731)
    samples = [rng.randbytes(rng.randrange(0, 64)) for _ in range(300)]
    samples += [b"{" + sample + b"}" for sample in samples[:100]]

    for sample in samples:
        assert isinstance(decode(sample), DecodeFailure | OrderPlacedV1 | OrderShippedV1 | OrderCancelledV1)


@pytest.mark.parametrize(
    ("schema", "kept"),
    [
        pytest.param("order.placed.v3", "order.placed.v3", id="next-version"),
        pytest.param("order.refunded.v1", "order.refunded.v1", id="unknown-type"),
        pytest.param("invoice_created-v1", "invoice_created-v1", id="other-identifier"),
        pytest.param("x" * 300, None, id="too-long"),
        pytest.param("order placed", None, id="space"),
        pytest.param("jane.doe@example.com", None, id="email-address"),
        pytest.param("<script>alert(1)</script>", None, id="markup"),
        pytest.param("order.placed.v1\nerror-code: NONE", None, id="header-injection"),
        pytest.param("4111111111111111", None, id="card-number"),
    ],
)
def test_an_unknown_schema_is_unsupported_and_its_name_kept_only_when_it_is_a_safe_identifier(
    schema: str, kept: str | None
) -> None:
    failure = decode(encode(document("order.placed.v1", schema=schema)))

    assert failure == DecodeFailure(code=ErrorCode.SCHEMA_UNSUPPORTED, schema_name=kept)


@pytest.mark.parametrize("schema", [pytest.param(MISSING, id="missing"), 42, None, ["order.placed.v1"]])
def test_a_missing_or_ill_typed_schema_field_is_an_invalid_field(schema: object) -> None:
    failure = decode(encode(document("order.placed.v1", schema=schema)))

    assert isinstance(failure, DecodeFailure)
    assert failure.code is ErrorCode.INVALID_FIELD
    assert failure.schema_name is None


@pytest.mark.parametrize(
    ("schema", "changes"),
    [
        pytest.param("order.placed.v1", {"order_id": MISSING}, id="v1-no-order-id"),
        pytest.param("order.placed.v1", {"order_id": 1001}, id="v1-numeric-order-id"),
        pytest.param("order.placed.v1", {"order_id": ""}, id="v1-empty-order-id"),
        pytest.param("order.placed.v1", {"order_id": "   "}, id="v1-blank-order-id"),
        pytest.param("order.placed.v1", {"tenant": MISSING}, id="v1-no-tenant"),
        pytest.param("order.placed.v1", {"tenant": None}, id="v1-null-tenant"),
        pytest.param("order.placed.v1", {"customer_id": MISSING}, id="v1-no-customer"),
        pytest.param("order.placed.v1", {"currency": MISSING}, id="v1-no-currency"),
        pytest.param("order.placed.v1", {"currency": "eur"}, id="v1-lowercase-currency"),
        pytest.param("order.placed.v1", {"currency": "EURO"}, id="v1-long-currency"),
        pytest.param("order.placed.v1", {"currency": "E1R"}, id="v1-digit-in-currency"),
        pytest.param("order.placed.v1", {"currency": 978}, id="v1-numeric-currency"),
        pytest.param("order.placed.v1", {"items": MISSING}, id="v1-no-items"),
        pytest.param("order.placed.v1", {"items": []}, id="v1-empty-items"),
        pytest.param("order.placed.v1", {"items": "SKU-1"}, id="v1-items-not-a-list"),
        pytest.param("order.placed.v1", {"items": [item(quantity=0)]}, id="v1-quantity-zero"),
        pytest.param("order.placed.v1", {"items": [item(quantity=-1)]}, id="v1-negative-quantity"),
        pytest.param("order.placed.v1", {"items": [item(quantity=1.5)]}, id="v1-fractional-quantity"),
        pytest.param("order.placed.v1", {"items": [item(quantity="two")]}, id="v1-quantity-in-words"),
        pytest.param("order.placed.v1", {"items": [item(quantity=MISSING)]}, id="v1-no-quantity"),
        pytest.param("order.placed.v1", {"items": [item(sku=MISSING)]}, id="v1-no-sku"),
        pytest.param("order.placed.v1", {"items": [item(unit_price_cents=-1)]}, id="v1-negative-price"),
        pytest.param("order.placed.v1", {"items": [item(unit_price_cents=MISSING)]}, id="v1-no-price"),
        pytest.param("order.placed.v1", {"items": [item(), item(quantity=0)]}, id="v1-second-line-bad"),
        pytest.param("order.placed.v2", {"placed_at": MISSING}, id="v2-no-placed-at"),
        pytest.param("order.placed.v2", {"placed_at": "2026-07-31T09:10:00"}, id="v2-naive-placed-at"),
        pytest.param("order.placed.v2", {"placed_at": "yesterday"}, id="v2-placed-at-in-words"),
        pytest.param("order.placed.v2", {"sequence": 0}, id="v2-sequence-zero"),
        pytest.param("order.placed.v2", {"sequence": "first"}, id="v2-sequence-in-words"),
        pytest.param("order.placed.v2", {"currency": "usd"}, id="v2-lowercase-currency"),
        pytest.param("order.shipped.v1", {"carrier": MISSING}, id="shipped-no-carrier"),
        pytest.param("order.shipped.v1", {"carrier": ""}, id="shipped-empty-carrier"),
        pytest.param("order.shipped.v1", {"tracking_number": MISSING}, id="shipped-no-tracking-number"),
        pytest.param("order.shipped.v1", {"order_id": MISSING}, id="shipped-no-order-id"),
        pytest.param("order.shipped.v1", {"sequence": 0}, id="shipped-sequence-zero"),
        pytest.param("order.cancelled.v1", {"reason": MISSING}, id="cancelled-no-reason"),
        pytest.param("order.cancelled.v1", {"reason": 7}, id="cancelled-numeric-reason"),
        pytest.param("order.cancelled.v1", {"sequence": -1}, id="cancelled-negative-sequence"),
    ],
)
def test_a_missing_or_ill_typed_field_is_an_invalid_field_that_keeps_the_schema_name(
    schema: str, changes: dict[str, Any]
) -> None:
    failure = decode(encode(document(schema, **changes)))

    assert failure == DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema)


@pytest.mark.parametrize(
    ("schema", "changes"),
    [
        pytest.param("order.placed.v1", {"items": [item(quantity=True)]}, id="boolean-quantity"),
        pytest.param("order.placed.v1", {"items": [item(quantity="2")]}, id="quoted-quantity"),
        pytest.param("order.placed.v1", {"items": [item(unit_price_cents="1250")]}, id="quoted-price"),
        pytest.param("order.placed.v2", {"placed_at": 1785489000}, id="epoch-number-placed-at"),
    ],
)
def test_a_json_value_of_the_wrong_type_is_not_coerced_into_a_valid_field(schema: str, changes: dict[str, Any]) -> None:
    failure = decode(encode(document(schema, **changes)))

    assert failure == DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema)


def test_a_valid_placed_v1_decodes_with_every_field() -> None:
    message = decode(encode(document("order.placed.v1")))

    assert isinstance(message, OrderPlacedV1)
    assert not isinstance(message, OrderPlacedV2)
    assert message.schema_name == "order.placed.v1"
    assert message.order_id == "A-1001"
    assert message.tenant == "acme"
    assert message.customer_id == "C-7"
    assert message.currency == "EUR"
    assert message.items == [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}]


def test_a_valid_placed_v2_decodes_with_an_aware_placed_at_and_its_sequence() -> None:
    message = decode(encode(document("order.placed.v2", placed_at="2026-07-31T11:10:00+02:00", sequence=3)))

    assert isinstance(message, OrderPlacedV2)
    assert message.schema_name == "order.placed.v2"
    assert message.placed_at == datetime(2026, 7, 31, 9, 10, tzinfo=UTC)
    assert message.placed_at.utcoffset() == timedelta(hours=2)
    assert message.sequence == 3


def test_a_placed_v2_without_a_sequence_decodes() -> None:
    message = decode(encode(document("order.placed.v2", sequence=MISSING)))

    assert isinstance(message, OrderPlacedV2)
    assert message.sequence is None
    assert message.placed_at == datetime(2026, 7, 31, 9, 10, tzinfo=UTC)


def test_a_valid_shipped_decodes_with_carrier_tracking_number_and_sequence() -> None:
    message = decode(encode(document("order.shipped.v1")))

    assert isinstance(message, OrderShippedV1)
    assert (message.schema_name, message.order_id) == ("order.shipped.v1", "A-1001")
    assert (message.carrier, message.tracking_number, message.sequence) == ("DHL", "JD0001", 2)


def test_a_valid_cancelled_decodes_with_its_reason_and_no_sequence() -> None:
    message = decode(encode(document("order.cancelled.v1")))

    assert isinstance(message, OrderCancelledV1)
    assert (message.schema_name, message.order_id) == ("order.cancelled.v1", "A-1001")
    assert message.reason == "changed my mind"
    assert message.sequence is None


@pytest.mark.parametrize("schema", sorted(VALID))
def test_a_field_the_schema_does_not_know_is_ignored(schema: str) -> None:
    message = decode(encode(document(schema, gift_wrap=True)))

    assert not isinstance(message, DecodeFailure)
    assert message.schema_name == schema


@pytest.mark.parametrize(
    ("lines", "amount"),
    [
        pytest.param([(1, 0)], 0, id="free-item"),
        pytest.param([(2, 1250)], 2500, id="one-line"),
        pytest.param([(2, 1250), (3, 99)], 2797, id="two-lines"),
        pytest.param([(1_000, 1_000_000)], 1_000_000_000, id="large"),
    ],
)
def test_the_amount_sums_quantity_times_unit_price_over_the_lines(lines: list[tuple[int, int]], amount: int) -> None:
    items = [
        item(sku=f"SKU-{n}", quantity=quantity, unit_price_cents=price) for n, (quantity, price) in enumerate(lines)
    ]

    message = decode(encode(document("order.placed.v1", items=items)))

    assert isinstance(message, OrderPlacedV1)
    assert message.amount_cents == amount


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"schema": "order.cancelled.v1", "order_id": "A-1"}, ("reason", "missing")),
        (
            {
                "schema": "order.placed.v1",
                "order_id": "A-1",
                "tenant": "acme",
                "customer_id": "c",
                "currency": "EUR",
                "items": [{"sku": "s", "quantity": "2", "unit_price_cents": 1}],
            },
            ("items.0.quantity", "int_type"),
        ),
        (
            # A line that is not an object (lines are typed dicts)
            {
                "schema": "order.placed.v1",
                "order_id": "A-1",
                "tenant": "acme",
                "customer_id": "c",
                "currency": "EUR",
                "items": [["s", 2, 1]],
            },
            ("items.0", "dict_type"),
        ),
        ({"order_id": "A-1"}, ("schema", "missing")),
    ],
)
def test_an_invalid_field_is_named_by_its_path_and_rule_without_its_value(
    document: dict[str, object], expected: tuple[str, str]
) -> None:
    assert invalid_field(json.dumps(document).encode()) == expected


def test_a_valid_or_malformed_value_names_no_field() -> None:
    assert invalid_field(b"{not json") is None
    assert invalid_field(None) is None


_CONTROL = st.characters(categories=["Cc"])
_PRINTABLE = st.characters(codec="utf-8", exclude_categories=["Cc", "Cs", "Zs", "Zl", "Zp"])


@given(
    # (between other characters: at either end, one that is whitespace is stripped, as any whitespace is)
    st.tuples(st.text(_PRINTABLE, min_size=1, max_size=20), _CONTROL, st.text(_PRINTABLE, min_size=1, max_size=20)).map(
        "".join
    ),
    st.sampled_from(sorted(VALID)),
)
def test_an_order_id_holding_a_control_character_is_an_invalid_field(order_id: str, schema: str) -> None:
    # (it would become an idempotency key header, which cannot carry one: a capture that could never be sent)
    value = json.dumps(VALID[schema] | {"order_id": order_id}).encode()
    assert decode(value) == DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema)
    assert invalid_field(value) == ("order_id", "string_pattern_mismatch")


@given(st.text(_PRINTABLE, min_size=1, max_size=200), st.sampled_from(sorted(VALID)))
def test_an_order_id_of_any_other_characters_decodes_as_it_came(order_id: str, schema: str) -> None:
    message = decode(json.dumps(VALID[schema] | {"order_id": order_id}).encode())
    assert not isinstance(message, DecodeFailure)
    assert message.order_id == order_id
