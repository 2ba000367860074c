"""The stdlib HTTP plumbing under the fault-injection server: threads, keep-alive, framing, cut connections.

It parses each request into a `Request`, asks the server's `answer` function what to do and does it: send a
`Reply`, cut the connection without a byte, or just close it. It knows nothing of routes or faults.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from service.testing.routes import Reply, Request, json_reply

# "cut": drop the connection without answering; "close": answer nothing because the server is stopping.
Hangup = Literal["cut", "close"]
Outcome = Reply | Hangup
Answer = Callable[[Request, threading.Event], Outcome]

# An idle keep-alive connection holds a handler thread; a long-running demo must not accumulate them forever.
_IDLE_CONNECTION_TIMEOUT_S: Final = 60.0
# stop() must not hang on a wedged handler; they are daemon threads, so giving up on one is harmless.
_HANDLER_JOIN_TIMEOUT_S: Final = 2.0


class HttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that hands every request to one `answer` function and can drop every connection."""

    # Handler threads must never keep the interpreter (a test run, the demo) alive.
    daemon_threads = True
    # A worker opens its pool's connections in one burst: socketserver's default backlog of 5 would refuse some,
    # and a call refused mid-way ends `uncertain`, a failure of the fake rather than of the worker it measures.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], answer: Answer) -> None:
        """Bind and listen."""
        super().__init__(address, _Handler)
        self.answer = answer
        # Set on stop so delayed answers wake up instead of outliving the server.
        self.stopping = threading.Event()
        self._connections_lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}

    def track(self, connection: socket.socket) -> None:
        """Remember a connection being served by the current thread."""
        with self._connections_lock:
            self._connections[connection] = threading.current_thread()

    def untrack(self, connection: socket.socket) -> None:
        """Forget a connection whose handler is done."""
        with self._connections_lock:
            self._connections.pop(connection, None)

    def close_connections(self) -> None:
        """Wake delayed answers, shut every open connection down and wait briefly for their handlers."""
        self.stopping.set()
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            # Unblocks a handler waiting for the next keep-alive request (its read returns EOF); OSError means
            # the client closed it first.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join(_HANDLER_JOIN_TIMEOUT_S)


class _Handler(BaseHTTPRequestHandler):
    """Serves one connection's requests, each as its server's `answer` says."""

    # HTTP/1.1 gives keep-alive, which pooled clients use; every answer has Content-Length.
    protocol_version = "HTTP/1.1"
    server_version = "fault-server/1"
    sys_version = ""
    timeout = _IDLE_CONNECTION_TIMEOUT_S
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK
    # (~40 ms per answer), which would make every test and the demo crawl.
    disable_nagle_algorithm = True
    server: HttpServer

    def setup(self) -> None:
        """Track the connection so stop() can close it."""
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        """Untrack the connection."""
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def handle(self) -> None:
        """Serve requests until the connection closes."""
        try:
            super().handle()
        except OSError:
            # Clients that time out or are cut hang up mid-answer: the faults cause it, it is no error.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Stay silent: per-request logging would drown test and demo output."""

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self._dispatch()

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self._dispatch()

    def do_PUT(self) -> None:
        """Dispatch a PUT."""
        self._dispatch()

    def do_PATCH(self) -> None:
        """Dispatch a PATCH."""
        self._dispatch()

    def do_DELETE(self) -> None:
        """Dispatch a DELETE."""
        self._dispatch()

    def _dispatch(self) -> None:
        """Parse one request, ask for its outcome and carry it out."""
        body = self._read_body()
        if body is None:
            return
        parts = urlsplit(self.path)
        # keep_blank_values: `?ref=` asks for the value "" rather than for no value.
        query = {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
        request = Request(self.command, parts.path, query, _headers(self.headers), body, _parse_object(body))
        outcome = self.server.answer(request, self.server.stopping)
        if outcome == "cut":
            self._cut()
        elif outcome == "close":
            self.close_connection = True
        else:
            self._send(outcome)

    def _read_body(self) -> bytes | None:
        """Read the request body by Content-Length; answer and return None when it cannot be framed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # Without Content-Length the request cannot be skipped, so the connection cannot be reused.
            self._send(json_reply(411, {"error": "Content-Length required"}), close=True)
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self._send(json_reply(400, {"error": "invalid Content-Length"}), close=True)
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, reply: Reply, close: bool = False) -> None:
        """Write a complete answer with Content-Length so keep-alive clients can frame it."""
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")  # also sets close_connection
        self.end_headers()
        self.wfile.write(reply.body)

    def _cut(self) -> None:
        """Drop the connection without a byte of answer, like a provider crashing or a proxy resetting."""
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may already have hung up
            self.connection.shutdown(socket.SHUT_RDWR)


def _headers(message: Message) -> dict[str, str]:
    """Header values by lower-cased name; the first wins when one was sent twice, as `Message.get` does."""
    headers: dict[str, str] = {}
    for name, value in message.items():
        headers.setdefault(name.lower(), value)
    return headers


def _parse_object(body: bytes) -> dict[str, Any] | None:
    """Decode a JSON object body; anything else (empty, invalid, not an object) is None."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None
