"""Payment and email provider clients (contract §6). Answers become CallOutcome / LookupOutcome values.

The one distinction that matters: did the provider possibly act? A refused connection did not; a timeout
while waiting for the answer, or a connection cut mid-request, may have — that effect is `uncertain` and only
a look-up can tell.
"""

from __future__ import annotations

from typing import Any

import httpx

from service.domain.codes import ErrorCode
from service.orders.codes import OrderCode
from service.orders.customers import retry_after
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


def _transport(error: httpx.TransportError) -> CallOutcome:
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
    if isinstance(error, httpx.TimeoutException):
        return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
    return Unknown(ErrorCode.DOWNSTREAM_UNREACHABLE)


def _answer(response: httpx.Response, reference_field: str) -> CallOutcome:
    status = response.status_code
    if status in (200, 201, 202):
        try:
            return Sent(str(response.json()[reference_field]))
        except (ValueError, KeyError, TypeError):
            # It did something, but we cannot tell what: let a look-up decide.
            return Unknown(ErrorCode.UNEXPECTED_ERROR)
    if status == 402:
        return Refused(OrderCode.PAYMENT_DECLINED)
    if status in (401, 403):
        return NotSent(ErrorCode.PROVIDER_UNAUTHORIZED)
    if status == 409:
        return Unknown(ErrorCode.PROVIDER_IN_PROGRESS)
    if status == 429:
        return NotSent(ErrorCode.RATE_LIMITED, retry_after(response))
    if status >= 500:
        return NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)
    return Refused(ErrorCode.PROVIDER_REJECTED)


def _lookup_failure(response: httpx.Response) -> LookupFailed:
    code = ErrorCode.RATE_LIMITED if response.status_code == 429 else ErrorCode.DOWNSTREAM_UNAVAILABLE
    return LookupFailed(code)


class _Provider:
    """A downstream reached over HTTP at a configurable base URL; unset disables its calls."""

    def __init__(self, http: httpx.AsyncClient, base_url: str | None) -> None:
        self._http = http
        self._base_url = base_url

    @property
    def enabled(self) -> bool:
        """False when the provider's ORDERS_*_URL is unset."""
        return self._base_url is not None


class PaymentsClient(_Provider):
    """The idempotent payment provider: the same Idempotency-Key always returns the same payment."""

    async def pay(self, idempotency_key: str, body: dict[str, Any]) -> CallOutcome:
        """Capture or refund (`body["kind"]`), identified by the effect's idempotency key."""
        try:
            response = await self._http.post(
                f"{self._base_url}/payments", json=body, headers={"Idempotency-Key": idempotency_key}
            )
        except httpx.TransportError as error:
            return _transport(error)
        return _answer(response, "payment_id")

    async def find(self, idempotency_key: str) -> LookupOutcome:
        """Look a payment up by its idempotency key."""
        try:
            response = await self._http.get(f"{self._base_url}/payments", params={"idempotency_key": idempotency_key})
        except httpx.TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code == 404:
            return Missing()
        if response.status_code != 200:
            return _lookup_failure(response)
        try:
            return Found(str(response.json()["payment_id"]))
        except (ValueError, KeyError, TypeError):
            return LookupFailed(ErrorCode.UNEXPECTED_ERROR)


class EmailsClient(_Provider):
    """The email provider; it is NOT idempotent, so a resend is only ever made after a look-up by ref."""

    async def send(self, body: dict[str, Any]) -> CallOutcome:
        """Send one email; `body["ref"]` identifies it for look-ups."""
        try:
            response = await self._http.post(f"{self._base_url}/emails", json=body)
        except httpx.TransportError as error:
            return _transport(error)
        return _answer(response, "email_id")

    async def find(self, ref: str) -> LookupOutcome:
        """Look up the emails sent with this ref."""
        try:
            response = await self._http.get(f"{self._base_url}/emails", params={"ref": ref})
        except httpx.TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code != 200:
            return _lookup_failure(response)
        try:
            sent = response.json()
            return Found(str(sent[0]["email_id"])) if sent else Missing()
        except (ValueError, KeyError, TypeError, IndexError):
            return LookupFailed(ErrorCode.UNEXPECTED_ERROR)
