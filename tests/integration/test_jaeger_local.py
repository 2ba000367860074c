"""The tracing tests' Jaeger itself (scripts/jaeger-local, tests/support/jaeger.py), with no service: spans sent as
one OTLP/HTTP JSON request come back through the query API with their kind, attributes, parent, link and resource."""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support.jaeger import Jaeger, Trace

pytestmark = pytest.mark.slow

SPAN_KIND_SERVER = 2
SPAN_KIND_PRODUCER = 4


def string_attributes(values: dict[str, str]) -> list[dict[str, Any]]:
    """OTLP JSON attributes (`KeyValue`s with string values)."""
    return [{"key": key, "value": {"stringValue": value}} for key, value in values.items()]


def otlp_request(service: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An OTLP `ExportTraceServiceRequest` in the OTLP JSON encoding: one resource (the service), one scope."""
    resource = string_attributes({"service.name": service, "deployment.environment": "test"})
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": resource},
                "scopeSpans": [{"scope": {"name": "tests.jaeger-local"}, "spans": spans}],
            }
        ]
    }


def otlp_span(trace_id: str, span_id: str, name: str, kind: int, **fields: Any) -> dict[str, Any]:
    """One OTLP JSON span that lasted a millisecond until now (ids as hex, as the JSON encoding has them)."""
    end = time.time_ns()
    return {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(end - 1_000_000),
        "endTimeUnixNano": str(end),
        **fields,
    }


def both_spans(trace: Trace) -> bool:
    return len(trace.spans) == 2


def test_spans_sent_over_otlp_http_come_back_through_the_query_api(jaeger: Jaeger) -> None:
    # Given a trace of two spans: a server span and its producer child, which links to a span of another trace
    service = f"jaeger-local-test-{uuid.uuid4().hex[:8]}"
    trace_id, server_id, producer_id = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
    linked_trace, linked_span = secrets.token_hex(16), secrets.token_hex(8)
    spans = [
        otlp_span(trace_id, server_id, "POST /orders", SPAN_KIND_SERVER, attributes=string_attributes({"a": "b"})),
        otlp_span(
            trace_id,
            producer_id,
            "orders.events publish",
            SPAN_KIND_PRODUCER,
            parentSpanId=server_id,
            attributes=string_attributes({"messaging.system": "kafka"}),
            links=[{"traceId": linked_trace, "spanId": linked_span}],
            events=[
                {"timeUnixNano": str(time.time_ns()), "name": "retry", "attributes": string_attributes({"n": "1"})}
            ],
            status={"code": 2, "message": "broker down"},
        ),
    ]

    # When they are sent as one OTLP/HTTP JSON request
    answer = httpx.post(jaeger.otlp_traces_url, json=otlp_request(service, spans), timeout=5.0)
    assert answer.status_code == 200, answer.text

    # Then the query API returns both, as they were sent
    trace = jaeger.wait_for_trace(trace_id, both_spans, timeout=30.0)
    server, producer = trace.one("POST /orders"), trace.one("orders.events publish")
    assert (server.trace_id, server.span_id, server.span_kind) == (trace_id, server_id, "server")
    assert server.parent_span_id is None
    assert server.tags["a"] == "b"
    assert server.tags["otel.scope.name"] == "tests.jaeger-local"
    assert (producer.span_id, producer.span_kind, producer.parent_span_id) == (producer_id, "producer", server_id)
    assert producer.tags["messaging.system"] == "kafka"
    assert [(link.trace_id, link.span_id) for link in producer.links] == [(linked_trace, linked_span)]
    assert [(event.name, event.fields["n"]) for event in producer.events] == [("retry", "1")]
    assert (producer.tags["otel.status_code"], producer.tags["error"]) == ("ERROR", True)
    assert "error" not in server.tags
    assert server.service_name == producer.service_name == service
    assert server.process_tags["deployment.environment"] == "test"
    assert server.duration_us == 1000
    # and a search by service finds the trace, and the service is listed
    assert [found.trace_id for found in jaeger.traces(service)] == [trace_id]
    assert [found.trace_id for found in jaeger.traces(service, operation="POST /orders", tags={"a": "b"})] == [trace_id]
    assert jaeger.traces(service, tags={"a": "not b"}) == []
    assert service in jaeger.services()


async def test_the_async_helpers_find_a_trace_too(jaeger: Jaeger) -> None:
    service = f"jaeger-local-test-{uuid.uuid4().hex[:8]}"
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    assert await jaeger.trace_async(trace_id) is None

    async with httpx.AsyncClient(timeout=5.0) as client:
        request = otlp_request(service, [otlp_span(trace_id, span_id, "consume", SPAN_KIND_SERVER)])
        answer = await client.post(jaeger.otlp_traces_url, json=request)
    assert answer.status_code == 200, answer.text

    trace = await jaeger.wait_for_trace_async(trace_id, timeout=30.0)
    assert [(span.span_id, span.service_name) for span in trace.spans] == [(span_id, service)]
    assert [found.trace_id for found in await jaeger.traces_async(service)] == [trace_id]
    assert service in await jaeger.services_async()
