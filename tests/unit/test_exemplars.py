"""The round latency's exemplar: the trace id of a sampled span, seen in the OpenMetrics exposition only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

from service.health import exposition
from service.metrics import Metrics
from service.tracing import Tracing, current_trace_id

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def tracer(sampler: Sampler) -> trace.Tracer:
    """A tracer of its own provider (never the global one), exporting nowhere."""
    return TracerProvider(sampler=sampler).get_tracer("test")


@pytest.fixture
def sampled_span() -> Iterator[str]:
    """A sampled span, current while the test runs; yields its trace id."""
    with tracer(ALWAYS_ON).start_as_current_span("process orders") as span:
        yield f"{span.get_span_context().trace_id:032x}"


def test_a_round_observed_under_a_sampled_span_carries_its_trace_id_in_the_openmetrics_exposition(
    sampled_span: str,
) -> None:
    metrics = Metrics("orders")

    metrics.round_took(0.02, current_trace_id())

    content_type, body = exposition(metrics, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert f'orders_processing_duration_seconds_bucket{{le="0.025"}} 1.0 # {{trace_id="{sampled_span}"}} 0.02' in (
        body.decode()
    )


def test_the_plain_exposition_has_no_exemplar_even_when_one_was_recorded(sampled_span: str) -> None:
    metrics = Metrics("orders")
    metrics.round_took(0.02, current_trace_id())

    content_type, body = exposition(metrics, "text/plain")

    assert content_type.startswith("text/plain")
    assert b"# {" not in body
    assert b'orders_processing_duration_seconds_bucket{le="0.025"} 1.0' in body


def test_with_tracing_off_no_round_has_an_exemplar() -> None:
    assert not Tracing().enabled
    metrics = Metrics("orders")

    metrics.round_took(0.02, current_trace_id())

    _, body = exposition(metrics, OPENMETRICS)
    assert current_trace_id() is None
    assert b"trace_id" not in body
    assert b'orders_processing_duration_seconds_bucket{le="0.025"} 1.0\n' in body


def test_a_span_that_is_not_sampled_gives_no_trace_id() -> None:
    with tracer(ALWAYS_OFF).start_as_current_span("process orders"):
        assert current_trace_id() is None


def test_a_round_takes_the_trace_id_of_its_first_sampled_span() -> None:
    unsampled = tracer(ALWAYS_OFF).start_span("process orders")
    first, second = (tracer(ALWAYS_ON).start_span("process orders") for _ in range(2))

    chosen = Tracing.sampled_trace_id([unsampled, first, second])

    assert chosen == f"{first.get_span_context().trace_id:032x}"
    assert Tracing.sampled_trace_id([unsampled]) is None
