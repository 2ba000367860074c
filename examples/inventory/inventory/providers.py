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

from inventory.codes import InventoryCode
from inventory.model import Stock
from service.ports import (
    Answer,
    CallOutcome,
    Code,
    Downstream,
    ErrorCode,
    Found,
    LookupOutcome,
    Missing,
    Own,
    Refused,
    Sent,
    api_error,
    call_outcome,
    lookup_failure,
    lookup_outcome,
    path_segment,
    refusal,
)


def _levels(body: object) -> dict[str, int] | None:
    """The stock document's warehouses and their counts, or None when it is not one."""
    levels = body.get("warehouses") if isinstance(body, dict) else None
    if not isinstance(levels, dict):
        return None
    counts = {str(name): count for name, count in levels.items()}
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts.values()):
        return None
    return counts


def _stock_own(answer: Answer, body: Any) -> bool:
    """The stock API's own answers: a stock document, or a 404 with its JSON `error` (a SKU it does not know)."""
    if answer.status_code == 404:
        return api_error(body)
    return answer.status_code == 200 and _levels(body) is not None


class StockClient(Downstream):
    """Asks the stock API what the catalogue knows of a SKU and what each warehouse has."""

    downstream = "stock"

    async def level(self, sku: str) -> Stock:
        """The SKU's stock; raises DownstreamError when the API did not answer as itself (an outage, a
        misconfiguration, its breaker open)."""
        exchange = await self._get(f"/stock/{path_segment(sku)}", _stock_own)
        answer = exchange.own
        if answer is None:
            raise lookup_failure(exchange, self.downstream) from exchange.error
        if answer.status_code == 404:
            return Stock(sku, known=False)
        available = _levels(exchange.body)
        assert available is not None  # (its own answer is a stock document)
        return Stock(sku, known=True, available=available)


def _reference(body: object, field: str) -> str | None:
    """The warehouse's id for what it did: a non-empty text or a number in `body[field]`, else None."""
    value = body.get(field) if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return str(value)


def _call_own(reference: str, refused: int) -> Own:
    """A call's own answers: 200/201 with a JSON document holding its reference, its refusal (`refused`, with the
    API's JSON `error`), or another of the API's own 4xx refusals."""

    def own(answer: Answer, body: Any) -> bool:
        if answer.status_code in (200, 201):
            return _reference(body, reference) is not None
        return (answer.status_code == refused and api_error(body)) or refusal(answer, body)

    return own


def _found_own(reference: str) -> Own:
    """A look-up's own answers: 200 with a JSON document holding the reference, or 404 with the JSON `error`."""

    def own(answer: Answer, body: Any) -> bool:
        if answer.status_code == 404:
            return api_error(body)
        return answer.status_code == 200 and _reference(body, reference) is not None

    return own


class WarehouseClient(Downstream):
    """The warehouse: holds and releases, each idempotent on its `Idempotency-Key`."""

    downstream = "warehouse"

    async def hold(self, idempotency_key: str, body: dict[str, Any]) -> CallOutcome:
        """Hold stock for a reservation; 422 (not enough stock now) is a refusal."""
        return await self._call("/holds", idempotency_key, body, "hold_id", (422, InventoryCode.HOLD_REFUSED))

    async def release(self, idempotency_key: str, body: dict[str, Any]) -> CallOutcome:
        """Release the hold `body["hold_key"]`; 404 (the warehouse holds nothing under that key) is a refusal."""
        return await self._call("/releases", idempotency_key, body, "release_id", (404, InventoryCode.NOTHING_HELD))

    async def find_hold(self, idempotency_key: str) -> LookupOutcome:
        """The hold made under this key, if any."""
        return await self._find("/holds", idempotency_key, "hold_id")

    async def find_release(self, idempotency_key: str) -> LookupOutcome:
        """The release made under this key, if any."""
        return await self._find("/releases", idempotency_key, "release_id")

    async def _call(
        self, path: str, idempotency_key: str, body: dict[str, Any], reference: str, refused: tuple[int, Code]
    ) -> CallOutcome:
        """POST with the key; `refused`: the status that is this call's permanent refusal, and its code."""
        exchange = await self._post(
            path,
            _call_own(reference, refused[0]),
            body,
            target=idempotency_key,
            headers={"Idempotency-Key": idempotency_key},
        )
        answer = exchange.own
        if answer is None:
            outcome = call_outcome(exchange)
            assert outcome is not None
            return outcome
        if answer.status_code == refused[0]:
            return Refused(refused[1])
        if answer.status_code not in (200, 201):
            return Refused(ErrorCode.PROVIDER_REJECTED)
        made = _reference(exchange.body, reference)
        assert made is not None  # (its own answer has one)
        return Sent(made)

    async def _find(self, path: str, idempotency_key: str, reference: str) -> LookupOutcome:
        """GET by the key: found (with its reference), missing (404), or the look-up failed."""
        exchange = await self._get(path, _found_own(reference), params={"idempotency_key": idempotency_key})
        answer = exchange.own
        if answer is None:
            failed = lookup_outcome(exchange)
            assert failed is not None
            return failed
        if answer.status_code == 404:
            return Missing()
        found = _reference(exchange.body, reference)
        assert found is not None  # (its own answer has one)
        return Found(found)
