"""One HTTP request and its whole answer within a deadline: the seam between the process's HTTP client
(service/adapters/http.py) and the library that speaks HTTP (aiohttp).

`Transport` is what the client needs of a library: send a request that is already checked and encoded, and get back
an `Answer` (status, headers, body) or a `TransportError` that says how far the exchange got: `ConnectFailed` (no
byte of the request left: nothing can have happened), `TimedOut` (sent, no answer in time) or `Cut` (sent, and the
connection broke or the answer could not be read). The library's own exceptions stop here.

The process's transport is `AiohttpTransport` (service/adapters/aiohttp_transport.py), imported only by the
processes that make calls: aiohttp takes a tenth of a second or more to import.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

# A longer answer is not one a downstream call expects; reading it would hold the worker's memory hostage.
MAX_ANSWER_BYTES: Final = 8 * 1024 * 1024
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Answer:
    """A downstream's whole answer: its status, headers (case-insensitive) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not. A leading UTF-8 byte order mark is skipped, as JSON
        readers may (RFC 8259 §8.1): orjson refuses it."""
        return orjson.loads(self.content.removeprefix(_BOM))


class TransportError(Exception):
    """No answer came: the connection failed, timed out or was cut."""


class ConnectFailed(TransportError):
    """The request never left: no connection could be had (refused, unresolvable, or none free in time), or the
    request could not be written (a line break in a header)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class CertificateRefused(ConnectFailed):
    """The downstream's certificate did not verify against the CA trusted for it (another CA, another host's name,
    expired): the same for every request, our configuration or the downstream's, never a request's own failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, timed_out=False)


class TimedOut(TransportError):
    """The request was sent and no answer came in time: the downstream may have acted on it."""


class Cut(TransportError):
    """The connection broke after the request was sent, or the answer could not be read: it may have acted."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A request ready to leave: an absolute URL already percent-encoded, headers that can be written as they are
    (no line breaks), the body, and for an https URL the TLS context of its downstream (its CA, its client
    certificate; None: the system's CAs)."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes = b""
    tls: ssl.SSLContext | None = None


class Transport(Protocol):
    """Sends one request and reads its whole answer with a deadline: `seconds` for a free connection, for connecting
    and for each silence of the downstream, and twice that for the whole answer (one dripping in a byte at a time
    must not hold a call, and its record, for ever)."""

    async def send(self, request: Outgoing, seconds: float) -> Answer:
        """The whole answer, or a TransportError; RuntimeError once the transport is closed."""
        ...

    async def close(self) -> None:
        """Drop every connection: calls under way end as Cut, those waiting for a connection as ConnectFailed."""
        ...
