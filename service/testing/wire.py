"""The HTTP/1.1 plumbing under the fault-injection server: one asyncio loop, keep-alive, framing, cut connections.

It parses each request into a `Request`, awaits the server's `answer` coroutine and carries its outcome out:
send a `Reply`, or cut the connection without a byte. It knows nothing of routes or faults. Every connection
is a coroutine on one event loop in one daemon thread, so an answer that waits (latency, a delay) is a sleep
on that loop: a thousand calls in flight cost memory, not threads. stop() cancels those sleeps, and their
connections close unanswered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from service.testing.routes import METHODS, Reply, Request, json_reply

# "cut": drop the connection without a byte of answer, like a provider crashing or a proxy resetting.
Outcome = Reply | Literal["cut"]
Answer = Callable[[Request], Awaitable[Outcome]]

# A long-running demo must not keep connections its clients forgot forever. One sweep every quarter of the
# timeout closes them: a timer per request would cost more than the rest of a request's work together
# (asyncio keeps timers in a heap ordered by Python-level comparisons).
_IDLE_CONNECTION_TIMEOUT_S: Final = 60.0
# A worker opens its pool's connections in one burst: a short backlog would refuse some, and a call refused
# mid-way ends `uncertain`, a failure of the fake rather than of the worker it measures.
_BACKLOG: Final = 1024
_REASONS: Final = {status.value: status.phrase for status in HTTPStatus}
_HEAD_END: Final = b"\r\n\r\n"

_log = logging.getLogger(__name__)


class HttpServer:
    """An HTTP/1.1 server on its own event loop in one daemon thread; every request goes to `answer`."""

    def __init__(self, host: str, port: int, answer: Answer) -> None:
        """Configure the address; nothing listens until start()."""
        self._host = host
        self._port = port
        self._answer = answer
        self._thread: threading.Thread | None = None
        # A concurrent future, so stop() can be asked from any thread without touching the loop.
        self._stop_requested: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Only touched on the loop's thread.
        self._connections: set[asyncio.Task[Any]] = set()
        self._waiting_since: dict[asyncio.StreamWriter, float] = {}  # connections waiting for a request

    def start(self) -> int:
        """Listen and serve on a daemon thread; return the port bound (OSError when binding fails)."""
        if self._thread is not None:
            raise RuntimeError("the server was started already")
        bound: concurrent.futures.Future[int] = concurrent.futures.Future()
        # Daemon: a loop left running must never keep the interpreter (a test run, the demo) alive.
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(bound),), daemon=True)
        self._thread.start()
        port = bound.result()
        self._thread.name = f"fault-server-{port}"
        return port

    def stop(self) -> None:
        """Stop listening, cancel every waiting answer, close every connection and wait for the loop to end."""
        if self._thread is None:
            return
        if not self._stop_requested.done():
            self._stop_requested.set_result(None)
        self._thread.join()

    async def _run(self, bound: concurrent.futures.Future[int]) -> None:
        """Serve until stop() asks, then close the listener and every connection."""
        try:
            # asyncio sets TCP_NODELAY on every TCP connection: without it an answer written after a small
            # earlier write would wait for the client's delayed ACK (~40 ms a call).
            server = await asyncio.start_server(self._serve, self._host, self._port, backlog=_BACKLOG)
        except Exception as error:
            bound.set_exception(error)
            return
        bound.set_result(server.sockets[0].getsockname()[1])
        sweeper = asyncio.create_task(self._close_idle_connections())
        await asyncio.wrap_future(self._stop_requested)
        sweeper.cancel()
        server.close()
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one connection's requests in order until it closes, is cut or the server stops."""
        task = asyncio.current_task()
        assert task is not None  # a connection is always served by its own task
        self._connections.add(task)
        try:
            while await self._serve_one(reader, writer):
                pass
        except asyncio.CancelledError:
            # Only stop() cancels a connection: drop it even if a client that stopped reading left answers
            # unsent, and end quietly, which keeps asyncio from reporting the cancellation as an error.
            writer.transport.abort()
        except OSError:
            # Clients that time out or are cut hang up mid-answer: the faults cause it, it is no error.
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _close_idle_connections(self) -> None:
        """Close, every quarter of the idle timeout, the connections that waited for a request longer than it."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_IDLE_CONNECTION_TIMEOUT_S / 4)
            expired = loop.time() - _IDLE_CONNECTION_TIMEOUT_S
            for writer in [writer for writer, since in self._waiting_since.items() if since <= expired]:
                writer.close()  # its reader sees the end of the stream, and its task ends

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and carry out its outcome; whether the connection stays open for another."""
        self._waiting_since[writer] = asyncio.get_running_loop().time()
        try:
            read = await _read_request(reader, writer)
        except asyncio.IncompleteReadError:
            return False  # the client hung up, or stayed idle too long (possibly mid-request)
        except asyncio.LimitOverrunError:
            read = json_reply(431, {"error": "request head too large"})
        finally:
            del self._waiting_since[writer]
        if isinstance(read, Reply):
            # The stream cannot be framed past a refused request, so the connection cannot be reused.
            await _send(writer, read, keep_alive=False)
            return False
        request, keep_alive = read
        try:
            outcome = await self._answer(request)
        except Exception:
            _log.exception("answering %s %s failed", request.method, request.path)
            outcome, keep_alive = json_reply(500, {"error": "the fake failed"}), False
        if outcome == "cut":
            writer.transport.abort()
            return False
        await _send(writer, outcome, keep_alive)
        return keep_alive


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[Request, bool] | Reply:
    """The next request and whether its connection may stay open, or the reply refusing it."""
    lines = (await reader.readuntil(_HEAD_END)).decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        return json_reply(400, {"error": "malformed request line"})
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return json_reply(505, {"error": "HTTP/1.0 or HTTP/1.1 only"})
    if method not in METHODS:
        return json_reply(501, {"error": f"method {method} not supported"})
    headers: dict[str, str] = {}
    for line in lines[1:-2]:
        name, colon, value = line.partition(":")
        if not colon:
            return json_reply(400, {"error": "malformed header"})
        # The first value wins when a header was sent twice, as the stdlib's `Message.get` does.
        headers.setdefault(name.strip().lower(), value.strip())
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return json_reply(411, {"error": "Content-Length required"})
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        length = -1
    if length < 0:
        return json_reply(400, {"error": "invalid Content-Length"})
    if length and version == "HTTP/1.1" and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for it before a large body
    body = await reader.readexactly(length) if length else b""
    tokens = {token.strip() for token in headers.get("connection", "").lower().split(",")}
    keep_alive = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
    parts = urlsplit(target)
    # keep_blank_values: `?ref=` asks for the value "" rather than for no value.
    query = {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
    return Request(method, parts.path, query, headers, body, _parse_object(body)), keep_alive


async def _send(writer: asyncio.StreamWriter, reply: Reply, keep_alive: bool) -> None:
    """Write a complete answer with Content-Length so keep-alive clients can frame it (none for a 1xx, 204 or 304,
    which have no body). JSON unless the reply names its own Content-Type (an empty one: none at all)."""
    content_type = next((value for name, value in reply.headers if name.lower() == "content-type"), "application/json")
    bodyless = reply.status < 200 or reply.status in (204, 304)
    lines = [
        f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}",
        "Server: fault-server/1",
        f"Date: {_http_date(int(time.time()))}",
        *([f"Content-Type: {content_type}"] if content_type else []),
        *([] if bodyless else [f"Content-Length: {len(reply.body)}"]),
        *(f"{name}: {value}" for name, value in reply.headers if name.lower() != "content-type"),
    ]
    if not keep_alive:
        lines.append("Connection: close")
    lines.append("\r\n")
    writer.write("\r\n".join(lines).encode("latin-1") + (b"" if bodyless else reply.body))
    await writer.drain()


@functools.lru_cache(maxsize=1)
def _http_date(second: int) -> str:
    """The Date header for a second; cached, as thousands of answers a second share it."""
    return formatdate(second, usegmt=True)


def _parse_object(body: bytes) -> dict[str, Any] | None:
    """Decode a JSON object body; anything else (empty, invalid, not an object) is None."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None
