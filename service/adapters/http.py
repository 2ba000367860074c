"""HTTP to downstreams, and what an answer means to the core's failure state machine, for any domain's clients.

One `HttpClient` per process (keep-alive connections, service/adapters/http1.py) serves every downstream. It hands
back an `Answer` (status, headers, body) or raises a `TransportError` that says how far the exchange got:
`ConnectFailed` (the request never left: nothing can have happened), `TimedOut` or `Cut` (it may have been acted
on). The connections' own exceptions stop here.

Two kinds of call reach a downstream. A look-up before the transaction (a record's outside context) fails
transiently as a `DownstreamError`, retried like any record failure. An effect's call ends as a `CallOutcome`
(service/policy/effects.py): `NotSent` when the provider surely did not act, `Unknown` when it may have, so that
a look-up decides before any repeat. A domain's client keeps its own success and refusal statuses and hands the
rest to these functions, so that every domain reads 429, 5xx, 401/403, 409 and transport errors the same way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import orjson

from service.adapters.http1 import Answer, ConnectFailed, Cut, Origin, Pool, TimedOut, TransportError
from service.domain.codes import ErrorCode
from service.errors import DownstreamError
from service.policy.effects import CallOutcome, LookupFailed, NotSent, Refused, Unknown

__all__ = ["Answer", "ConnectFailed", "Cut", "Downstream", "HttpClient", "TimedOut", "TransportError"]

MAX_RETRY_AFTER = timedelta(minutes=10)  # a longer Retry-After would park a record or an effect for too long
# Shorter than the few seconds after which many providers close an idle connection: a POST on a connection the
# provider has just closed would end Unknown (it may have been read) for nothing.
KEEPALIVE_SECONDS: Final = 4.0
_LONGEST = int(MAX_RETRY_AFTER.total_seconds())
_SECONDS = re.compile(r"[0-9]+", re.ASCII)
# What a request line's target and a header may hold: visible ASCII, and for a header's value spaces and tabs too.
_TARGET = re.compile(r"[!-~]+", re.ASCII)
_UNSAFE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# An absolute URL's scheme and authority: up to the first "/", "?" or "#" after "//" (RFC 3986 §3.2).
_AUTHORITY = re.compile(r"[^:/?#]+://[^/?#]*")


class HttpClient:
    """The process's one HTTP client: keep-alive connections, the same timeout for connecting and each read."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @staticmethod
    def open(timeout: timedelta, connections: int) -> HttpClient:
        """A client with at most `connections` exchanges at once (call inside the event loop; `close` it). A full
        pool's wait is bounded by the timeout too, and ends as ConnectFailed."""
        return HttpClient(Pool(timeout.total_seconds(), connections, KEEPALIVE_SECONDS))

    async def close(self) -> None:
        """Close every connection."""
        await self._pool.close()

    async def get(self, url: str, *, params: Mapping[str, str] | None = None) -> Answer:
        """GET `url` (already percent-encoded) with these query parameters."""
        return await self._request("GET", url, params, b"", {})

    async def post(self, url: str, *, json: Any, headers: Mapping[str, str] | None = None) -> Answer:
        """POST a JSON body to `url` (already percent-encoded)."""
        return await self._request("POST", url, None, orjson.dumps(json), headers or {})

    async def _request(
        self, method: str, url: str, params: Mapping[str, str] | None, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        # A request that cannot be written (a line break in an id, a lone surrogate in a parameter) fails before a
        # byte leaves.
        try:
            origin, host, target = _split(url)
            if params:
                target = f"{target}{'&' if '?' in target else '?'}{urlencode(params, quote_via=quote, safe='')}"
            request = _request_bytes(method, host, target, body, headers)
        except ValueError as error:
            raise ConnectFailed(f"{type(error).__name__}: {error}", timed_out=False) from error
        return await self._pool.exchange(origin, request)


_OWS = " \t"


def _request_bytes(method: str, host: str, target: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    if not _TARGET.fullmatch(target):
        raise ValueError(f"the request target {target[:100]!r} is not percent-encoded")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\nAccept-Encoding: identity\r\n"]
    if method == "POST":
        lines.append(f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    for name, value in headers.items():
        if not _TARGET.fullmatch(name) or ":" in name or _UNSAFE_VALUE.search(value):
            raise ValueError(f"the header {name[:100]!r} cannot be written")
        # Spaces and tabs around a value are not part of it (RFC 9110, 5.5), and llhttp keeps a trailing tab: what
        # every server reads is the value without them.
        lines.append(f"{name}: {value.strip(_OWS)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode() + body


def _split(url: str) -> tuple[Origin, str, str]:
    """The origin, the Host header and the request target of an absolute http(s) URL (without its fragment)."""
    url = url.partition("#")[0]
    match = _AUTHORITY.match(url)
    if match is None:
        raise ValueError(f"{url[:100]!r} is not an absolute URL")
    origin, host = _origin(match.group())
    target = url[match.end() :]
    return origin, host, target if target.startswith("/") else f"/{target}"


@functools.lru_cache(maxsize=64)  # the downstreams' base URLs come from settings: a handful
def _origin(prefix: str) -> tuple[Origin, str]:
    parts = urlsplit(prefix)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        raise ValueError(f"{prefix!r} is not an http(s) URL without credentials")
    port = parts.port or _DEFAULT_PORTS[parts.scheme]  # ValueError when it is not a port
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    header = host if port == _DEFAULT_PORTS[parts.scheme] else f"{host}:{port}"
    return Origin(parts.scheme == "https", parts.hostname, port), header


class Downstream:
    """A downstream at a configurable base URL, sharing the process's HTTP client; unset disables its calls."""

    def __init__(self, http: HttpClient, base_url: str | None) -> None:
        self._http = http
        self._base_url = base_url

    @property
    def enabled(self) -> bool:
        """False when the downstream's URL setting is unset."""
        return self._base_url is not None


def retry_after(response: Answer) -> timedelta | None:
    """The `Retry-After` of a response in seconds form, capped; HTTP-date forms (and anything else) are ignored."""
    value = response.headers.get("retry-after", "").strip()
    if not _SECONDS.fullmatch(value):
        return None
    # Capped before it is read: a provider's number of seconds may be any length.
    digits = value.lstrip("0") or "0"
    return timedelta(seconds=min(int(digits) if len(digits) <= 6 else _LONGEST, _LONGEST))


def path_segment(value: str) -> str:
    """`value` as one percent-encoded path segment: every reserved character, and dots too (`..` would be
    resolved as the parent by whatever reads the path)."""
    return quote(value, safe="").replace(".", "%2E")


def transient_status(response: Answer, downstream: str) -> DownstreamError | None:
    """The transient failure a look-up's status stands for (429, 5xx), or None. The body is never read."""
    if response.status_code == 429:
        return DownstreamError(ErrorCode.RATE_LIMITED, retry_after=retry_after(response), downstream=downstream)
    if response.status_code >= 500:
        return DownstreamError(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream=downstream)
    return None


def transport_failure(error: TransportError, downstream: str) -> DownstreamError:
    """A look-up's transport error as a transient failure; raise it `from` the original to keep the cause."""
    timed_out = isinstance(error, TimedOut) or (isinstance(error, ConnectFailed) and error.timed_out)
    return DownstreamError(
        ErrorCode.DOWNSTREAM_TIMEOUT if timed_out else ErrorCode.DOWNSTREAM_UNREACHABLE, downstream=downstream
    )


def call_transport(error: TransportError) -> CallOutcome:
    """An effect call's transport error: not sent when the connection was never made, else unknown."""
    if isinstance(error, ConnectFailed):
        return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
    if isinstance(error, TimedOut):
        return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
    return Unknown(ErrorCode.DOWNSTREAM_UNREACHABLE)


def call_status(response: Answer) -> CallOutcome:
    """An effect call's answer that is neither the domain's success nor its own refusal.

    401/403: our credentials, and 404/405: our URL (a call's endpoint is never missing by the effect's fault): the
    effect waits (no attempt spent); 409: the provider is still working on the same idempotency key, a look-up
    decides; 429, 5xx, and 408 and 425 (the provider did not take the request, or not yet): not sent, try again; any
    other status: refused.
    """
    status = response.status_code
    if status in (401, 403):
        return NotSent(ErrorCode.PROVIDER_UNAUTHORIZED)
    if status in (404, 405):
        return NotSent(ErrorCode.PROVIDER_MISCONFIGURED)
    if status == 409:
        return Unknown(ErrorCode.PROVIDER_IN_PROGRESS)
    if status == 429:
        return NotSent(ErrorCode.RATE_LIMITED, retry_after(response))
    if status >= 500 or status in (408, 425):
        return NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)
    return Refused(ErrorCode.PROVIDER_REJECTED)


def lookup_status(response: Answer) -> LookupFailed:
    """A provider look-up's failed answer (neither found nor missing): the effect stays uncertain."""
    return LookupFailed(ErrorCode.RATE_LIMITED if response.status_code == 429 else ErrorCode.DOWNSTREAM_UNAVAILABLE)
