"""A real Jaeger for tracing tests: spans go in over OTLP/HTTP, and come back out through Jaeger's query API as
`Trace` and `Span` values (operation name, span kind, tags, references, the process's service name and tags).

`start_jaeger()` runs `scripts/jaeger-local start` (which builds Jaeger once into the user's cache, or waits for a
build already under way) unless ORDERS_TEST_JAEGER names the description file of a Jaeger already running. The
query helpers exist twice, plain and `..._async`, over the same pure request and parsing functions; `wait_for_trace`
polls until a trace satisfies a predicate or its deadline passes, because Jaeger stores spans asynchronously.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "jaeger-local"
DESCRIPTION_ENV = "ORDERS_TEST_JAEGER"
# A cold build of Jaeger takes minutes; the script bounds its own waits, this only stops a hung one.
START_TIMEOUT_S = 3600.0
REQUEST_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.1
STDERR_TAIL_CHARS = 4000

TracePredicate = Callable[["Trace"], bool]


class JaegerUnavailable(RuntimeError):
    """Jaeger could not be built, started or reached; the message holds what the script or the API said."""


@dataclass(frozen=True)
class Reference:
    """A span's reference to another span: CHILD_OF is its parent, FOLLOWS_FROM one of its OTLP links."""

    ref_type: str
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class Event:
    """A span event (Jaeger's "log"): its name is the `event` field, its attributes the other fields."""

    timestamp_us: int
    fields: Mapping[str, Any]

    @property
    def name(self) -> str | None:
        """The event's name, e.g. `exception` for a recorded exception."""
        name = self.fields.get("event")
        return None if name is None else str(name)


@dataclass(frozen=True)
class Span:
    """One span as the query API returns it, with its process (resource) flattened in; the OTLP status is in the
    tags (`otel.status_code`, and `error` for an error)."""

    trace_id: str
    span_id: str
    operation_name: str
    span_kind: str | None
    tags: Mapping[str, Any]
    references: tuple[Reference, ...]
    events: tuple[Event, ...]
    service_name: str
    process_tags: Mapping[str, Any]
    start_time_us: int
    duration_us: int

    @property
    def parent_span_id(self) -> str | None:
        """The span id of the CHILD_OF reference in the same trace, or None for a root span."""
        return next(
            (ref.span_id for ref in self.references if ref.ref_type == "CHILD_OF" and ref.trace_id == self.trace_id),
            None,
        )

    @property
    def links(self) -> tuple[Reference, ...]:
        """The span's OTLP links (Jaeger shows them as FOLLOWS_FROM references)."""
        return tuple(ref for ref in self.references if ref.ref_type == "FOLLOWS_FROM")


@dataclass(frozen=True)
class Trace:
    """A trace's spans, in the order Jaeger returned them."""

    trace_id: str
    spans: tuple[Span, ...]

    def named(self, operation_name: str) -> list[Span]:
        """The spans with this operation name."""
        return [span for span in self.spans if span.operation_name == operation_name]

    def one(self, operation_name: str) -> Span:
        """The only span with this operation name; an AssertionError names the trace's operations otherwise."""
        found = self.named(operation_name)
        if len(found) != 1:
            raise AssertionError(
                f"expected one span {operation_name!r} in trace {self.trace_id}, found {len(found)} "
                f"(operations: {self.operations()})"
            )
        return found[0]

    def operations(self) -> list[str]:
        """The operation names of the trace's spans, sorted: a summary for assertion messages."""
        return sorted(span.operation_name for span in self.spans)

    @property
    def services(self) -> set[str]:
        """The service names of the processes that sent the trace's spans."""
        return {span.service_name for span in self.spans}


# ---------------------------------------------------------------- pure: identifiers and parsing


def trace_id_hex(trace_id: str | int) -> str:
    """A trace id as 32 lower-case hex digits: Jaeger drops leading zeros, OTLP and W3C keep them."""
    value = trace_id if isinstance(trace_id, int) else int(trace_id, 16)
    return f"{value:032x}"


def span_id_hex(span_id: str | int) -> str:
    """A span id as 16 lower-case hex digits."""
    value = span_id if isinstance(span_id, int) else int(span_id, 16)
    return f"{value:016x}"


def tags_of(items: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Jaeger's `[{"key", "type", "value"}]` list as a dict (values as Jaeger typed them)."""
    return {item["key"]: item["value"] for item in items or ()}


def parse_trace(data: Mapping[str, Any]) -> Trace:
    """One trace of the query API's `data` array (`/api/traces` or `/api/traces/<id>`)."""
    processes = data.get("processes") or {}
    spans = []
    for raw in data.get("spans") or ():
        process = processes.get(raw.get("processID"), {})
        tags = tags_of(raw.get("tags"))
        spans.append(
            Span(
                trace_id=trace_id_hex(raw["traceID"]),
                span_id=span_id_hex(raw["spanID"]),
                operation_name=raw["operationName"],
                span_kind=tags.get("span.kind"),
                tags=tags,
                references=tuple(
                    Reference(ref["refType"], trace_id_hex(ref["traceID"]), span_id_hex(ref["spanID"]))
                    for ref in raw.get("references") or ()
                ),
                events=tuple(
                    Event(int(event.get("timestamp", 0)), tags_of(event.get("fields")))
                    for event in raw.get("logs") or ()
                ),
                service_name=process.get("serviceName", ""),
                process_tags=tags_of(process.get("tags")),
                start_time_us=int(raw.get("startTime", 0)),
                duration_us=int(raw.get("duration", 0)),
            )
        )
    return Trace(trace_id=trace_id_hex(data["traceID"]), spans=tuple(spans))


def _trace_from_answer(response: httpx.Response) -> Trace | None:
    """The answer to `/api/traces/<id>`: None while Jaeger has none of its spans (a 404)."""
    if response.status_code == httpx.codes.NOT_FOUND:
        return None
    response.raise_for_status()
    found = response.json().get("data") or []
    return parse_trace(found[0]) if found else None


def _traces_from_answer(response: httpx.Response) -> list[Trace]:
    """The answer to `/api/traces?service=...`."""
    response.raise_for_status()
    return [parse_trace(data) for data in response.json().get("data") or []]


def _services_from_answer(response: httpx.Response) -> list[str]:
    """The answer to `/api/services`, sorted."""
    response.raise_for_status()
    return sorted(response.json().get("data") or [])


def _search_params(
    service: str, operation: str | None, tags: Mapping[str, str] | None, limit: int
) -> dict[str, str | int]:
    """Query parameters of a trace search; `tags` must all match (Jaeger takes them as one JSON object)."""
    params: dict[str, str | int] = {"service": service, "limit": limit}
    if operation is not None:
        params["operation"] = operation
    if tags:
        params["tags"] = json.dumps(dict(tags))
    return params


def _describe(trace: Trace | None) -> str:
    """A trace as an assertion message shows it: its services and operation names (never a tag's value)."""
    if trace is None:
        return "no span of it yet"
    return f"services {sorted(trace.services)}, operations {trace.operations()}"


def _any_trace(_: Trace) -> bool:
    return True


# ---------------------------------------------------------------- Jaeger


@dataclass(frozen=True)
class Jaeger:
    """A running Jaeger: where to send OTLP/HTTP and how to query what it stored."""

    otlp_endpoint: str
    query_url: str
    version: str = ""

    @classmethod
    def load(cls, path: Path) -> Jaeger:
        """The Jaeger a description file (written by `scripts/jaeger-local start`) describes."""
        data = json.loads(path.read_text())
        return cls(otlp_endpoint=data["otlp_endpoint"], query_url=data["query_url"], version=data.get("version", ""))

    @property
    def otlp_traces_url(self) -> str:
        """The OTLP/HTTP traces URL (what OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names)."""
        return f"{self.otlp_endpoint}/v1/traces"

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.query_url, timeout=REQUEST_TIMEOUT_S)

    def _async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.query_url, timeout=REQUEST_TIMEOUT_S)

    # ---- plain

    def services(self) -> list[str]:
        """The service names Jaeger has spans of."""
        with self._client() as client:
            return _services_from_answer(client.get("/api/services"))

    def trace(self, trace_id: str | int) -> Trace | None:
        """The trace with this id, or None if Jaeger has none of its spans."""
        with self._client() as client:
            return _trace_from_answer(client.get(f"/api/traces/{trace_id_hex(trace_id)}"))

    def traces(
        self, service: str, *, operation: str | None = None, tags: Mapping[str, str] | None = None, limit: int = 100
    ) -> list[Trace]:
        """The traces with a span of `service` (and `operation`, and all `tags`), newest first."""
        with self._client() as client:
            return _traces_from_answer(
                client.get("/api/traces", params=_search_params(service, operation, tags, limit))
            )

    def wait_for_trace(
        self, trace_id: str | int, predicate: TracePredicate = _any_trace, *, timeout: float = 30.0
    ) -> Trace:
        """The trace once `predicate` holds for it (e.g. all its spans arrived); AssertionError at the deadline."""
        deadline = time.monotonic() + timeout
        trace: Trace | None = None
        with self._client() as client:
            while True:
                trace = _trace_from_answer(client.get(f"/api/traces/{trace_id_hex(trace_id)}"))
                if trace is not None and predicate(trace):
                    return trace
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"trace {trace_id_hex(trace_id)} not as expected within {timeout}s: {_describe(trace)}")

    # ---- async

    async def services_async(self) -> list[str]:
        """`services`, without blocking the event loop."""
        async with self._async_client() as client:
            return _services_from_answer(await client.get("/api/services"))

    async def trace_async(self, trace_id: str | int) -> Trace | None:
        """`trace`, without blocking the event loop."""
        async with self._async_client() as client:
            return _trace_from_answer(await client.get(f"/api/traces/{trace_id_hex(trace_id)}"))

    async def traces_async(
        self, service: str, *, operation: str | None = None, tags: Mapping[str, str] | None = None, limit: int = 100
    ) -> list[Trace]:
        """`traces`, without blocking the event loop."""
        async with self._async_client() as client:
            return _traces_from_answer(
                await client.get("/api/traces", params=_search_params(service, operation, tags, limit))
            )

    async def wait_for_trace_async(
        self, trace_id: str | int, predicate: TracePredicate = _any_trace, *, timeout: float = 30.0
    ) -> Trace:
        """`wait_for_trace`, without blocking the event loop (the service under test may run in it)."""
        deadline = time.monotonic() + timeout
        trace: Trace | None = None
        async with self._async_client() as client:
            while True:
                trace = _trace_from_answer(await client.get(f"/api/traces/{trace_id_hex(trace_id)}"))
                if trace is not None and predicate(trace):
                    return trace
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"trace {trace_id_hex(trace_id)} not as expected within {timeout}s: {_describe(trace)}")


def start_jaeger() -> Jaeger:
    """The Jaeger ORDERS_TEST_JAEGER describes, or else the one `scripts/jaeger-local start` starts (or finds
    running); JaegerUnavailable, with the script's last words (a failed build's log tail), when there is none."""
    named = os.environ.get(DESCRIPTION_ENV)
    if named:
        description = Path(named)
    else:
        result = subprocess.run(
            [str(SCRIPT), "start"], capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S
        )
        if result.returncode != 0:
            raise JaegerUnavailable(
                f"scripts/jaeger-local start failed (exit {result.returncode}):\n{result.stderr[-STDERR_TAIL_CHARS:]}"
            )
        # The script's last stdout line is the description's path.
        description = Path(result.stdout.strip().rpartition("\n")[2])
    try:
        jaeger = Jaeger.load(description)
        jaeger.services()
    except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
        raise JaegerUnavailable(f"no Jaeger as {description} describes it: {exc!r}") from exc
    return jaeger
