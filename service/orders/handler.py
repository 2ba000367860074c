"""The order domain's handler (service/ports.py `Handler`): order messages, the customer look-up for a new
order, the order rules, and the documents of order events and rejections."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.orders import model
from service.orders import store as orders
from service.orders.customers import CustomersClient
from service.orders.messages import PLACEMENTS, OrderMessage, OrderPlacedV1, decode, sequence_of
from service.ports import Code, Coordinates, DecodeFailure, Rejected, iso


class OrderHandler:
    """Orders: placed, shipped, cancelled (contract §5)."""

    def __init__(self, customers: CustomersClient, known_tenants: Iterable[str]) -> None:
        self._customers = customers
        self._tenants = frozenset(known_tenants)
        self._contexts = {status: model.Context(self._tenants, status) for status in model.CustomerStatus}
        self._active = self._contexts[model.CustomerStatus.ACTIVE]  # nothing looked up: every customer active

    rows = orders.ROWS

    @property
    def downstream(self) -> str | None:
        """The customer directory, when ORDERS_CUSTOMERS_URL is set."""
        return self._customers.downstream if self._customers.enabled else None

    def decode(self, value: bytes | None) -> OrderMessage | DecodeFailure:
        """An order message, or why the bytes are not one."""
        return decode(value)

    def creates(self, message: OrderMessage) -> bool:
        """`order.placed.*` creates its order."""
        return type(message) in PLACEMENTS

    def sequence(self, message: OrderMessage) -> int | None:
        """The message's `sequence`, when its schema has one."""
        return sequence_of(message)

    def context_key(self, message: OrderMessage, known: Collection[str]) -> str | None:
        """The customer of a new order of a known tenant (an unknown tenant is rejected without asking)."""
        if (
            isinstance(message, OrderPlacedV1)
            and message.order_id not in known
            and message.tenant in self._tenants
            and self._customers.enabled
        ):
            return message.customer_id
        return None

    async def look_up(self, key: str) -> model.CustomerStatus:
        """The customer's status in the directory."""
        return await self._customers.status(key)

    def apply(
        self, message: OrderMessage, current: model.Order | None, looked_up: Mapping[str, model.CustomerStatus]
    ) -> model.Applied | Rejected:
        """The order rules, with the customer's status when it was looked up (active when it was not asked)."""
        context = self._contexts[_customer_status(looked_up, message)] if looked_up else self._active
        return model.apply(message, current, context)

    def event(self, event: Any, version: int, message_id: str) -> tuple[str, str, dict[str, Any]]:
        """An order event: `orderId`, `orderVersion` (the order's version after the change), `messageId`."""
        return event.type, event.order_id, event_document(event, version, message_id)

    def rejection(
        self,
        message_id: str,
        aggregate_id: str | None,
        code: Code,
        schema: str | None,
        origin: Coordinates,
        at: datetime,
    ) -> tuple[str, dict[str, Any]]:
        """An `order.rejected` event."""
        document = {
            "type": "order.rejected",
            "orderId": aggregate_id,
            "messageId": message_id,
            "errorCode": code.value,
            "payloadSchema": schema,
            "source": {"topic": origin.topic, "partition": origin.partition, "offset": origin.offset},
            "rejectedAt": iso(at),
        }
        return "order.rejected", document

    async def lock(self, connection: AsyncConnection, ids: Iterable[str]) -> dict[str, model.Order]:
        """The existing orders, locked."""
        return await orders.lock(connection, ids)


def event_document(event: model.Event, version: int, message_id: str) -> dict[str, Any]:
    """The document of an order event: `orderId`, `orderVersion` (the order's version after the change),
    `messageId`, and the event's own fields."""
    return {
        "type": event.type,
        "orderId": event.order_id,
        "orderVersion": version,
        "messageId": message_id,
        **event.payload,
    }


def _customer_status(looked_up: Mapping[str, model.CustomerStatus], message: OrderMessage) -> model.CustomerStatus:
    if isinstance(message, OrderPlacedV1):
        return looked_up.get(message.customer_id, model.CustomerStatus.ACTIVE)
    return model.CustomerStatus.ACTIVE
