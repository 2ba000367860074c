"""What an HTTP answer means to the core's failure state machine, for any domain's downstream clients.

Two kinds of call reach a downstream. A look-up before the transaction (a record's outside context) fails
transiently as a `DownstreamError`, retried like any record failure. An effect's call ends as a `CallOutcome`
(service/policy/effects.py): `NotSent` when the provider surely did not act, `Unknown` when it may have, so that
a look-up decides before any repeat. A domain's client keeps its own success and refusal statuses and hands the
rest to these functions, so that every domain reads 429, 5xx, 401/403, 409 and transport errors the same way.
"""

from __future__ import annotations

from datetime import timedelta

import httpx

from service.domain.codes import ErrorCode
from service.errors import DownstreamError
from service.policy.effects import CallOutcome, LookupFailed, NotSent, Refused, Unknown

MAX_RETRY_AFTER = timedelta(minutes=10)  # a longer Retry-After would park a record or an effect for too long


class Downstream:
    """A downstream at a configurable base URL, sharing the process's HTTP client; unset disables its calls."""

    def __init__(self, http: httpx.AsyncClient, base_url: str | None) -> None:
        self._http = http
        self._base_url = base_url

    @property
    def enabled(self) -> bool:
        """False when the downstream's URL setting is unset."""
        return self._base_url is not None


def retry_after(response: httpx.Response) -> timedelta | None:
    """The `Retry-After` of a response in seconds form, capped; HTTP-date forms are ignored."""
    value = response.headers.get("retry-after", "").strip()
    return min(timedelta(seconds=int(value)), MAX_RETRY_AFTER) if value.isdigit() else None


def transient_status(response: httpx.Response, downstream: str) -> DownstreamError | None:
    """The transient failure a look-up's status stands for (429, 5xx), or None. The body is never read."""
    if response.status_code == 429:
        return DownstreamError(ErrorCode.RATE_LIMITED, retry_after=retry_after(response), downstream=downstream)
    if response.status_code >= 500:
        return DownstreamError(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream=downstream)
    return None


def transport_failure(error: httpx.TransportError, downstream: str) -> DownstreamError:
    """A look-up's transport error as a transient failure; raise it `from` the original to keep the cause."""
    timed_out = isinstance(error, httpx.TimeoutException)
    return DownstreamError(
        ErrorCode.DOWNSTREAM_TIMEOUT if timed_out else ErrorCode.DOWNSTREAM_UNREACHABLE, downstream=downstream
    )


def call_transport(error: httpx.TransportError) -> CallOutcome:
    """An effect call's transport error: not sent when the connection was never made, else unknown."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
    if isinstance(error, httpx.TimeoutException):
        return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
    return Unknown(ErrorCode.DOWNSTREAM_UNREACHABLE)


def call_status(response: httpx.Response) -> CallOutcome:
    """An effect call's answer that is neither the domain's success nor its own refusal.

    401/403: our credentials, the effect waits (no attempt spent); 409: the provider is still working on the same
    idempotency key, a look-up decides; 429 and 5xx: not sent, try again; any other status: refused.
    """
    status = response.status_code
    if status in (401, 403):
        return NotSent(ErrorCode.PROVIDER_UNAUTHORIZED)
    if status == 409:
        return Unknown(ErrorCode.PROVIDER_IN_PROGRESS)
    if status == 429:
        return NotSent(ErrorCode.RATE_LIMITED, retry_after(response))
    if status >= 500:
        return NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)
    return Refused(ErrorCode.PROVIDER_REJECTED)


def lookup_status(response: httpx.Response) -> LookupFailed:
    """A provider look-up's failed answer (neither found nor missing): the effect stays uncertain."""
    return LookupFailed(ErrorCode.RATE_LIMITED if response.status_code == 429 else ErrorCode.DOWNSTREAM_UNAVAILABLE)
