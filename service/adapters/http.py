"""HTTP to downstreams, and what an answer means to the core's failure state machine, for any domain's clients.

One `HttpClient` per process (aiohttp, keep-alive connections) serves every downstream. It hands back an `Answer`
(status, headers, body) or raises a `TransportError` that says how far the exchange got: `ConnectFailed` (the
request never left: nothing can have happened), `TimedOut` or `Cut` (it may have been acted on). The driver's own
exceptions stop here.

Two kinds of call reach a downstream. A look-up before the transaction (a record's outside context) fails
transiently as a `DownstreamError`, retried like any record failure. An effect's call ends as a `CallOutcome`
(service/policy/effects.py): `NotSent` when the provider surely did not act, `Unknown` when it may have, so that
a look-up decides before any repeat. A domain's client keeps its own success and refusal statuses and hands the
rest to these functions, so that every domain reads 429, 5xx, 401/403, 409 and transport errors the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from yarl import URL

from service.domain.codes import ErrorCode
from service.errors import DownstreamError
from service.policy.effects import CallOutcome, LookupFailed, NotSent, Refused, Unknown

MAX_RETRY_AFTER = timedelta(minutes=10)  # a longer Retry-After would park a record or an effect for too long
_LONGEST = int(MAX_RETRY_AFTER.total_seconds())
_SECONDS = re.compile(r"[0-9]+", re.ASCII)
_JSON = {"Content-Type": "application/json"}
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Answer:
    """A downstream's whole answer: its status, headers (case-insensitive) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not. A leading UTF-8 byte order mark is skipped, as JSON
        readers may (RFC 8259 §8.1) and httpx did: orjson refuses it."""
        return orjson.loads(self.content.removeprefix(_BOM))


class TransportError(Exception):
    """No answer came: the connection failed, timed out or was cut."""


class ConnectFailed(TransportError):
    """The request never left: no connection could be had (refused, unresolvable, or none free in time)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class TimedOut(TransportError):
    """The request was sent and no answer came in time: the downstream may have acted on it."""


class Cut(TransportError):
    """The connection broke after the request was sent, or the answer could not be read: it may have acted."""


class HttpClient:
    """The process's one HTTP client: keep-alive connections, the same timeout for connecting and each read."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    @staticmethod
    def open(timeout: timedelta, connections: int) -> HttpClient:
        """A client with at most `connections` open at once (call inside the event loop; `close` it)."""
        seconds = timeout.total_seconds()
        return HttpClient(
            aiohttp.ClientSession(
                # `connect` also bounds the wait for a free connection, so a full pool ends as ConnectFailed.
                timeout=aiohttp.ClientTimeout(total=None, connect=seconds, sock_connect=seconds, sock_read=seconds),
                # Shorter than the few seconds after which many providers close an idle connection: a POST on a
                # connection the provider has just closed would end Unknown (it may have been read) for nothing.
                connector=aiohttp.TCPConnector(limit=connections, limit_per_host=0, keepalive_timeout=4),
            )
        )

    async def close(self) -> None:
        """Close every connection."""
        await self._session.close()

    async def get(self, url: str, *, params: Mapping[str, str] | None = None) -> Answer:
        """GET `url` (already percent-encoded) with these query parameters."""
        return await self._request("GET", url, params=params)

    async def post(self, url: str, *, json: Any, headers: Mapping[str, str] | None = None) -> Answer:
        """POST a JSON body to `url` (already percent-encoded)."""
        return await self._request("POST", url, data=orjson.dumps(json), headers={**_JSON, **(headers or {})})

    async def _request(self, method: str, url: str, **options: Any) -> Answer:
        try:
            # encoded=True: the caller quoted each path segment; requoting would turn %2F back into a slash.
            async with self._session.request(method, URL(url, encoded=True), allow_redirects=False, **options) as got:
                return Answer(got.status, got.headers, await got.read())
        except aiohttp.ConnectionTimeoutError as error:
            raise ConnectFailed(type(error).__name__, timed_out=True) from error
        except aiohttp.ClientConnectorError as error:
            raise ConnectFailed(type(error).__name__, timed_out=False) from error
        except (aiohttp.ServerTimeoutError, TimeoutError) as error:
            raise TimedOut(type(error).__name__) from error
        except aiohttp.ClientError as error:
            raise Cut(type(error).__name__) from error
        except ValueError as error:
            # aiohttp refuses to write a header or URL it cannot send (a line break in an id) before a byte leaves.
            raise ConnectFailed(type(error).__name__, timed_out=False) from error


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


def lookup_status(response: Answer) -> LookupFailed:
    """A provider look-up's failed answer (neither found nor missing): the effect stays uncertain."""
    return LookupFailed(ErrorCode.RATE_LIMITED if response.status_code == 429 else ErrorCode.DOWNSTREAM_UNAVAILABLE)
