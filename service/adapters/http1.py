"""HTTP/1.1 exchanges over asyncio's transports, under the process's one HTTP client (service/adapters/http.py).

Why not aiohttp: a capture's call is the largest cost per order the effect worker has, and aiohttp's request path
(request and response objects, a URL, timers and cookies per call) cost twice this one's CPU (docs/performance.md,
"The effect worker"). The answer is parsed by httptools (llhttp, uvicorn's parser): what is written
here is only the pool and the framing a downstream call needs. One request at a time per connection, kept alive
while the downstream keeps it; plain or TLS (certificates checked). Left out, because no downstream call needs them:
redirects (the answer is handed back as it is), proxies, cookies, compression (`Accept-Encoding: identity`),
HTTP/2.

An answer belongs to the request it follows: HTTP/1.1 has nothing else to tell whose answer it is. So a connection
that receives a byte while no request of ours is outstanding on it, or more bytes than an answer's framing, is
closed and never used again; and before a kept connection carries a request, it is polled for bytes (or an end) that
came while the loop was busy elsewhere. What arrives after a request is written cannot be told from its answer:
a client of a downstream that echoes the request's identity checks it (service/orders/providers.py, payments).

Errors say how far an exchange got: `ConnectFailed` (no byte of the request left), `TimedOut` (sent, no answer in
time) and `Cut` (sent, and the connection broke or the answer could not be read).
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import httptools
import orjson
from multidict import CIMultiDict

# A longer answer is not one a downstream call expects; reading it would hold the worker's memory hostage. The
# head (status line, headers and any interim answers) is bounded on its own, as aiohttp and browsers do: llhttp
# keeps a header that has not ended yet in memory whole.
MAX_ANSWER_BYTES: Final = 8 * 1024 * 1024
MAX_HEAD_BYTES: Final = 64 * 1024
_BOM: Final = b"\xef\xbb\xbf"


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
    """The request never left: no connection could be had (refused, unresolvable, or none free in time), or the
    request could not be written (a line break in a header)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class TimedOut(TransportError):
    """The request was sent and no answer came in time: the downstream may have acted on it."""


class Cut(TransportError):
    """The connection broke after the request was sent, or the answer could not be read: it may have acted."""


class Origin(NamedTuple):
    """Where connections go: one pool of them per origin."""

    tls: bool
    host: str
    port: int


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time: it feeds what comes to the parser and settles `waiter`."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._readable = select.poll()  # polled before a request goes out on the connection again
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._reads = 0  # data_received calls: the pool's sweep tells a silent exchange by it
        self._seen_reads = 0
        self._silent_since = 0.0
        self._sent_at = 0.0  # when the exchange under way wrote its request
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._head_size = 0  # bytes received before the final answer's headers ended
        self._size = 0  # the body's bytes
        self._headers_done = False
        self.reusable = False
        self.lost = False
        self.idle_since = 0.0
        self.keep_for = pool.keepalive  # how long it may stay idle and still be used

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        # The socket itself, under TLS too: bytes of a TLS record are bytes nobody asked for as well.
        self._readable.register(transport.get_extra_info("socket").fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for: what comes next on this connection could not be told apart from them.
            self.close()
            return
        self._reads += 1
        if not self._headers_done:
            # Counted before the parser sees them: it holds an unfinished header whole.
            self._head_size += len(data)
            if self._head_size > MAX_HEAD_BYTES:
                self.fail(Cut(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes"))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(Cut("the downstream switched protocols"))
        except httptools.HttpParserError as error:
            self.fail(Cut(f"the answer could not be read: {error}"))
        if self._size > MAX_ANSWER_BYTES:
            self.fail(Cut(f"the answer is longer than {MAX_ANSWER_BYTES} bytes"))

    def eof_received(self) -> bool:
        # The downstream ended its side. Over TLS without a close_notify the transport closes only a loop turn or two
        # later: until then it must not be handed out, or a request would be written into a closing connection.
        self.lost = True
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pool.forget(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._headers_done and self._unframed():
            # An answer without a length ends with its connection (RFC 9112 §6.3); a reset is not an end.
            self._finish(keep=False)
        else:
            self.fail(Cut("the connection closed before the whole answer came"))

    # httptools' callbacks

    def on_message_begin(self) -> None:
        waiter = self._waiter
        if waiter is not None and waiter.done():
            # A second answer to one request (or more bytes than its framing): the connection is out of step with its
            # requests.
            self.close()
        self._headers = []
        self._body = bytearray()
        self._headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._headers_done:  # after them, a chunked answer's trailers: not the answer's headers
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= MAX_ANSWER_BYTES:
            self._body += body

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # a second answer to one request: on_message_begin closed the connection
        if self._size > MAX_ANSWER_BYTES:
            return  # data_received ends it as Cut
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows on the same connection. It is
            # not progress for the sweep, or a downstream sending one a second would hold the call for ever.
            self._headers_done = False
            self._seen_reads = self._reads
            return
        self._finish(keep=self._parser.should_keep_alive())

    # the exchange

    def send(self, request: bytes, now: float) -> asyncio.Future[Answer]:
        """Write `request`; the future settles with the answer, or with a TransportError."""
        assert self._transport is not None
        self._waiter = waiter = self._loop.create_future()
        self._head_size = 0
        self._size = 0
        self._headers_done = False
        self.reusable = False
        self._seen_reads = self._reads
        self._silent_since = now
        self._sent_at = now
        self._transport.write(request)
        return waiter

    def check(self, now: float, timeout: float) -> None:
        """Called by the pool's sweep while an exchange is under way: end it TimedOut when nothing has come for
        `timeout` seconds (as seen by the sweeps), or when its whole answer has not come within twice that (an
        answer dripping in a byte at a time would otherwise hold the call, and its record, for ever)."""
        if now - self._sent_at >= 2 * timeout:
            self.fail(TimedOut(f"no whole answer within {2 * timeout:g} s"))
        elif self._reads != self._seen_reads:
            self._seen_reads = self._reads
            self._silent_since = now
        elif now - self._silent_since >= timeout:
            self.fail(TimedOut(f"no answer within {timeout:g} s"))

    @property
    def usable(self) -> bool:
        """Neither lost nor closing."""
        return not self.lost and self._transport is not None and not self._transport.is_closing()

    def quiet(self) -> bool:
        """Nothing is waiting to be read on the socket: no byte and no end came since the last answer was read.
        data_received closes the connection on such bytes, but only once the loop has read them: bytes that came
        while it was busy elsewhere would otherwise be read after the next request is written, as its answer."""
        return not self._readable.poll(0)

    def close(self) -> None:
        """Close the connection; an exchange under way ends as Cut when its waiter is still waiting."""
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection at once (an exchange given up on: its answer must not reach the next one)."""
        self.reusable = False
        if self._transport is not None:
            self._transport.abort()

    def _unframed(self) -> bool:
        """The answer's end is its connection's (RFC 9112 §6.3, as llhttp reads it): a status that has a body, and
        neither chunks (the last transfer coding) nor, without a transfer coding, a Content-Length."""
        status = self._parser.get_status_code()
        if status < 200 or status in (204, 304):
            return False
        codings = [value for name, value in self._headers if name.lower() == b"transfer-encoding"]
        if codings:
            return codings[-1].rsplit(b",", 1)[-1].strip().lower() != b"chunked"
        return all(name.lower() != b"content-length" for name, _ in self._headers)

    def _finish(self, *, keep: bool) -> None:
        waiter = self._waiter
        assert waiter is not None
        transport = self._transport
        # Not while part of the request is still unsent (the downstream answered before reading it all): the next
        # request would queue behind bytes it may never read.
        self.reusable = keep and not self.lost and transport is not None and not transport.get_write_buffer_size()
        if not waiter.done():
            headers = CIMultiDict([(name.decode("latin-1"), value.decode("latin-1")) for name, value in self._headers])
            if self.reusable and "keep-alive" in headers:
                self.keep_for = _kept_for(headers["keep-alive"], self.keep_for)
            waiter.set_result(Answer(self._parser.get_status_code(), headers, bytes(self._body)))

    def fail(self, error: TransportError) -> None:
        """End the exchange under way with `error`, and drop the connection."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.abort()


def _kept_for(keep_alive: str, longest: float) -> float:
    """How long an idle connection may be used under a `Keep-Alive: timeout=N` header: half of N (the downstream
    closes it at N, perhaps as a request arrives), within `longest`."""
    for parameter in keep_alive.split(","):
        name, _, value = parameter.partition("=")
        value = value.strip()
        if name.strip().lower() == "timeout" and value.isascii() and value.isdigit():
            return min(longest, int(value[:6]) / 2)
    return longest


class Pool:
    """Keep-alive connections per origin, at most `limit` exchanges at once across them."""

    def __init__(self, timeout: float, limit: int, keepalive: float) -> None:
        """`timeout` bounds connecting, the wait for a free slot and each read; an idle connection is not used
        again after `keepalive` seconds. Call inside the event loop."""
        self.loop = asyncio.get_running_loop()
        self._timeout = timeout
        self.keepalive = keepalive
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[Origin, dict[_Connection, None]] = {}
        self._open: set[_Connection] = set()
        self._busy: set[_Connection] = set()  # exchanges under way, which the sweep times
        self._sweep_every = timeout / 10
        self._sweep: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self._trusted: dict[tuple[str, int], ssl.SSLContext] = {}  # a downstream's own CA or client certificate
        self._closed = False

    async def exchange(self, origin: Origin, request: bytes) -> Answer:
        """Send `request` to `origin` on a kept-alive connection or a new one, and read the answer."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout(self._timeout):
                    await slots.acquire()
            except TimeoutError as error:
                raise ConnectFailed("no connection free in time", timed_out=True) from error
        else:
            await slots.acquire()  # free: it returns without waiting
        try:
            if self._closed:  # while it waited for a slot
                raise ConnectFailed("the HTTP client closed", timed_out=False)
            connection = self._kept(origin) or await self._connect(origin)
            self._busy.add(connection)
            if self._sweep is None:
                self._sweep = self.loop.call_later(self._sweep_every, self._time_out_silent)
            try:
                answer = await connection.send(request, self.loop.time())
            except BaseException:
                connection.abort()
                raise
            finally:
                self._busy.discard(connection)
            if connection.reusable:
                connection.idle_since = self.loop.time()
                self._idle.setdefault(origin, {})[connection] = None
            else:
                connection.close()
            return answer
        finally:
            slots.release()

    def _time_out_silent(self) -> None:
        # One sweep a tenth of the timeout while exchanges are under way, rather than a timer per exchange: asyncio
        # keeps timers in a heap ordered by Python-level comparisons, and a timer set and cancelled on each call was
        # a large share of the client's CPU (docs/performance.md). An exchange times out 1 to 1.2 timeouts after its
        # last byte came.
        now = self.loop.time()
        for connection in list(self._busy):
            connection.check(now, self._timeout)
        self._sweep = self.loop.call_later(self._sweep_every, self._time_out_silent) if self._busy else None

    def forget(self, connection: _Connection) -> None:
        """A connection closed: it is neither open nor idle any more."""
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle is not None:
            idle.pop(connection, None)

    async def close(self) -> None:
        """Drop every connection: exchanges under way end as Cut, those waiting for one as ConnectFailed, later
        ones raise RuntimeError."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        # Aborted rather than closed: a close waits for unsent bytes to leave, and over TLS for the downstream's
        # close_notify (up to 30 s), so a call under way would outlive its client.
        for connection in list(self._busy):
            connection.fail(Cut("the HTTP client closed"))
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        self._idle.clear()
        # Let the transports run their connection_lost before the loop may end.
        await asyncio.sleep(0)

    def _kept(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self.loop.time()
        while idle:
            connection, _ = idle.popitem()  # the most recently used: the least likely to have been closed by now
            if not connection.usable:
                continue
            if not connection.quiet():
                connection.close()
                continue
            if now - connection.idle_since < connection.keep_for:
                return connection
            # Past the keep-alive, the downstream may be closing it just as a request arrives: a POST on it would end
            # Cut (it may have been read) for nothing. The rest were idle longer still.
            for stale in [connection, *idle]:
                stale.close()
            idle.clear()
        return None

    def trust(self, host: str, port: int, context: ssl.SSLContext) -> None:
        """Connect to `host:port` over TLS with this context (a downstream's own CA, a client certificate)."""
        self._trusted[(host, port)] = context

    async def _connect(self, origin: Origin) -> _Connection:
        tls = (self._trusted.get((origin.host, origin.port)) or self._context()) if origin.tls else None
        try:
            async with asyncio.timeout(self._timeout):
                _, connection = await self.loop.create_connection(
                    lambda: _Connection(self, origin), origin.host, origin.port, ssl=tls
                )
        except TimeoutError as error:
            raise ConnectFailed("connecting timed out", timed_out=True) from error
        # OSError: refused, unresolvable, unreachable, a certificate refused (ssl.SSLError); ValueError: a host name
        # IDNA cannot encode (UnicodeError).
        except (OSError, ValueError) as error:
            raise ConnectFailed(f"{type(error).__name__}: {error}", timed_out=False) from error
        if self._closed or not connection.usable:
            connection.abort()
            raise ConnectFailed("the connection closed as it opened", timed_out=False)
        self._open.add(connection)
        return connection

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
