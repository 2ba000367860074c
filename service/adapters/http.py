"""HTTP to downstreams for any domain's clients; what an answer means to the core's failure state machine is
service/adapters/answers.py.

One `HttpClient` per process (keep-alive connections, service/adapters/transport.py) serves every downstream. It hands
back an `Answer` (status, headers, body) or raises a `TransportError` that says how far the exchange got:
`ConnectFailed` (the request never left: nothing can have happened), `TimedOut` or `Cut` (it may have been acted
on). The connections' own exceptions stop here.

Every call goes through its downstream's circuit breaker (service/adapters/breakers.py), the process's one per
downstream: `Downstream._get` / `_post` make the call unless the breaker refuses it, and judge the answer
(service/adapters/answers.py, `judge`): an outage (429, 5xx, a transport error), the API's own answer (the domain's
client says what its documents are), or a misconfiguration (any other answer, or a certificate our CA refuses). The
result is an `Exchange`, which says whether a failure is charged to its record or effect (only while the breaker is
closed); a domain's client reads the API's own answers and hands the rest to answers.py, so that every domain reads
outages, misconfigurations and transport errors the same way.
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import orjson
from pydantic import SecretStr

from service.adapters.answers import Exchange, Own, document, judge, transport_code
from service.adapters.breakers import Breakers, Guard
from service.adapters.transport import (
    Answer,
    CertificateRefused,
    ConnectFailed,
    Cut,
    Outgoing,
    TimedOut,
    Transport,
    TransportError,
)
from service.codes import ErrorCode
from service.policy.breaker import OK, BreakerPolicy, Outcome, Verdict
from service.policy.propagation import TRACEPARENT
from service.tracing import Tracing, header

__all__ = ["Answer", "ConnectFailed", "Cut", "Downstream", "Exchange", "HttpClient", "TimedOut", "TransportError"]

# Shorter than the few seconds after which many providers close an idle connection: a POST on a connection the
# provider has just closed would end Unknown (it may have been read) for nothing.
KEEPALIVE_SECONDS: Final = 4.0
# What a request line's target and a header may hold: visible ASCII, and for a header's value spaces and tabs too.
_TARGET = re.compile(r"[!-~]+", re.ASCII)
_UNSAFE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_JSON, _FORM = "application/json", "application/x-www-form-urlencoded"
# An absolute URL's scheme and authority: up to the first "/", "?" or "#" after "//" (RFC 3986 §3.2).
_AUTHORITY = re.compile(r"[^:/?#]+://[^/?#]*")


class HttpClient:
    """The process's one HTTP client: keep-alive connections, the same timeout for connecting and each read; while
    tracing, a CLIENT span per request, its context sent in `traceparent`."""

    def __init__(self, transport: Transport, timeout: float, tracing: Tracing | None = None) -> None:
        self._transport = transport
        self._timeout = timeout
        # Off: one check per request.
        self._tracing = tracing if tracing is not None and tracing.enabled else None

    @staticmethod
    def open(timeout: timedelta, connections: int, tracing: Tracing | None = None) -> HttpClient:
        """A client with at most `connections` exchanges at once (call inside the event loop; `close` it). A full
        pool's wait is bounded by the timeout too, and ends as ConnectFailed."""
        from service.adapters.aiohttp_transport import AiohttpTransport  # imported by the processes that call

        return HttpClient(AiohttpTransport(connections, KEEPALIVE_SECONDS), timeout.total_seconds(), tracing)

    async def close(self) -> None:
        """Close every connection."""
        await self._transport.close()

    async def get(
        self,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> Answer:
        """GET `url` (already percent-encoded) with these query parameters (over https, with this TLS context)."""
        return await self._request("GET", url, params, b"", headers or {}, tls=tls)

    async def post(
        self, url: str, *, json: Any, headers: Mapping[str, str] | None = None, tls: ssl.SSLContext | None = None
    ) -> Answer:
        """POST a JSON body to `url` (already percent-encoded; over https, with this TLS context)."""
        return await self._request("POST", url, None, orjson.dumps(json), headers or {}, tls=tls)

    async def post_form(self, url: str, *, form: Mapping[str, str], headers: Mapping[str, str] | None = None) -> Answer:
        """POST a form (`application/x-www-form-urlencoded`: an OAuth 2 token request) to `url`."""
        body = urlencode(form, quote_via=quote, safe="").encode()
        return await self._request("POST", url, None, body, headers or {}, _FORM)

    async def _request(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        body: bytes,
        headers: Mapping[str, str],
        content_type: str = _JSON,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> Answer:
        # A request that cannot be written (a line break in an id, a lone surrogate in a parameter) fails before a
        # byte leaves.
        try:
            url = _checked_url(url)
            if params:
                url = f"{url}{'&' if '?' in url else '?'}{urlencode(params, quote_via=quote, safe='')}"
            outgoing = Outgoing(method, url, _request_headers(method, headers, content_type), body, tls)
        except ValueError as error:
            raise ConnectFailed(f"{type(error).__name__}: {error}", timed_out=False) from error
        if self._tracing is None:
            return await self._transport.send(outgoing, self._timeout)
        return await self._traced(self._tracing, outgoing)

    async def _traced(self, tracing: Tracing, outgoing: Outgoing) -> Answer:
        """Send within the request's CLIENT span (a child of the current span, if there is one), its context in the
        request's `traceparent` (a caller's own is replaced)."""
        _, host, port = _origin(_AUTHORITY.match(outgoing.url).group())  # type: ignore[union-attr]
        with tracing.requesting(outgoing.method, host, port) as span:
            if span is None:
                return await self._transport.send(outgoing, self._timeout)
            headers = {name: value for name, value in outgoing.headers.items() if name.lower() != TRACEPARENT}
            headers[TRACEPARENT] = header(span)
            answer = await self._transport.send(replace(outgoing, headers=headers), self._timeout)
            tracing.answered(span, answer.status_code)
            return answer


_OWS = " \t"


def _request_headers(method: str, headers: Mapping[str, str], content_type: str = _JSON) -> dict[str, str]:
    """The headers a request is sent with (the transport adds Host and Content-Length); ValueError for one that
    cannot be written as it is."""
    written = {"Accept": "*/*", "Accept-Encoding": "identity"}
    if method == "POST":
        written["Content-Type"] = content_type
    for name, value in headers.items():
        if not _TARGET.fullmatch(name) or ":" in name or _UNSAFE_VALUE.search(value):
            raise ValueError(f"the header {name[:100]!r} cannot be written")
        # Spaces and tabs around a value are not part of it (RFC 9110, 5.5), and llhttp keeps a trailing tab: what
        # every server reads is the value without them.
        written[name] = value.strip(_OWS)
    return written


def _checked_url(url: str) -> str:
    """An absolute http(s) URL without its fragment, with a path; ValueError for one whose origin or request target
    cannot be written as it is (not percent-encoded, credentials in it)."""
    url = url.partition("#")[0]
    match = _AUTHORITY.match(url)
    if match is None:
        raise ValueError(f"{url[:100]!r} is not an absolute URL")
    _origin(match.group())
    target = url[match.end() :]
    if not target.startswith("/"):
        target = f"/{target}"
    if not _TARGET.fullmatch(target):
        raise ValueError(f"the request target {target[:100]!r} is not percent-encoded")
    return f"{match.group()}{target}"


@functools.lru_cache(maxsize=64)  # the downstreams' base URLs come from settings: a handful
def _origin(prefix: str) -> tuple[bool, str, int]:
    """Whether an absolute URL's scheme and authority are https, and its host and port."""
    if not _TARGET.fullmatch(prefix):
        raise ValueError(f"{prefix[:100]!r} is not ASCII")
    parts = urlsplit(prefix)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        raise ValueError(f"{prefix!r} is not an http(s) URL without credentials")
    port = parts.port or _DEFAULT_PORTS[parts.scheme]  # ValueError when it is not a port
    return parts.scheme == "https", parts.hostname, port


@dataclass(frozen=True)
class Credentials:
    """What a downstream may need to accept our calls (contract §6): a bearer token (a secret), a CA file for its
    certificate, and a client certificate with its key for mutual TLS."""

    token: SecretStr | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @staticmethod
    def of(settings: Any, downstream: str) -> Credentials:
        """A downstream's credentials from its settings `<downstream>_token`, `_ca_file`, `_cert_file`, `_key_file`
        (ORDERS_<DOWNSTREAM>_TOKEN, …); a setting a domain does not declare is none."""
        return Credentials(*(getattr(settings, f"{downstream}_{what}", None) for what in _CREDENTIALS))

    def tls(self) -> ssl.SSLContext | None:
        """The TLS context for its own CA or a client certificate; None for the system's CAs and no certificate."""
        if self.ca_file is None and self.cert_file is None:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


_CREDENTIALS = ("token", "ca_file", "cert_file", "key_file")


class Downstream:
    """A downstream at a configurable base URL, sharing the process's HTTP client and its breaker (by name, from
    the process's `Breakers`); unset disables its calls. Its credentials go with every call: the token as
    `Authorization: Bearer …`, its CA and client certificate as the TLS context of its connections."""

    downstream = "downstream"  # its name: its breaker, its metrics' label, its settings' prefix

    def __init__(
        self,
        http: HttpClient,
        base_url: str | None,
        breakers: Breakers | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._http = http
        self._base_url = base_url
        # A client made alone (a test, a one-off) has a breaker of its own.
        self._guard = breakers[self.downstream] if breakers is not None else Guard(self.downstream, BreakerPolicy())
        credentials = credentials or Credentials()
        token = credentials.token
        self._auth = {"Authorization": f"Bearer {token.get_secret_value()}"} if token is not None else {}
        # Sent with each call rather than trusted for its origin: two downstreams behind one gateway (one host and
        # port) may each have their own CA and client certificate.
        self._tls = credentials.tls()

    @property
    def enabled(self) -> bool:
        """False when the downstream's URL setting is unset."""
        return self._base_url is not None

    @property
    def guard(self) -> Guard:
        """This downstream's breaker in this process."""
        return self._guard

    async def _get(self, path: str, own: Own, params: Mapping[str, str] | None = None) -> Exchange:
        """GET `{base}{path}` through the breaker (`path` already percent-encoded)."""
        target = f"{path}?{urlencode(sorted(params.items()))}" if params else path
        url = f"{self._base_url}{path}"
        send = functools.partial(self._http.get, url, params=params, headers=self._auth, tls=self._tls)
        return await self._exchange(send, own, target)

    async def _post(
        self, path: str, own: Own, body: Any, *, target: str, headers: Mapping[str, str] | None = None
    ) -> Exchange:
        """POST a JSON body to `{base}{path}` through the breaker; `target` tells this request from others to the same
        path (an idempotency key, a ref), so that one request failing again and again opens no breaker."""
        headers = {**self._auth, **headers} if headers else self._auth
        send = functools.partial(self._http.post, f"{self._base_url}{path}", json=body, headers=headers, tls=self._tls)
        return await self._exchange(send, own, target)

    async def _exchange(self, send: Callable[[], Awaitable[Answer]], own: Own, target: str) -> Exchange:
        ticket = self._guard.admit(target)
        if ticket is None:
            return self._refused()
        try:
            # (The client bounds the whole exchange too, so an answer dripping in is an outage the breaker sees.)
            answer = await send()
            body = document(answer)
            outcome = judge(answer, own, body)
            if outcome is not OK:
                outcome = replace(outcome, target=target)
        except TransportError as error:
            if isinstance(error, CertificateRefused):
                # Its CA file or the URL's host, the same for every request: like an answer not the API's own, it
                # opens the breaker at once and charges nobody.
                outcome = Outcome(Verdict.MISCONFIGURED, ErrorCode.DOWNSTREAM_MISCONFIGURED, target=target)
            else:
                outcome = Outcome(Verdict.FAILED, transport_code(error), target=target)
            charged = self._guard.record(ticket, outcome)
            return Exchange(None, error, outcome, charged, wait=None if charged else self._wait())
        except BaseException:
            self._guard.release(ticket)  # cancelled mid-call (a round's timeout, a stop): it says nothing
            raise
        charged = self._guard.record(ticket, outcome)
        wait = None if charged or outcome is OK else self._wait()
        return Exchange(answer, None, outcome, charged, wait=wait, body=body)

    def _refused(self) -> Exchange:
        breaker = self._guard.breaker
        outcome = Outcome(
            Verdict.MISCONFIGURED if breaker.misconfigured else Verdict.FAILED,
            breaker.code or ErrorCode.DOWNSTREAM_UNAVAILABLE,
            status=breaker.status,
        )
        return Exchange(None, None, outcome, charged=False, refused=True, wait=self._wait())

    def _wait(self) -> timedelta:
        return timedelta(seconds=self._guard.wait())


def path_segment(value: str) -> str:
    """`value` as one percent-encoded path segment: every reserved character, and dots too (`..` would be
    resolved as the parent by whatever reads the path)."""
    return quote(value, safe="").replace(".", "%2E")
