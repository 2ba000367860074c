"""Customer directory client (contract §6): `GET {CUSTOMERS}/customers/{id}`."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

import httpx

from service.domain.codes import ErrorCode
from service.errors import DownstreamError
from service.orders.model import CustomerStatus

_MAX_RETRY_AFTER = timedelta(minutes=10)


def retry_after(response: httpx.Response) -> timedelta | None:
    """The `Retry-After` of a response in seconds form, capped; HTTP-date forms are ignored."""
    value = response.headers.get("retry-after", "").strip()
    if not value.isdigit():
        return None
    return min(timedelta(seconds=int(value)), _MAX_RETRY_AFTER)


def transient_status(response: httpx.Response, downstream: str) -> DownstreamError | None:
    """The transient failure a status stands for (429, 5xx), or None. The body is never read."""
    if response.status_code == 429:
        return DownstreamError(ErrorCode.RATE_LIMITED, retry_after=retry_after(response), downstream=downstream)
    if response.status_code >= 500:
        return DownstreamError(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream=downstream)
    return None


def transport_failure(error: httpx.TransportError, downstream: str) -> DownstreamError:
    """Translate an httpx transport error; raise it `from` the original so debug logs keep the cause."""
    code = (
        ErrorCode.DOWNSTREAM_TIMEOUT if isinstance(error, httpx.TimeoutException) else ErrorCode.DOWNSTREAM_UNREACHABLE
    )
    return DownstreamError(code, downstream=downstream)


class CustomersClient:
    """Asks the customer directory whether a customer may place orders."""

    downstream = "customers"

    def __init__(self, http: httpx.AsyncClient, base_url: str | None) -> None:
        self._http = http
        self._base_url = base_url

    @property
    def enabled(self) -> bool:
        """False when `ORDERS_CUSTOMERS_URL` is unset: every customer then counts as active."""
        return self._base_url is not None

    async def status(self, customer_id: str) -> CustomerStatus:
        """The customer's status; raises DownstreamError for transient failures."""
        if self._base_url is None:
            return CustomerStatus.ACTIVE
        url = f"{self._base_url}/customers/{quote(customer_id, safe='')}"
        try:
            response = await self._http.get(url)
        except httpx.TransportError as error:
            raise transport_failure(error, self.downstream) from error
        if response.status_code == 404:
            return CustomerStatus.UNKNOWN
        failure = transient_status(response, self.downstream)
        if failure is not None:
            raise failure
        if response.status_code != 200:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream)
        try:
            status = response.json().get("status")
        except ValueError:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream) from None
        return CustomerStatus.BLOCKED if status == "blocked" else CustomerStatus.ACTIVE
