"""`/metrics`, `/healthz` and `/readyz` on ORDERS_METRICS_PORT, served from the process's own event loop.

Answering at all proves the loop is alive (`/healthz`); `/readyz` also checks PostgreSQL and Kafka. `/metrics` answers
in the OpenMetrics format to a scraper that asks for it (`Accept: application/openmetrics-text`, as Prometheus does
with exemplar storage on): only that format carries the latency histogram's exemplars (trace ids); any other request
gets the plain text format.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import choose_encoder

from service.metrics import Metrics

log = structlog.get_logger("health")

ReadinessCheck = Callable[[], Awaitable[bool]]


class HealthServer:
    """A minimal HTTP/1.0 server: three GET paths, no keep-alive, nothing else."""

    def __init__(self, metrics: Metrics, ready: ReadinessCheck, port: int, host: str = "0.0.0.0") -> None:
        self._metrics = metrics
        self._ready = ready
        self._port = port
        self._host = host
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0... which disables it; see `start`)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen, unless the port is 0 (disabled: several processes on one host in tests)."""
        if self._port == 0:
            return
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("health_server_started", port=self._port)

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].decode("ascii", "replace") if request.count(b" ") >= 2 else ""
            status, content_type, body = await self._route(path.split("?", 1)[0], _header(request, b"accept"))
            head = f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, path: str, accept: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            content_type, body = exposition(self._metrics, accept)
            return "200 OK", content_type, body
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ready = await self._ready()
            return (
                ("200 OK", "text/plain", b"ready\n")
                if ready
                else ("503 Service Unavailable", "text/plain", b"not ready\n")
            )
        return "404 Not Found", "text/plain", b"not found\n"


def exposition(metrics: Metrics, accept: str) -> tuple[str, bytes]:
    """The metrics in the format `accept` asks for: OpenMetrics (with exemplars) when it names it, else plain text."""
    encode, content_type = choose_encoder(accept)
    if content_type.startswith("application/openmetrics-text"):
        return content_type, encode(metrics.registry)
    return CONTENT_TYPE_LATEST, generate_latest(metrics.registry)


def _header(request: bytes, name: bytes) -> str:
    """A request header's value (the first, case-insensitive), or "" without it."""
    for line in request.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""
