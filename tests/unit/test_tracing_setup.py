"""Tracing's set-up from the standard OTEL_* variables (service/adapters/otel.py): off unless an OTLP endpoint is
named and the SDK is not disabled; the service name, the role, the sampler; and an exporter whose collector is
unreachable drops spans, says so once, and does not keep a shutdown waiting."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from structlog.testing import capture_logs

from service.adapters import otel
from service.tracing import wanted

ENDPOINT = "http://127.0.0.1:9/"  # the discard port: nothing listens


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_tracing_is_on_only_with_an_otlp_endpoint_and_the_sdk_not_disabled(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


def test_off_is_a_tracing_that_starts_nothing() -> None:
    tracing = otel.configured("order-service", "consume", {})
    assert tracing.enabled is False
    tracing.shutdown()


def test_on_names_the_program_and_the_role_and_follows_its_producers_sampling_by_default() -> None:
    tracing = otel.configured("order-service", "relay", {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT})
    try:
        assert tracing.enabled
        provider = tracing._provider
        assert provider is not None
        assert provider.resource.attributes["service.name"] == "order-service"
        assert provider.resource.attributes["service.role"] == "relay"
        assert provider.sampler.get_description().startswith("NoQueryRoots{ParentBased{root:AlwaysOffSampler,")
        assert tracing.old_names is False
    finally:
        tracing.shutdown()


def test_the_standard_variables_name_the_service_and_the_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
        "OTEL_SERVICE_NAME": "orders-eu",
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http, messaging/dup",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)  # the SDK reads the sampler and the service name from the process
    tracing = otel.configured("order-service", "consume", environ)
    try:
        provider = tracing._provider
        assert provider is not None
        assert provider.resource.attributes["service.name"] == "orders-eu"
        assert "AlwaysOff" in provider.sampler.get_description()
        assert tracing.old_names is True
    finally:
        tracing.shutdown()


class Unreachable(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionRefusedError

    def shutdown(self) -> None:
        pass


def test_an_unreachable_collector_drops_spans_says_so_once_and_is_tried_again_only_later() -> None:
    inner = Unreachable()
    quiet = otel.Quiet(inner, retry_seconds=60)
    with capture_logs() as logs:
        results = [quiet.export([]) for _ in range(5)]
    assert results == [SpanExportResult.FAILURE] * 5
    assert inner.calls == 1  # the others dropped at once: a shutdown does not wait on the collector again
    assert [entry["event"] for entry in logs] == ["tracing_export_failed"]


def test_a_collector_back_is_said_once_with_the_count_dropped() -> None:
    class Flaky(Unreachable):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.calls += 1
            if self.calls == 1:
                raise ConnectionRefusedError
            return SpanExportResult.SUCCESS

    quiet = otel.Quiet(Flaky(), retry_seconds=0.0)
    with capture_logs() as logs:
        quiet.export([])
        assert quiet.export([]) is SpanExportResult.SUCCESS
    assert [entry["event"] for entry in logs] == ["tracing_export_failed", "tracing_export_resumed"]


def test_the_sampler_never_starts_a_trace_at_a_query_and_traces_a_write_whenever_one_of_its_records_is() -> None:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import Decision, ParentBasedTraceIdRatio
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    sampler = otel.NoQueryRoots(ParentBasedTraceIdRatio(0.0))  # no root of its own would be sampled
    sampled = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    unsampled = SpanContext(1, 3, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    root, everything = Context(), otel.NoQueryRoots(ParentBasedTraceIdRatio(1.0))

    assert everything.should_sample(root, 5, "SELECT", attributes={"db.system.name": "postgresql"}).decision is (
        Decision.DROP
    )
    assert sampler.should_sample(root, 5, "write", links=[Link(sampled)]).decision is Decision.RECORD_AND_SAMPLE
    assert sampler.should_sample(root, 5, "write", links=[Link(unsampled)]).decision is Decision.DROP
    assert sampler.should_sample(root, 5, "process orders").decision is Decision.DROP
    assert everything.should_sample(root, 5, "process orders").decision is Decision.RECORD_AND_SAMPLE
