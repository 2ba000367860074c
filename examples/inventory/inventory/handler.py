"""The inventory domain's handler (`service.ports.Handler`): inventory messages, the stock look-up before a
reserve, the reservation rules, and the documents of reservation events and rejections."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from inventory import model
from inventory import store as reservations
from inventory.messages import StockReservedV1, decode, sequence_of
from inventory.providers import StockClient
from service.ports import Code, Coordinates, Rejected, iso


class InventoryHandler:
    """Reservations: reserved, released."""

    rows = reservations.ROWS

    def __init__(self, stock: StockClient) -> None:
        self._stock = stock

    @property
    def downstream(self) -> str | None:
        """The stock API, when INVENTORY_STOCK_URL is set."""
        return self._stock.downstream if self._stock.enabled else None

    def decode(self, value: bytes | None) -> Any:
        """An inventory message, or why the bytes are not one."""
        return decode(value)

    def creates(self, message: Any) -> bool:
        """`stock.reserved.v1` creates its reservation."""
        return isinstance(message, StockReservedV1)

    def sequence(self, message: Any) -> int | None:
        """The message's `sequence` (a reserve is 1)."""
        return sequence_of(message)

    def context_key(self, message: Any, known: Collection[str]) -> str | None:
        """The SKU of a new reservation (one that exists already is rejected without asking)."""
        if isinstance(message, StockReservedV1) and message.reservation_id not in known and self._stock.enabled:
            return message.sku
        return None

    async def look_up(self, key: str) -> Any:
        """The SKU's stock."""
        return await self._stock.level(key)

    def apply(self, message: Any, current: Any | None, looked_up: Mapping[str, Any]) -> model.Applied | Rejected:
        """The reservation rules, with the SKU's stock when it was looked up."""
        stock = looked_up.get(message.sku) if isinstance(message, StockReservedV1) else None
        return model.apply(message, current, stock)

    def event(self, event: Any, version: int, message_id: str) -> tuple[str, str, dict[str, Any]]:
        """A reservation event: `reservationId`, `reservationVersion` (after the change), `messageId`."""
        document = {
            "type": event.type,
            "reservationId": event.reservation_id,
            "reservationVersion": version,
            "messageId": message_id,
            **event.payload,
        }
        return event.type, event.reservation_id, document

    def rejection(
        self,
        message_id: str,
        aggregate_id: str | None,
        code: Code,
        schema: str | None,
        origin: Coordinates,
        at: datetime,
    ) -> tuple[str, dict[str, Any]]:
        """A `reservation.rejected` event."""
        document = {
            "type": "reservation.rejected",
            "reservationId": aggregate_id,
            "messageId": message_id,
            "errorCode": code.value,
            "payloadSchema": schema,
            "source": {"topic": origin.topic, "partition": origin.partition, "offset": origin.offset},
            "rejectedAt": iso(at),
        }
        return "reservation.rejected", document

    async def lock(self, connection: AsyncConnection, ids: Iterable[str]) -> dict[str, Any]:
        """The existing reservations, locked."""
        return await reservations.lock(connection, ids)
