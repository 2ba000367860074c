"""Order rules (contract §5): what each message does to an order, and the effects and events it causes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from service.codes import ErrorCode, FailureKind
from service.orders.codes import OrderCode
from service.orders.messages import (
    DecodeFailure,
    OrderCancelledV1,
    OrderMessage,
    OrderPlacedV1,
    OrderPlacedV2,
    OrderShippedV1,
    decode,
)
from service.orders.model import Applied, Context, CustomerStatus, Order, OrderStatus, Rejected, apply

CONTEXT = Context(known_tenants=frozenset({"acme", "globex", "initech"}))


def placed(**changes: Any) -> OrderPlacedV1:
    """An `order.placed.v1` for A-1001: two lines worth 2797 cents."""
    fields: dict[str, Any] = {
        "schema": "order.placed.v1",
        "order_id": "A-1001",
        "tenant": "acme",
        "customer_id": "C-7",
        "currency": "EUR",
        "items": [
            {"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250},
            {"sku": "SKU-2", "quantity": 3, "unit_price_cents": 99},
        ],
    }
    return OrderPlacedV1.model_validate({**fields, **changes})


def placed_v2(**changes: Any) -> OrderPlacedV2:
    """An `order.placed.v2` for A-1001 with the same lines as `placed`."""
    fields = placed().model_dump(by_alias=True) | {"schema": "order.placed.v2", "placed_at": "2026-07-31T09:10:00Z"}
    return OrderPlacedV2.model_validate({**fields, **changes})


def shipped(sequence: int | None = None) -> OrderShippedV1:
    """An `order.shipped.v1` for A-1001."""
    return OrderShippedV1.model_validate(
        {
            "schema": "order.shipped.v1",
            "order_id": "A-1001",
            "carrier": "DHL",
            "tracking_number": "JD0001",
            "sequence": sequence,
        }
    )


def cancelled(sequence: int | None = None) -> OrderCancelledV1:
    """An `order.cancelled.v1` for A-1001."""
    return OrderCancelledV1.model_validate(
        {"schema": "order.cancelled.v1", "order_id": "A-1001", "reason": "changed my mind", "sequence": sequence}
    )


def existing(status: OrderStatus = OrderStatus.PLACED, sequence: int | None = 1) -> Order:
    """A-1001 as stored after its placed message."""
    return Order(
        order_id="A-1001",
        tenant="acme",
        customer_id="C-7",
        status=status,
        amount_cents=2797,
        currency="EUR",
        sequence=sequence,
    )


def applied(message: OrderMessage, current: Order | None, context: Context = CONTEXT) -> Applied:
    """Apply a message that the rules must accept."""
    result = apply(message, current, context)
    assert isinstance(result, Applied), result
    return result


def test_a_placed_for_a_new_order_creates_it_in_status_placed() -> None:
    order = applied(placed(), None).aggregate

    assert order.order_id == "A-1001"
    assert order.tenant == "acme"
    assert order.customer_id == "C-7"
    assert order.status is OrderStatus.PLACED
    assert order.amount_cents == 2797
    assert order.currency == "EUR"


def test_a_placed_causes_exactly_one_payment_capture_keyed_by_the_order() -> None:
    result = applied(placed(), None)

    assert len(result.effects) == 1
    capture = result.effects[0]
    assert capture.kind == "payment.capture"
    assert capture.order_id == "A-1001"
    assert capture.idempotency_key == "A-1001/payment.capture"
    assert capture.payload == {"order_id": "A-1001", "amount_cents": 2797, "currency": "EUR", "kind": "capture"}


def test_a_placed_emits_one_order_accepted_event() -> None:
    result = applied(placed(), None)

    assert [(event.type, event.order_id) for event in result.events] == [("order.accepted", "A-1001")]


@pytest.mark.parametrize(
    ("message", "sequence"),
    [
        pytest.param(placed(), 1, id="v1"),
        pytest.param(placed_v2(), 1, id="v2-without-sequence"),
        pytest.param(placed_v2(sequence=1), 1, id="v2-sequence-1"),
        pytest.param(placed_v2(sequence=4), 4, id="v2-sequence-4"),
    ],
)
def test_a_placed_sets_the_sequence_it_carries_or_one(message: OrderPlacedV1, sequence: int) -> None:
    assert applied(message, None).aggregate.sequence == sequence


@pytest.mark.parametrize("sequence", [0, -3])
def test_a_placed_v1_carrying_a_sequence_below_one_never_creates_an_order_with_it(sequence: int) -> None:
    # Contract §5: placed = 1. The v1 schema has no `sequence`; one below 1 must be refused or not used.
    value = (
        b'{"schema": "order.placed.v1", "order_id": "A-1001", "tenant": "acme", "customer_id": "C-7",'
        b' "currency": "EUR", "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],'
        b' "sequence": %d}' % sequence
    )

    message = decode(value)

    if isinstance(message, DecodeFailure):
        assert message.code is ErrorCode.INVALID_FIELD
    else:
        order = applied(message, None).aggregate
        assert order.sequence is not None
        assert order.sequence >= 1


@pytest.mark.parametrize(
    ("message", "current", "customer", "code"),
    [
        pytest.param(placed(tenant="umbrella"), None, CustomerStatus.ACTIVE, OrderCode.UNKNOWN_TENANT, id="tenant"),
        pytest.param(placed(), existing(), CustomerStatus.ACTIVE, OrderCode.ORDER_EXISTS, id="second-placed"),
        pytest.param(placed_v2(), existing(), CustomerStatus.ACTIVE, OrderCode.ORDER_EXISTS, id="second-placed-v2"),
        pytest.param(
            placed(),
            existing(OrderStatus.SHIPPED, 2),
            CustomerStatus.ACTIVE,
            OrderCode.ORDER_EXISTS,
            id="placed-after-shipped",
        ),
        pytest.param(placed(), None, CustomerStatus.UNKNOWN, OrderCode.UNKNOWN_CUSTOMER, id="unknown-customer"),
        pytest.param(placed(), None, CustomerStatus.BLOCKED, OrderCode.CUSTOMER_BLOCKED, id="blocked-customer"),
    ],
)
def test_a_placed_that_breaks_a_rule_is_rejected_with_its_code(
    message: OrderPlacedV1, current: Order | None, customer: CustomerStatus, code: ErrorCode
) -> None:
    context = Context(known_tenants=CONTEXT.known_tenants, customer=customer)

    result = apply(message, current, context)

    assert result == Rejected(code)
    assert isinstance(result, Rejected)
    assert result.code.kind is FailureKind.REJECTED


@pytest.mark.parametrize("tenant", ["acme", "globex", "initech"])
def test_a_placed_for_every_default_tenant_is_accepted(tenant: str) -> None:
    assert applied(placed(tenant=tenant), None).aggregate.tenant == tenant


def test_a_tenant_outside_a_configured_list_is_rejected_even_if_it_is_a_default_one() -> None:
    context = Context(known_tenants=frozenset({"umbrella"}))

    assert apply(placed(tenant="acme"), None, context) == Rejected(OrderCode.UNKNOWN_TENANT)


@pytest.mark.parametrize("message", [pytest.param(shipped(), id="shipped"), pytest.param(cancelled(), id="cancelled")])
def test_an_update_for_an_order_that_does_not_exist_is_rejected_with_order_not_found(message: OrderMessage) -> None:
    assert apply(message, None, CONTEXT) == Rejected(OrderCode.ORDER_NOT_FOUND)


@pytest.mark.parametrize(
    ("message", "status"),
    [
        pytest.param(shipped(), OrderStatus.SHIPPED, id="shipped-twice"),
        pytest.param(shipped(), OrderStatus.CANCELLED, id="shipped-after-cancelled"),
        pytest.param(cancelled(), OrderStatus.SHIPPED, id="cancelled-after-shipped"),
        pytest.param(cancelled(), OrderStatus.CANCELLED, id="cancelled-twice"),
    ],
)
def test_an_update_from_a_status_other_than_placed_is_an_invalid_transition(
    message: OrderMessage, status: OrderStatus
) -> None:
    assert apply(message, existing(status, 2), CONTEXT) == Rejected(OrderCode.INVALID_TRANSITION)


def test_a_shipped_moves_a_placed_order_to_shipped_and_keeps_what_it_was_placed_with() -> None:
    current = existing()

    order = applied(shipped(), current).aggregate

    assert order.status is OrderStatus.SHIPPED
    assert (order.order_id, order.tenant, order.customer_id) == ("A-1001", "acme", "C-7")
    assert (order.amount_cents, order.currency) == (2797, "EUR")
    assert current.status is OrderStatus.PLACED


def test_a_shipped_causes_one_shipping_email_whose_ref_is_the_order_and_effect() -> None:
    result = applied(shipped(), existing())

    assert len(result.effects) == 1
    email = result.effects[0]
    assert email.kind == "email.shipped"
    assert email.idempotency_key == "A-1001/email.shipped"
    assert email.payload["ref"] == "A-1001/email.shipped"
    assert email.payload["to_customer"] == "C-7"
    assert [(event.type, event.order_id) for event in result.events] == [("order.shipped", "A-1001")]


def test_a_cancelled_moves_a_placed_order_to_cancelled_with_one_refund_of_the_amount() -> None:
    result = applied(cancelled(), existing())

    assert result.aggregate.status is OrderStatus.CANCELLED
    assert len(result.effects) == 1
    refund = result.effects[0]
    assert refund.kind == "payment.refund"
    assert refund.idempotency_key == "A-1001/payment.refund"
    assert refund.payload == {"order_id": "A-1001", "amount_cents": 2797, "currency": "EUR", "kind": "refund"}
    assert [(event.type, event.order_id) for event in result.events] == [("order.cancelled", "A-1001")]


@pytest.mark.parametrize("update", [shipped, cancelled], ids=["shipped", "cancelled"])
@pytest.mark.parametrize(
    ("current", "given", "expected"),
    [
        pytest.param(1, None, 2, id="after-placed"),
        pytest.param(4, None, 5, id="after-four"),
        pytest.param(1, 2, 2, id="given-next"),
        pytest.param(1, 7, 7, id="given-jump"),
    ],
)
def test_an_update_sets_the_sequence_it_carries_or_the_next_one(
    update: Callable[[int | None], OrderMessage], current: int, given: int | None, expected: int
) -> None:
    assert applied(update(given), existing(sequence=current)).aggregate.sequence == expected


def test_applying_is_pure_the_same_inputs_give_the_same_result() -> None:
    assert apply(placed(), None, CONTEXT) == apply(placed(), None, CONTEXT)
    assert apply(shipped(), existing(), CONTEXT) == apply(shipped(), existing(), CONTEXT)


def test_a_placed_order_is_at_version_one() -> None:
    result = apply(placed(), None, CONTEXT)

    assert isinstance(result, Applied)
    assert result.aggregate.version == 1


@pytest.mark.parametrize("message", [shipped(), cancelled(), shipped(sequence=9)], ids=["shipped", "cancelled", "seq"])
def test_every_change_of_an_order_is_one_version_more_whatever_its_sequence(message: OrderMessage) -> None:
    current = replace(existing(), version=4)

    result = apply(message, current, CONTEXT)

    assert isinstance(result, Applied)
    assert result.aggregate.version == 5
