"""Tracing: OpenTelemetry spans on the messaging conventions, exported over OTLP (HTTP/protobuf).

On only when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
and the SDK is not disabled (`OTEL_SDK_DISABLED`); the standard `OTEL_*` variables configure the rest (service
name, resource attributes, sampler, exporter, batch processor). Off, `Tracing.enabled` is False and the workers
skip every call here: the hot path then pays one attribute read per round.

The spans (docs/tracing.md): `process <topic>` (CONSUMER) per record and attempt, continuing the producer's
`traceparent` or rooted in the record's derived trace id (service/policy/traces.py), linked to the attempt before
it; its look-ups' HTTP client spans and its share of the round's write as children; the round's write, one span
linking to its records' process spans; `send <topic>` (PRODUCER) per published outbox row; an effect's provider
call; the reconciler's look-ups. A span takes from a record only its coordinates, its text key, its message id and
its failure id: never a payload, a header value or a secret.

The provider, its sampler and its exporter are set up by service/adapters/otel.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from service.policy import traces

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from service.policy.delivery import Delivery

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
FAILURE_ID = "failure.id"  # a record's failure id, `<topic>/<partition>/<offset>` where it was first read
_SCOPE = "service.tracing"  # the instrumentation scope: the core's spans
# The trace id the next root span takes (a record's derived one), read by the id generator (service/adapters/otel.py)
DERIVED: ContextVar[int | None] = ContextVar("derived_trace_id", default=None)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether tracing is on with this environment: an OTLP endpoint set, and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in _ENDPOINTS)


class Tracing:
    """The process's tracer: spans for the workers, or nothing at all (`enabled` False)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self.enabled = provider is not None
        self._tracer: Tracer | None = provider.get_tracer(_SCOPE) if provider is not None else None
        self._root: Any = None
        if provider is not None:
            from opentelemetry.context import Context

            self._root = Context()  # an empty context: a span started in it is a root, whatever is current

    @property
    def tracer(self) -> Tracer:
        """The tracer (only while `enabled`)."""
        assert self._tracer is not None
        return self._tracer

    def shutdown(self) -> None:
        """Export what is left (bounded by the exporter's timeout) and stop."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None
            self.enabled = False

    # -- the consumer ------------------------------------------------------------------------------------------

    def process(self, deliveries: Sequence[Delivery], group: str) -> dict[Delivery, Span]:
        """Start a `process <topic>` span for each delivery of a round; its record's `span` becomes the span's
        context (so that what the attempt writes carries it)."""
        from opentelemetry import trace as api

        # Every record pays this loop, sampled or not: what only a recorded span needs waits for `is_recording`
        # (docs/performance.md, "Tracing").
        tracer, root, consumer, link = self.tracer, self._root, api.SpanKind.CONSUMER, api.Link
        names: dict[str, str] = {}
        spans: dict[Delivery, Span] = {}
        for delivery in deliveries:
            record = delivery.record
            parent = traces.parse(record.raw_header("traceparent"))
            before = traces.parse(record.span or record.link or record.raw_header(traces.SPAN_HEADER))
            links = [link(_context(before, api))] if before is not None else ()
            name = names.get(record.topic) or names.setdefault(record.topic, f"process {record.topic}")
            if parent is not None:
                # The producer's span as the parent, and nothing else of the current context.
                context = api.set_span_in_context(api.NonRecordingSpan(_context(parent, api)), root)
                span = tracer.start_span(name, context, consumer, links=links)
            else:
                # A root in the record's own trace: the id generator takes it (service/adapters/otel.py).
                token = DERIVED.set(int(record.trace_id or traces.derived_trace_id(group, record.message_id), 16))
                span = tracer.start_span(name, root, consumer, links=links)
                DERIVED.reset(token)
            if span.is_recording():
                origin = delivery.origin
                span.set_attributes(
                    {
                        "messaging.system": "kafka",
                        "messaging.operation.type": "process",
                        "messaging.operation.name": "process",
                        "messaging.destination.name": record.topic,
                        "messaging.consumer.group.name": group,
                        "messaging.destination.partition.id": str(record.partition),
                        "messaging.kafka.offset": record.offset,
                        "messaging.message.id": delivery.message_id,
                        FAILURE_ID: f"{origin[0]}/{origin[1]}/{origin[2]}",
                    }
                )
                if delivery.key is not None:
                    span.set_attribute("messaging.kafka.message.key", delivery.key)
            spanned = span.get_span_context()
            # As `traces.SpanRef(...).header` writes it, without building one per record.
            flags = "01" if spanned.trace_flags.sampled else "00"
            record.span = f"00-{spanned.trace_id:032x}-{spanned.span_id:016x}-{flags}"
            spans[delivery] = span
        return spans

    @contextmanager
    def within(self, span: Span | None) -> Iterator[None]:
        """Make `span` the current one (its look-ups' HTTP spans become its children)."""
        if span is None:
            yield
            return
        from opentelemetry import context, trace

        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    @contextmanager
    def write(self, spans: Mapping[Delivery, Span], writing: Sequence[Delivery]) -> Iterator[None]:
        """The round's write: one span that links to the process spans of the records it writes (not their parent:
        a round serves many traces), current while it runs (the queries' spans are its children); and each
        record's share, a child of its process span linked to it."""
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind

        tracer = self.tracer
        mine = [spans[delivery] for delivery in writing if delivery in spans]
        links = [Link(span.get_span_context()) for span in mine if span.get_span_context().trace_flags.sampled]
        round_span = tracer.start_span("write", self._root, SpanKind.INTERNAL, links=links)
        if round_span.is_recording():
            round_span.set_attributes({"db.system.name": "postgresql", "messaging.batch.message_count": len(writing)})
        shares = []
        for span in mine:
            if span.is_recording():
                share = tracer.start_span(
                    "write",
                    trace.set_span_in_context(span, self._root),
                    SpanKind.INTERNAL,
                    links=[Link(round_span.get_span_context())],
                )
                shares.append(share)
        token = context.attach(trace.set_span_in_context(round_span))
        try:
            yield
        except BaseException as error:
            for span in (round_span, *shares):
                _failed(span, type(error).__name__)
            raise
        finally:
            context.detach(token)
            for span in (*shares, round_span):
                span.end()

    @staticmethod
    def sampled_trace_id(spans: Iterable[Span]) -> str | None:
        """The trace id of the first sampled span (a round's latency exemplar: a round serves many traces); None when
        none is."""
        for span in spans:
            context = span.get_span_context()
            if context.trace_flags.sampled:
                return f"{context.trace_id:032x}"
        return None

    @staticmethod
    def ended(spans: Mapping[Delivery, Span], outcomes: Mapping[Delivery, tuple[str, str | None]]) -> None:
        """End the round's process spans, each with its outcome (`processed`, `rejected`, `quarantined`, `parked`,
        `retry`, `waiting`, …) and error code (`error.type`, the span's status an error)."""
        for delivery, span in spans.items():
            if span.is_recording():
                outcome, code = outcomes.get(delivery, ("not_attempted", None))
                span.set_attribute("outcome", outcome)
                if code is not None:
                    _failed(span, code)
            span.end()


def _failed(span: Span, code: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    if span.is_recording():
        span.set_attribute("error.type", code)
        span.set_status(Status(StatusCode.ERROR))


def _context(ref: traces.SpanRef, api: Any) -> Any:
    """`ref` as a remote span context; `api` is `opentelemetry.trace`, imported once by the caller (a round's
    records are many)."""
    flags = api.TraceFlags(api.TraceFlags.SAMPLED if ref.sampled else api.TraceFlags.DEFAULT)
    return api.SpanContext(int(ref.trace_id, 16), int(ref.span_id, 16), is_remote=True, trace_flags=flags)


def current_trace_id() -> str | None:
    """The trace id of the current span when it is sampled (an exemplar's); None otherwise."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid and context.trace_flags.sampled else None
