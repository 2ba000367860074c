"""The fault-injection server's HTTP: aiohttp's low-level web server on an event loop of its own, in one daemon thread.

It turns each request into a `Request`, awaits the server's `answer` coroutine and carries its outcome out: send a
`Reply`, or cut the connection without a byte. It knows nothing of routes or faults. Every connection is a task on
the one loop, so an answer that waits (latency, a delay) is a sleep on that loop: a thousand calls in flight cost
memory, not threads. stop() cancels those sleeps, and their connections close unanswered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from aiohttp import web
from multidict import CIMultiDict

from service.testing.routes import METHODS, Reply, Request, json_reply

# "cut": drop the connection without a byte of answer, like a provider crashing or a proxy resetting.
Outcome = Reply | Literal["cut"]
Answer = Callable[[Request], Awaitable[Outcome]]

# A long-running demo must not keep connections its clients forgot forever.
_IDLE_CONNECTION_TIMEOUT_S: Final = 60.0
# A worker opens its pool's connections in one burst: a short backlog would refuse some, and a call refused
# mid-way ends `uncertain`, a failure of the fake rather than of the worker it measures.
_BACKLOG: Final = 1024
_SERVER: Final = "fault-server/1"

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
        self._answering: set[asyncio.Task[Any]] = set()  # only touched on the loop's thread

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
        server = web.Server(self._serve, keepalive_timeout=_IDLE_CONNECTION_TIMEOUT_S, access_log=None)
        try:
            # asyncio sets TCP_NODELAY on every TCP connection: without it an answer written after a small
            # earlier write would wait for the client's delayed ACK (~40 ms a call).
            listener = await asyncio.get_running_loop().create_server(server, self._host, self._port, backlog=_BACKLOG)
        except Exception as error:
            bound.set_exception(error)
            return
        bound.set_result(listener.sockets[0].getsockname()[1])
        await asyncio.wrap_future(self._stop_requested)
        listener.close()
        # A waiting answer's task is its connection's: cancelled, the connection closes without a byte.
        for task in self._answering:
            task.cancel()
        await server.shutdown(timeout=1.0)
        await listener.wait_closed()

    async def _serve(self, incoming: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; its connection stays open for another unless the client or the answer says not."""
        refused = _refusal(incoming)
        if refused is not None:
            return _response(refused, close=True)
        if incoming.headers.get("Expect", "").lower() == "100-continue" and incoming.content_length:
            await incoming.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for it
        request = await _request(incoming)
        task = asyncio.current_task()
        assert task is not None  # aiohttp answers each connection in a task of its own
        self._answering.add(task)
        try:
            outcome = await self._answer(request)
        except Exception:
            _log.exception("answering %s %s failed", request.method, request.path)
            return _response(json_reply(500, {"error": "the fake failed"}), close=True)
        finally:
            self._answering.discard(task)
        if outcome == "cut":
            assert incoming.transport is not None  # aiohttp hands over requests only on open connections
            incoming.transport.abort()
            return web.Response()  # nobody will read it: the connection is gone
        return _response(outcome, close=False)


def _refusal(incoming: web.BaseRequest) -> Reply | None:
    """The answer to a request the fakes do not take, or None."""
    if incoming.method not in METHODS:
        return json_reply(501, {"error": f"method {incoming.method} not supported"})
    if "chunked" in incoming.headers.get("Transfer-Encoding", "").lower():
        return json_reply(411, {"error": "Content-Length required"})
    return None


async def _request(incoming: web.BaseRequest) -> Request:
    """The request as a route's handler reads it: its raw (still percent-encoded) path, the first value of each
    query parameter and header (names in lower case), the body and its JSON object."""
    # keep_blank_values: `?ref=` asks for the value "" rather than for no value.
    query = {name: values[0] for name, values in parse_qs(incoming.query_string, keep_blank_values=True).items()}
    headers: dict[str, str] = {}
    for name, value in incoming.headers.items():
        headers.setdefault(name.lower(), value)  # the first one wins, as the stdlib's `Message.get` does
    body = await incoming.read()
    return Request(incoming.method, urlsplit(incoming.raw_path).path, query, headers, body, _parse_object(body))


def _response(reply: Reply, *, close: bool) -> web.Response:
    """The answer as aiohttp writes it: JSON unless the reply names its own Content-Type (an empty one: none at
    all); `close` ends the connection after it."""
    headers: CIMultiDict[str] = CIMultiDict(Server=_SERVER)
    content_type = "application/json"
    for name, value in reply.headers:
        if name.lower() == "content-type":
            content_type = value
        else:
            headers.add(name, value)
    if content_type:
        headers["Content-Type"] = content_type
    response = web.Response(status=reply.status, body=reply.body, headers=headers)
    if close:
        response.force_close()
    return response


def _parse_object(body: bytes) -> dict[str, Any] | None:
    """Decode a JSON object body; anything else (empty, invalid, not an object) is None."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None
