"""The inventory domain's HTTP clients: the stock API asked before applying a reserve, and the warehouse that
holds and releases stock.

Stock: `GET {STOCK}/stock/{sku}` → 200 `{"sku", "warehouses": {warehouse: available}}`, 404 for a SKU the
catalogue does not know; 429 (with `Retry-After`), 5xx, timeouts and connection errors are transient (the core
retries the record). Warehouse (idempotent): `POST {WAREHOUSE}/holds` and `POST {WAREHOUSE}/releases` with an
`Idempotency-Key` header; the same key answers the same result; `GET .../holds?idempotency_key=K` (and
releases) → 200 or 404. The answers become the core's CallOutcome / LookupOutcome values: did the warehouse
possibly act? A refused connection did not; a timeout after sending may have, and only a look-up can tell.
"""

from __future__ import annotations

from typing import Any

from examples.inventory.codes import InventoryCode
from examples.inventory.model import Stock
from service.adapters.http import (
    Downstream,
    TransportError,
    call_status,
    call_transport,
    lookup_status,
    path_segment,
    transient_status,
    transport_failure,
)
from service.domain.codes import Code, ErrorCode
from service.errors import DownstreamError
from service.policy.effects import (
    CallOutcome,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    Refused,
    Sent,
    Unknown,
)


class StockClient(Downstream):
    """Asks the stock API what the catalogue knows of a SKU and what each warehouse has."""

    downstream = "stock"

    async def level(self, sku: str) -> Stock:
        """The SKU's stock; raises DownstreamError (a transient record failure) when it cannot be had now."""
        try:
            response = await self._http.get(f"{self._base_url}/stock/{path_segment(sku)}")
        except TransportError as error:
            raise transport_failure(error, self.downstream) from error
        if response.status_code == 404:
            return Stock(sku, known=False)
        failure = transient_status(response, self.downstream)
        if failure is not None:
            raise failure
        if response.status_code != 200:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream)
        try:
            levels = response.json()["warehouses"]
            available = {str(name): int(count) for name, count in levels.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream) from None
        return Stock(sku, known=True, available=available)


class WarehouseClient(Downstream):
    """The warehouse: holds and releases, each idempotent on its `Idempotency-Key`."""

    async def hold(self, idempotency_key: str, body: dict[str, Any]) -> CallOutcome:
        """Hold stock for a reservation; 422 (not enough stock now) is a refusal."""
        return await self._post("/holds", idempotency_key, body, "hold_id", (422, InventoryCode.HOLD_REFUSED))

    async def release(self, idempotency_key: str, body: dict[str, Any]) -> CallOutcome:
        """Release the hold `body["hold_key"]`; 404 (the warehouse holds nothing under that key) is a refusal."""
        return await self._post("/releases", idempotency_key, body, "release_id", (404, InventoryCode.NOTHING_HELD))

    async def find_hold(self, idempotency_key: str) -> LookupOutcome:
        """The hold made under this key, if any."""
        return await self._find("/holds", idempotency_key, "hold_id")

    async def find_release(self, idempotency_key: str) -> LookupOutcome:
        """The release made under this key, if any."""
        return await self._find("/releases", idempotency_key, "release_id")

    async def _post(
        self, path: str, idempotency_key: str, body: dict[str, Any], reference: str, refusal: tuple[int, Code]
    ) -> CallOutcome:
        """POST with the key; `refusal`: the status that is this call's permanent refusal, and its code."""
        try:
            response = await self._http.post(
                f"{self._base_url}{path}", json=body, headers={"Idempotency-Key": idempotency_key}
            )
        except TransportError as error:
            return call_transport(error)
        status = response.status_code
        if status in (200, 201):
            try:
                return Sent(str(response.json()[reference]))
            except (ValueError, KeyError, TypeError):
                return Unknown(ErrorCode.UNEXPECTED_ERROR)  # it did something we cannot name: a look-up decides
        if status == refusal[0]:
            return Refused(refusal[1])
        return call_status(response)

    async def _find(self, path: str, idempotency_key: str, reference: str) -> LookupOutcome:
        """GET by the key: found (with its reference), missing (404), or the look-up failed."""
        try:
            response = await self._http.get(f"{self._base_url}{path}", params={"idempotency_key": idempotency_key})
        except TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code == 404:
            return Missing()
        if response.status_code != 200:
            return lookup_status(response)
        try:
            return Found(str(response.json()[reference]))
        except (ValueError, KeyError, TypeError):
            return LookupFailed(ErrorCode.UNEXPECTED_ERROR)
