"""`Transport` (service/adapters/transport.py) over aiohttp's client, for the process's one HTTP client.

Keep-alive connections per origin and TLS context (a request's own: its downstream's), redirects handed back as
they are, no cookies, no compression, no proxy from the environment. It bounds what aiohttp leaves open: how many
exchanges run at once (waiting for one is bounded by the timeout too), how long an answer may be (a header line
longer than aiohttp's 8190 bytes ends the exchange as Cut too), what closing the client does to the calls under
way, and which kept connection may carry a request (`_Connector`).

What aiohttp decides, and this module takes as it is: a GET that meets a kept connection the downstream has just
closed is sent once more on a new one (RFC 9112 §9.3.1; a POST ends as Cut); idle connections are kept 4 s whatever
a `Keep-Alive: timeout=N` header says; bytes past an answer's framing in the same packet are parsed on as the start
of the next answer (dropped when the next request begins) or, when they cannot start one, end the answer before
them as Cut. No call gets another call's answer either way.
"""

from __future__ import annotations

import asyncio
import io
import select
import ssl
import weakref
from typing import Any, Final, Literal

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.http_exceptions import LineTooLong
from aiohttp.tracing import Trace
from yarl import URL

from service.adapters import transport
from service.adapters.transport import Answer, CertificateRefused, ConnectFailed, Cut, Outgoing, TimedOut

# A body longer than aiohttp's warning threshold (1 MiB) is sent from a stream.
_LARGE_BODY: Final = 1024 * 1024


# Where a call is when the transport closes: what it can have done decides the error it ends with.
_Stage = Literal["waiting", "sent"]


class AiohttpTransport:
    """`Transport` over one aiohttp client session: at most `connections` exchanges at once, idle connections kept
    `keepalive` seconds. Make it inside the event loop; `close` it."""

    def __init__(self, connections: int, keepalive: float) -> None:
        """Open the session (no connection is made until a call needs one)."""
        # No limit of aiohttp's own: the slots below bound the exchanges, and a wait for one ends as ConnectFailed.
        connector = _Connector(limit=0, keepalive_timeout=keepalive)
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,  # no proxy from the environment: a downstream's URL is where the call goes
            skip_auto_headers=("User-Agent",),
        )
        self._slots = asyncio.Semaphore(connections)
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._calls: dict[asyncio.Task[Any], _Stage] = {}
        self._closed = False

    async def send(self, request: Outgoing, seconds: float) -> Answer:
        """Send `request` on a kept-alive connection or a new one, and read the whole answer."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        task = asyncio.current_task()
        assert task is not None  # a call is always made by a task
        self._calls[task] = "waiting"
        try:
            await self._acquire(seconds)
            try:
                self._calls[task] = "sent"
                return await self._exchange(request, seconds)
            finally:
                self._slots.release()
        except asyncio.CancelledError:
            # close() cancels the calls under way (aiohttp then drops their connections): in their own words.
            stage = self._calls[task] if self._closed else None
            if stage is None or task.uncancel():
                raise
            if stage == "waiting":
                raise ConnectFailed("the HTTP client closed", timed_out=False) from None
            raise Cut("the HTTP client closed") from None
        finally:
            del self._calls[task]

    async def close(self) -> None:
        """Drop every connection: calls under way end as Cut, those waiting for one as ConnectFailed, later ones
        raise RuntimeError."""
        if self._closed:
            return
        self._closed = True
        for task in self._calls:
            task.cancel()
        # Aborted rather than closed: over TLS a close waits for the downstream's close_notify.
        await self._session.connector.close(abort_ssl=True)  # type: ignore[union-attr]
        await self._session.close()

    async def _acquire(self, seconds: float) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free: it returns without waiting
            return
        try:
            async with asyncio.timeout(seconds):
                await self._slots.acquire()
        except TimeoutError as error:
            raise ConnectFailed("no connection free in time", timed_out=True) from error

    async def _exchange(self, request: Outgoing, seconds: float) -> Answer:
        url = URL(request.url, encoded=True)
        # Over https, the request's own context (its downstream's CA, its client certificate), else the system's CAs.
        context: ssl.SSLContext | bool = request.tls if url.scheme == "https" and request.tls is not None else True
        try:
            async with self._session.request(
                request.method,
                url,
                headers=request.headers,
                data=_payload(request.body),
                allow_redirects=False,
                ssl=context,
                timeout=self._timeout(seconds),
            ) as response:
                ended = _unframed_end(response)
                body = await _body(response)
                if ended is not None and ended.done() and ended.exception() is not None:
                    # aiohttp takes whatever came before the end for the whole answer, a reset too.
                    raise Cut("the connection was reset before the whole answer came")
                return Answer(response.status, response.headers, body)
        except aiohttp.ConnectionTimeoutError as error:
            raise ConnectFailed("connecting timed out", timed_out=True) from error
        except aiohttp.ClientConnectorCertificateError as error:
            raise CertificateRefused(f"{type(error).__name__}: {error}") from error
        except aiohttp.ClientConnectorError as error:
            # Refused, unresolvable, unreachable, a TLS handshake that failed otherwise.
            raise ConnectFailed(f"{type(error).__name__}: {error}", timed_out=False) from error
        except aiohttp.SocketTimeoutError as error:
            raise TimedOut(f"no answer within {seconds:g} s") from error
        except TimeoutError as error:
            raise TimedOut(f"no whole answer within {2 * seconds:g} s") from error
        except aiohttp.ClientResponseError as error:
            if _caused_by(error, LineTooLong):
                raise Cut(f"the answer's head is longer than its limit: {error.message}") from error
            raise Cut(f"the answer could not be read: {error.message}") from error
        except aiohttp.ClientError as error:
            raise Cut(f"{type(error).__name__}: {error}") from error

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=2 * seconds, connect=seconds, sock_connect=seconds, sock_read=seconds)
            self._timeouts[seconds] = timeout
        return timeout


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, which hands out a kept connection only if nothing came on it since its last answer.

    An answer belongs to the request it follows: HTTP/1.1 has nothing else to tell whose answer it is. Bytes (or an
    end) that came while no request of ours was outstanding, and that the event loop has not read yet because it
    was busy elsewhere, would be read after the next request is written, as its answer: a call's late second
    answer taken for the next call's. Such a connection is closed, and the call takes another.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109
    ) -> Connection:
        """A new connection, or a kept one on which nothing is waiting to be read."""
        while True:
            connection = await super().connect(req, traces, timeout)
            protocol = connection.protocol
            if protocol is None:
                return connection
            if protocol not in self._handed_out:
                self._handed_out.add(protocol)
                return connection
            # should_close: aiohttp has read a whole answer nobody asked for on it (or more than an answer).
            if not protocol.should_close and _quiet(protocol):
                return connection
            connection.close()


def _quiet(protocol: ResponseHandler) -> bool:
    """Nothing is waiting to be read on the connection's socket (under TLS too: a record is bytes as well)."""
    connection = protocol.transport
    if connection is None:
        return False
    readable = select.poll()
    readable.register(connection.get_extra_info("socket").fileno(), select.POLLIN)
    return not readable.poll(0)


def _payload(body: bytes) -> bytes | io.BytesIO | None:
    """What aiohttp sends a body as: a large one from a stream, which aiohttp writes in parts."""
    if not body:
        return None
    return io.BytesIO(body) if len(body) > _LARGE_BODY else body


def _unframed_end(response: aiohttp.ClientResponse) -> asyncio.Future[None] | None:
    """For an answer whose end is its connection's (RFC 9112 §6.3: neither a length nor chunks), what ends the
    connection: a reset is not the end of the answer. None for any other answer."""
    if response.content_length is not None or response.status in (204, 304) or response.connection is None:
        return None
    codings = response.headers.get("Transfer-Encoding", "")
    if codings.rsplit(",", 1)[-1].strip().lower() == "chunked":
        return None
    ended = response.connection.protocol.closed if response.connection.protocol is not None else None
    if ended is not None:
        ended.add_done_callback(_retrieved)
    return ended


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark an end's error as seen, so that asyncio does not log it when nobody reads it (a call given up on)."""
    if not future.cancelled():
        future.exception()


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether `kind` is among the causes of `error` (aiohttp wraps its parser's errors twice)."""
    cause = error.__cause__
    while cause is not None and not isinstance(cause, kind):
        cause = cause.__cause__
    return cause is not None


async def _body(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, up to `transport.MAX_ANSWER_BYTES` (Cut past it)."""
    length = response.content_length
    if length is not None and length > transport.MAX_ANSWER_BYTES:
        raise Cut(f"the answer is longer than {transport.MAX_ANSWER_BYTES} bytes")
    if length is not None:
        return await response.read()  # framed by its length: no more can come
    body = bytearray()
    while chunk := await response.content.readany():
        body += chunk
        if len(body) > transport.MAX_ANSWER_BYTES:
            raise Cut(f"the answer is longer than {transport.MAX_ANSWER_BYTES} bytes")
    return bytes(body)
