"""The OpenTelemetry SDK set up from the standard `OTEL_*` variables: a tracer provider with the process's role as
a resource attribute, a parent-based sampler, and OTLP (HTTP/protobuf) export in batches (service/tracing.py says
what is traced).

Export never blocks or fails a round: spans are batched and exported by the SDK's own thread, and a full queue
drops them. An unreachable collector drops them too, said once per spell (`tracing_export_failed`, then
`tracing_export_resumed` with the count dropped); while it stays unreachable a batch is tried at most every
`_RETRY_SECONDS` and the others are dropped at once, so that a shutdown does not wait on it. The SDK is imported
only here, and this module only when tracing is on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from service.tracing import DERIVED, Tracing, wanted

log = structlog.get_logger("tracing")

# Without OTEL_TRACES_SAMPLER: the producers' sampling decisions followed, no trace started by the service itself. A
# sampled record costs the consumer several times a record's CPU: a 10 % (even a 1 %) sample of the roots costs more
# than the 10 % the service allows its tracing by default (docs/performance.md, Tracing).
DEFAULT_SAMPLER = "parentbased_always_off"
ROLE_ATTRIBUTE = "service.role"  # each process's role (consume, relay, effects, run, reconcile, console, …)
_RETRY_SECONDS = 30.0
_EXPORT_TIMEOUT = 5.0  # seconds; the SDK's default is 10


def configured(program: str, role: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """The process's tracing: off (the default) unless an OTLP endpoint is set and the SDK is not disabled."""
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return Tracing()
    # The exporter's and the batch processor's own lines would repeat every failed batch: ours say it once.
    # (and the SDK's queue says each span it drops: once per spell is ours too).
    for name in ("opentelemetry.exporter.otlp.proto.http", "opentelemetry.sdk"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    attributes = {ROLE_ATTRIBUTE: role}
    if not environ.get("OTEL_SERVICE_NAME", "").strip():
        attributes["service.name"] = program
    provider = TracerProvider(sampler=sampler(environ), resource=Resource.create(attributes), id_generator=DerivedIds())
    # A collector that accepts and never answers holds one export at most this long (unless OTEL_*_TIMEOUT says).
    timeouts = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    timeout = None if any(environ.get(name, "").strip() for name in timeouts) else _EXPORT_TIMEOUT
    provider.add_span_processor(BatchSpanProcessor(Quiet(OTLPSpanExporter(timeout=timeout))))
    instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    closers = []
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)
        closers.append(instrumentor.uninstrument)
    log.info("tracing_on", sampler=environ.get("OTEL_TRACES_SAMPLER") or DEFAULT_SAMPLER, role=role)
    opted_in = {part.strip() for part in environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}
    return Tracing(provider, old_names="messaging/dup" in opted_in, closers=closers)


def sampler(environ: Mapping[str, str]) -> sampling.Sampler:
    """The sampler `OTEL_TRACES_SAMPLER` (and `_ARG`) names, by default parent-based starting no trace of its own;
    never a trace begun by a database query of its own (a heartbeat's, a relay's claim): queries are traced inside
    a record's or a round's span; and a round's write whenever one of its records is traced."""
    if environ.get("OTEL_TRACES_SAMPLER", "").strip():
        return NoQueryRoots(sampling._get_from_env_or_default())
    return NoQueryRoots(sampling.ParentBased(sampling.ALWAYS_OFF))


class DerivedIds(IdGenerator):
    """Random ids, except that a root span started for a record without a producer's trace takes the record's
    derived trace id (service/tracing.py sets `DERIVED` around that one `start_span`)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        derived = DERIVED.get()
        return derived if derived is not None else self._random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return DERIVED.get() is None


class NoQueryRoots(sampling.Sampler):
    """Drops a root span of a database query, samples a root span linked to a sampled span (a round's write of a
    sampled record); asks `inner` about everything else."""

    def __init__(self, inner: sampling.Sampler) -> None:
        self._inner = inner

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> sampling.SamplingResult:
        if not trace.get_current_span(parent_context).get_span_context().is_valid:
            if attributes is not None and ("db.system" in attributes or "db.system.name" in attributes):
                return sampling.SamplingResult(sampling.Decision.DROP)
            if links and any(link.context.trace_flags.sampled for link in links):
                # A round's write that writes a sampled record: traced with it (its links would point nowhere).
                return sampling.SamplingResult(sampling.Decision.RECORD_AND_SAMPLE)
        return self._inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"NoQueryRoots{{{self._inner.get_description()}}}"


class Quiet(SpanExporter):
    """An exporter whose failures are said once per spell, and that drops batches at once while its collector stays
    unreachable (one is tried every `retry_seconds`)."""

    def __init__(self, inner: SpanExporter, retry_seconds: float = _RETRY_SECONDS) -> None:
        self._inner = inner
        self._retry = retry_seconds
        self._lock = threading.Lock()
        self._failing = False
        self._next_try = 0.0
        self.dropped = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            if self._failing and time.monotonic() < self._next_try:
                self.dropped += len(spans)
                return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                if self._failing:
                    log.info("tracing_export_resumed", dropped_spans=self.dropped)
                self._failing, self.dropped = False, 0
            else:
                self.dropped += len(spans)
                if not self._failing:
                    self._failing = True
                    log.warning("tracing_export_failed", detail="the collector cannot be reached: spans are dropped")
                self._next_try = time.monotonic() + self._retry
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
