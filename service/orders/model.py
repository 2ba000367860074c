"""Order rules (contract §5): what a message does to an order, which effects and events it causes.

Pure functions over frozen values; the shell loads the current order, calls `apply`, and writes the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar, dataclass_transform

from service.orders.codes import OrderCode
from service.orders.messages import (
    OrderCancelledV1,
    OrderMessage,
    OrderPlacedV1,
    OrderShippedV1,
    placed_at,
    sequence_of,
)
from service.ports import Rejected

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def value(cls: type[_T]) -> type[_T]:
    """A domain value: frozen to the type checker (assigning a field is an error), a plain slotted dataclass at run
    time.

    Every applied record builds several values, and a frozen dataclass is much dearer to build
    (docs/performance.md, "Why the hot path is shaped this way").
    """
    return dataclass(cls, slots=True)


class OrderStatus(StrEnum):
    """Where an order is in its life."""

    PLACED = "placed"
    SHIPPED = "shipped"
    CANCELLED = "cancelled"


class CustomerStatus(StrEnum):
    """What the customer directory says about the customer of a new order."""

    ACTIVE = "active"
    BLOCKED = "blocked"
    UNKNOWN = "unknown"


@value
class Order:
    """The order row as the domain sees it."""

    order_id: str
    tenant: str
    customer_id: str
    status: OrderStatus
    amount_cents: int
    currency: str
    sequence: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # The order's version: 1 when placed, one more with every change (payment outcomes too), assigned under
    # the order's row lock; events carry it as `orderVersion` so readers can check and restore per-order order.
    version: int = 1

    @property
    def aggregate_id(self) -> str:
        """The order id: the aggregate the core's round writes."""
        return self.order_id


@value
class Effect:
    """An external call to make later, identified by `<order_id>/<kind>` (contract §6)."""

    order_id: str
    kind: str
    payload: dict[str, Any]

    @property
    def aggregate_id(self) -> str:
        """The order the effect belongs to (the ledger's `aggregate_id`)."""
        return self.order_id

    @property
    def idempotency_key(self) -> str:
        """The provider idempotency key or email ref."""
        return f"{self.order_id}/{self.kind}"


@value
class Event:
    """A domain event for `orders.events`."""

    type: str
    order_id: str
    payload: dict[str, Any]


@value
class Applied:
    """The message changed the order (the core reads it as service/policy/handling.py `Applied`)."""

    aggregate: Order
    effects: tuple[Effect, ...]
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Context:
    """What the rules need beyond the message and the current order."""

    known_tenants: frozenset[str]
    customer: CustomerStatus = CustomerStatus.ACTIVE


def apply(message: OrderMessage, current: Order | None, context: Context) -> Applied | Rejected:
    """Apply one message to the current state of its order."""
    if isinstance(message, OrderPlacedV1):
        return _place(message, current, context)
    if current is None:
        return Rejected(OrderCode.ORDER_NOT_FOUND)
    if current.status is not OrderStatus.PLACED:
        return Rejected(OrderCode.INVALID_TRANSITION)
    if isinstance(message, OrderShippedV1):
        return _ship(message, current)
    return _cancel(message, current)


def _place(message: OrderPlacedV1, current: Order | None, context: Context) -> Applied | Rejected:
    if message.tenant not in context.known_tenants:
        return Rejected(OrderCode.UNKNOWN_TENANT)
    if current is not None:
        return Rejected(OrderCode.ORDER_EXISTS)
    if context.customer is CustomerStatus.UNKNOWN:
        return Rejected(OrderCode.UNKNOWN_CUSTOMER)
    if context.customer is CustomerStatus.BLOCKED:
        return Rejected(OrderCode.CUSTOMER_BLOCKED)
    when = placed_at(message)
    order = Order(
        order_id=message.order_id,
        tenant=message.tenant,
        customer_id=message.customer_id,
        status=OrderStatus.PLACED,
        amount_cents=message.amount_cents,
        currency=message.currency,
        sequence=sequence_of(message) or 1,
        details={"placed_at": when.isoformat()} if when else {},
    )
    capture = capture_of(order)
    accepted = Event(
        "order.accepted",
        order.order_id,
        {
            "tenant": order.tenant,
            "customerId": order.customer_id,
            "amountCents": order.amount_cents,
            "currency": order.currency,
        },
    )
    return Applied(order, (capture,), (accepted,))


def capture_of(order: Order) -> Effect:
    """The capture of a new order's amount: the effect `placed` records."""
    payload = {
        "order_id": order.order_id,
        "amount_cents": order.amount_cents,
        "currency": order.currency,
        "kind": "capture",
    }
    return Effect(order.order_id, "payment.capture", payload)


def _ship(message: OrderShippedV1, current: Order) -> Applied:
    order = replace(
        current,
        status=OrderStatus.SHIPPED,
        sequence=_next_sequence(current, message.sequence),
        version=current.version + 1,
        details={**current.details, "carrier": message.carrier, "tracking_number": message.tracking_number},
    )
    email = Effect(
        order.order_id,
        "email.shipped",
        {
            "to_customer": order.customer_id,
            "template": "order_shipped",
            "ref": f"{order.order_id}/email.shipped",
        },
    )
    shipped = Event("order.shipped", order.order_id, {"carrier": message.carrier})
    return Applied(order, (email,), (shipped,))


def _cancel(message: OrderCancelledV1, current: Order) -> Applied:
    order = replace(
        current,
        status=OrderStatus.CANCELLED,
        sequence=_next_sequence(current, message.sequence),
        version=current.version + 1,
        details={**current.details, "cancel_reason": message.reason},
    )
    refund = Effect(
        order.order_id,
        "payment.refund",
        {
            "order_id": order.order_id,
            "amount_cents": order.amount_cents,
            "currency": order.currency,
            "kind": "refund",
        },
    )
    cancelled = Event("order.cancelled", order.order_id, {})
    return Applied(order, (refund,), (cancelled,))


def _next_sequence(current: Order, given: int | None) -> int | None:
    if given is not None:
        return given
    return current.sequence + 1 if current.sequence is not None else None
