"""Inventory rules: what a message does to a reservation, which effects and events it causes.

Pure functions over frozen values; the core's processor locks the current reservation, calls `apply` through
the handler, and writes the result. The stock a reserve needs is looked up before the round's transaction
(the handler's `look_up`) and arrives here as a `Stock` value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from inventory.codes import InventoryCode
from inventory.messages import InventoryMessage, StockReleasedV1, StockReservedV1
from service.ports import Rejected

HOLD = "warehouse.hold"  # the effect that holds the stock at the warehouse
UNHOLD = "warehouse.unhold"  # the effect that gives it back; it waits for the hold (EffectSpec.waits_for)


class Status(StrEnum):
    """Where a reservation is in its life."""

    RESERVED = "reserved"
    RELEASED = "released"


@dataclass(frozen=True)
class Stock:
    """What the stock API says of one SKU: whether the catalogue knows it, and what each warehouse has."""

    sku: str
    known: bool
    available: Mapping[str, int] = field(default_factory=dict)

    def at(self, warehouse: str) -> int:
        """The quantity the warehouse has (0 for a warehouse that does not stock the SKU)."""
        return self.available.get(warehouse, 0)


@dataclass(frozen=True)
class Reservation:
    """The reservation row as the domain sees it."""

    reservation_id: str
    sku: str
    quantity: int
    warehouse: str
    status: Status
    sequence: int | None = 1
    # 1 when reserved, one more with every change (the hold's outcomes too), assigned under the row lock; events
    # carry it as `reservationVersion`.
    version: int = 1

    @property
    def aggregate_id(self) -> str:
        """The reservation id: the aggregate the core's round writes."""
        return self.reservation_id


@dataclass(frozen=True)
class Effect:
    """An external call to make later, identified by `<reservation_id>/<kind>`."""

    reservation_id: str
    kind: str
    payload: dict[str, Any]

    @property
    def aggregate_id(self) -> str:
        """The reservation the effect belongs to (the ledger's `aggregate_id`)."""
        return self.reservation_id

    @property
    def idempotency_key(self) -> str:
        """The warehouse's idempotency key."""
        return f"{self.reservation_id}/{self.kind}"


@dataclass(frozen=True)
class Event:
    """A domain event for `<source>.events`."""

    type: str
    reservation_id: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Applied:
    """The message changed the reservation."""

    aggregate: Reservation
    effects: tuple[Effect, ...]
    events: tuple[Event, ...]


def apply(message: InventoryMessage, current: Reservation | None, stock: Stock | None) -> Applied | Rejected:
    """Apply one message to the current state of its reservation; `stock` is None when it was not looked up (the
    stock API is not configured: the warehouse's hold is then the only check)."""
    if isinstance(message, StockReservedV1):
        return _reserve(message, current, stock)
    return _release(message, current)


def _reserve(message: StockReservedV1, current: Reservation | None, stock: Stock | None) -> Applied | Rejected:
    if current is not None:
        return Rejected(InventoryCode.RESERVATION_EXISTS)
    if stock is not None and not stock.known:
        return Rejected(InventoryCode.UNKNOWN_SKU)
    if stock is not None and stock.at(message.warehouse) < message.quantity:
        return Rejected(InventoryCode.INSUFFICIENT_STOCK)
    reservation = Reservation(
        reservation_id=message.reservation_id,
        sku=message.sku,
        quantity=message.quantity,
        warehouse=message.warehouse,
        status=Status.RESERVED,
    )
    hold = Effect(
        reservation.reservation_id,
        HOLD,
        {
            "reservation_id": reservation.reservation_id,
            "sku": reservation.sku,
            "quantity": reservation.quantity,
            "warehouse": reservation.warehouse,
        },
    )
    accepted = Event(
        "reservation.accepted",
        reservation.reservation_id,
        {"sku": reservation.sku, "quantity": reservation.quantity, "warehouse": reservation.warehouse},
    )
    return Applied(reservation, (hold,), (accepted,))


def _release(message: StockReleasedV1, current: Reservation | None) -> Applied | Rejected:
    if current is None:
        return Rejected(InventoryCode.RESERVATION_NOT_FOUND)
    if current.status is Status.RELEASED:
        return Rejected(InventoryCode.ALREADY_RELEASED)
    reservation = replace(
        current,
        status=Status.RELEASED,
        sequence=_next_sequence(current, message.sequence),
        version=current.version + 1,
    )
    # The warehouse knows the hold by its idempotency key: the release names it, whether or not our side saw
    # the hold's answer.
    unhold = Effect(
        reservation.reservation_id,
        UNHOLD,
        {
            "reservation_id": reservation.reservation_id,
            "hold_key": f"{reservation.reservation_id}/{HOLD}",
            "warehouse": reservation.warehouse,
        },
    )
    released = Event("reservation.released", reservation.reservation_id, {"reason": message.reason})
    return Applied(reservation, (unhold,), (released,))


def _next_sequence(current: Reservation, given: int | None) -> int | None:
    if given is not None:
        return given
    return current.sequence + 1 if current.sequence is not None else None
