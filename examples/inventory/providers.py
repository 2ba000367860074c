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

from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx

from examples.inventory.codes import InventoryCode
from examples.inventory.model import Stock
from service.domain.codes import Code, ErrorCode
from service.errors import DownstreamError
from service.policy.effects import (
    CallOutcome,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    NotSent,
    Refused,
    Sent,
    Unknown,
)

_MAX_RETRY_AFTER = timedelta(minutes=10)


def retry_after(response: httpx.Response) -> timedelta | None:
    """The `Retry-After` of a response in seconds form, capped; HTTP-date forms are ignored."""
    value = response.headers.get("retry-after", "").strip()
    return min(timedelta(seconds=int(value)), _MAX_RETRY_AFTER) if value.isdigit() else None


class _Client:
    """A downstream at a configurable base URL; unset (None) disables its calls."""

    def __init__(self, http: httpx.AsyncClient, base_url: str | None) -> None:
        self._http = http
        self._base_url = base_url

    @property
    def enabled(self) -> bool:
        """False when the downstream's URL is unset."""
        return self._base_url is not None


class StockClient(_Client):
    """Asks the stock API what the catalogue knows of a SKU and what each warehouse has."""

    downstream = "stock"

    async def level(self, sku: str) -> Stock:
        """The SKU's stock; raises DownstreamError (a transient record failure) when it cannot be had now."""
        try:
            response = await self._http.get(f"{self._base_url}/stock/{quote(sku, safe='')}")
        except httpx.TransportError as error:
            timed_out = isinstance(error, httpx.TimeoutException)
            code = ErrorCode.DOWNSTREAM_TIMEOUT if timed_out else ErrorCode.DOWNSTREAM_UNREACHABLE
            raise DownstreamError(code, downstream=self.downstream) from error
        if response.status_code == 404:
            return Stock(sku, known=False)
        if response.status_code == 429:
            raise DownstreamError(ErrorCode.RATE_LIMITED, retry_after=retry_after(response), downstream=self.downstream)
        if response.status_code >= 500:
            raise DownstreamError(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream=self.downstream)
        if response.status_code != 200:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream)
        try:
            levels = response.json()["warehouses"]
            available = {str(name): int(count) for name, count in levels.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream) from None
        return Stock(sku, known=True, available=available)


class WarehouseClient(_Client):
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
        except httpx.TransportError as error:
            return _transport(error)
        status = response.status_code
        if status in (200, 201):
            try:
                return Sent(str(response.json()[reference]))
            except (ValueError, KeyError, TypeError):
                return Unknown(ErrorCode.UNEXPECTED_ERROR)  # it did something we cannot name: a look-up decides
        if status == refusal[0]:
            return Refused(refusal[1])
        if status in (401, 403):
            return NotSent(ErrorCode.PROVIDER_UNAUTHORIZED)
        if status == 409:
            return Unknown(ErrorCode.PROVIDER_IN_PROGRESS)
        if status == 429:
            return NotSent(ErrorCode.RATE_LIMITED, retry_after(response))
        if status >= 500:
            return NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)
        return Refused(ErrorCode.PROVIDER_REJECTED)

    async def _find(self, path: str, idempotency_key: str, reference: str) -> LookupOutcome:
        """GET by the key: found (with its reference), missing (404), or the look-up failed."""
        try:
            response = await self._http.get(f"{self._base_url}{path}", params={"idempotency_key": idempotency_key})
        except httpx.TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code == 404:
            return Missing()
        if response.status_code != 200:
            code = ErrorCode.RATE_LIMITED if response.status_code == 429 else ErrorCode.DOWNSTREAM_UNAVAILABLE
            return LookupFailed(code)
        try:
            return Found(str(response.json()[reference]))
        except (ValueError, KeyError, TypeError):
            return LookupFailed(ErrorCode.UNEXPECTED_ERROR)


def _transport(error: httpx.TransportError) -> CallOutcome:
    """Whether a failed call may have reached the warehouse: not when the connection was never made."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
    if isinstance(error, httpx.TimeoutException):
        return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
    return Unknown(ErrorCode.DOWNSTREAM_UNREACHABLE)
