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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from service.addresses import OTLP_ENDPOINTS
from service.policy import traces
from service.policy.records import trace_id_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from service.policy.delivery import Delivery
    from service.store.outbox import ClaimedRow

FAILURE_ID = "failure.id"  # a record's failure id, `<topic>/<partition>/<offset>` where it was first read
_SCOPE = "service.tracing"  # the instrumentation scope: the core's spans
# The trace id the next root span takes (a record's derived one), read by the id generator (service/adapters/otel.py)
DERIVED: ContextVar[int | None] = ContextVar("derived_trace_id", default=None)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether tracing is on with this environment: an OTLP endpoint set, and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in OTLP_ENDPOINTS)


class Tracing:
    """The process's tracer: spans for the workers, or nothing at all (`enabled` False)."""

    def __init__(
        self,
        provider: TracerProvider | None = None,
        *,
        old_names: bool = False,
        closers: Sequence[Callable[[], object]] = (),
    ) -> None:
        self._provider = provider
        self._closers = closers  # what undoes the set-up at shutdown (asyncpg's instrumentation)
        # OTEL_SEMCONV_STABILITY_OPT_IN=messaging/dup: the attributes also under their names before the messaging
        # conventions' 1.26 (for a backend whose queries still use them).
        self.old_names = old_names
        self.enabled = provider is not None
        self._tracer: Tracer | None = provider.get_tracer(_SCOPE) if provider is not None else None
        self._root: Any = None
        self._sampler: Any = provider.sampler if provider is not None else None
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
            for close in self._closers:
                close()
            self._provider = None
            self._tracer = None
            self.enabled = False

    # -- the consumer ------------------------------------------------------------------------------------------

    def process(self, deliveries: Sequence[Delivery], group: str) -> dict[Delivery, Span]:
        """Start a `process <topic>` span for each delivery of a round the sampler traces; its record's `span`
        becomes the span's context (so that what the attempt writes carries it), None for one not traced."""
        from opentelemetry import trace as api

        # Every record pays this loop, sampled or not: what only a recorded span needs waits for `is_recording`
        # (docs/performance.md, "Tracing").
        tracer, root, consumer, link = self.tracer, self._root, api.SpanKind.CONSUMER, api.Link
        names: dict[str, str] = {}
        spans: dict[Delivery, Span] = {}
        sampler = self._sampler
        for delivery in deliveries:
            record = delivery.record
            parent = traces.parse(record.raw_header("traceparent"))
            name = names.get(record.topic) or names.setdefault(record.topic, f"process {record.topic}")
            if parent is not None:
                # The producer's span as the parent, and nothing else of the current context.
                context = api.set_span_in_context(api.NonRecordingSpan(_context(parent, api)), root)
                trace_id = int(parent.trace_id, 16)
            else:
                context, trace_id = root, int(trace_id_of(record, group), 16)
            # The sampler's word first: most records are not traced, and the SDK's span costs them several µs for
            # nothing. An attempt not traced has no span and no context to pass on (none of its record's attempts
            # is traced: the sampler sees one trace id and one parent for them all).
            if not sampler.should_sample(context, trace_id, name, consumer).decision.is_sampled():
                record.span = None
                continue
            # The attempt before: this one's in memory, a parked record's, or a copy's header (a tier's, a
            # reprocess's; a source record's header of that name is its producer's, not ours: not trusted).
            copied = delivery.in_tier or delivery.reprocess
            before = traces.parse(
                record.span or record.link or (record.raw_header(traces.SPAN_HEADER) if copied else None)
            )
            links = [link(_context(before, api))] if before is not None else ()
            if parent is not None:
                span = tracer.start_span(name, context, consumer, links=links)
            else:
                # A root in the record's own trace: the id generator takes it (service/adapters/otel.py).
                token = DERIVED.set(trace_id)
                try:
                    span = tracer.start_span(name, root, consumer, links=links)
                finally:
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
                if record.key_text is not None:  # the Kafka key, only as text (not the ordering key: a payload's)
                    span.set_attribute("messaging.kafka.message.key", record.key_text)
                if self.old_names:
                    span.set_attributes(
                        {
                            "messaging.operation": "process",
                            "messaging.kafka.consumer.group": group,
                            "messaging.kafka.destination.partition": record.partition,
                            "messaging.kafka.message.offset": record.offset,
                        }
                    )
            record.span = header(span)
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
        if not links:  # none of its records is traced: neither is the write (nor its queries)
            yield
            return
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

    # -- the relay, the effect worker, the reconciler, the HTTP client -------------------------------------------

    def sends(self, rows: Sequence[ClaimedRow]) -> Sends:
        """Start a `send <topic>` span (PRODUCER) for each row of a relay batch that carries a trace context, and
        put the span's context in the row's headers (service/policy/propagation.py); `Sends` ends them."""
        return Sends(self.tracer, rows)

    @contextmanager
    def continuing(self, name: str, parent: str | None, attributes: Mapping[str, str | int]) -> Iterator[Span | None]:
        """An INTERNAL span `name` continuing `parent` (a row's `trace_context`), current while the block runs (its
        HTTP calls' spans are its children) and ended after it (an exception's class its `error.type`). None, and
        no span, without a well-formed parent: what was written while tracing was off starts no trace of its own."""
        ref = traces.parse(parent)
        if ref is None:
            yield None
            return
        from opentelemetry import context, trace
        from opentelemetry.trace import NonRecordingSpan, SpanKind

        remote = trace.set_span_in_context(NonRecordingSpan(_context(ref)))
        span = self.tracer.start_span(name, remote, SpanKind.INTERNAL, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield span
        except BaseException as error:
            _failed(span, type(error).__name__)
            raise
        finally:
            context.detach(token)
            span.end()

    @contextmanager
    def requesting(self, method: str, host: str, port: int) -> Iterator[Span | None]:
        """An HTTP request's CLIENT span, named by its method (HTTP semantic conventions), a child of the current
        span, ended after the block (an exception's class its `error.type`). None, and no span, while no span is
        current: a request outside a record's, an effect's or a look-up's span starts no trace of its own."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        if not trace.get_current_span().get_span_context().is_valid:
            yield None
            return
        # Never `url.full` nor the path: a path holds ids taken from records and effects (an aggregate's, a key).
        attributes: dict[str, str | int] = {"http.request.method": method, "server.address": host, "server.port": port}
        span = self.tracer.start_span(method, kind=SpanKind.CLIENT, attributes=attributes)
        try:
            yield span
        except BaseException as error:
            _failed(span, type(error).__name__)
            raise
        finally:
            span.end()

    @staticmethod
    def answered(span: Span, status: int) -> None:
        """An HTTP answer's status on its CLIENT span: 4xx and 5xx are errors of a client's request, their
        `error.type` the status (HTTP semantic conventions)."""
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                _failed(span, str(status))

    @staticmethod
    def outcome(span: Span | None, outcome: str, code: str | None = None) -> None:
        """A span's `outcome`, and its error code (`error.type`, its status an error) when it failed."""
        if span is not None and span.is_recording():
            span.set_attribute("outcome", outcome)
            if code is not None:
                _failed(span, code)


def header(span: Span) -> str:
    """A span's context as `traceparent` text (what rows and headers carry)."""
    from opentelemetry.trace import TraceFlags

    spanned = span.get_span_context()
    sampled = bool(spanned.trace_flags & TraceFlags.SAMPLED)
    return traces.SpanRef(f"{spanned.trace_id:032x}", f"{spanned.span_id:016x}", sampled).header


class Sends:
    """The `send <topic>` spans of a relay batch's rows, by position in the batch: each ends when the broker
    acknowledged its row, or refused it (`error.type` the row's set-aside code), or when the batch ends without
    publishing it (`error.type` what stopped it). A row without a trace context (written while tracing was off) has
    none: less noise than a root per row."""

    def __init__(self, tracer: Tracer, rows: Sequence[ClaimedRow]) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanKind

        from service.policy.propagation import propagated

        self._spans: dict[int, Span] = {}
        self._positions = {row.id: index for index, row in enumerate(rows)}
        for index, row in enumerate(rows):
            parent = traces.parse(row.trace_context)
            if parent is None:
                continue
            remote = trace.set_span_in_context(NonRecordingSpan(_context(parent)))
            span = tracer.start_span(f"send {row.topic}", remote, SpanKind.PRODUCER, attributes=_send_attributes(row))
            row.headers = propagated(row.headers, copy=row.copy, context=header(span))
            self._spans[index] = span

    def acknowledged(self, index: int, partition: int) -> None:
        """The broker took the batch's row at `index`, on `partition`."""
        span = self._spans.pop(index, None)
        if span is not None:
            if span.is_recording():
                span.set_attribute("messaging.destination.partition.id", str(partition))
            span.end()

    def took(self, row: ClaimedRow, partition: int) -> None:
        """The broker took `row` (sent alone), on `partition`."""
        self.acknowledged(self._positions[row.id], partition)

    def failed(self, row: ClaimedRow, code: str) -> None:
        """`row` was not published: refused (its set-aside code), or stopped by `code`."""
        span = self._spans.pop(self._positions[row.id], None)
        if span is not None:
            _failed(span, code)
            span.end()

    def close(self, code: str) -> None:
        """End the spans of the rows the batch did not publish, with `code` (what ended it)."""
        spans, self._spans = self._spans, {}
        for span in spans.values():
            _failed(span, code)
            span.end()


def _send_attributes(row: ClaimedRow) -> dict[str, AttributeValue]:
    """A row's `send` span's attributes: its coordinates, its text key, its message id and failure id; never its
    payload nor another header's value."""
    from service.policy.records import message_id_of, text_of, unpack_key

    attributes: dict[str, AttributeValue] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": row.topic,
    }
    # The Kafka key as text: a copy's own (`kafka_key`, packed), never its ordering key (which may be a payload's).
    key = row.key if row.kafka_key is None else text_of(unpack_key(row.kafka_key))
    if key is not None:
        attributes["messaging.kafka.message.key"] = key
    message_id = failure_id = None
    for name, value in row.headers:
        if name == "message-id" and message_id is None:
            message_id = message_id_of(value)
        elif name == "failure-id" and failure_id is None:
            failure_id = text_of(value)
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    if failure_id is not None:
        attributes[FAILURE_ID] = failure_id
    return attributes


def _failed(span: Span, code: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    if span.is_recording():
        span.set_attribute("error.type", code)
        span.set_status(Status(StatusCode.ERROR))


def _context(ref: traces.SpanRef, api: Any = None) -> Any:
    """`ref` as a remote span context; `api` is `opentelemetry.trace`, imported once by the caller (a round's
    records are many), or imported here."""
    if api is None:
        from opentelemetry import trace as api
    flags = api.TraceFlags(api.TraceFlags.SAMPLED if ref.sampled else api.TraceFlags.DEFAULT)
    return api.SpanContext(int(ref.trace_id, 16), int(ref.span_id, 16), is_remote=True, trace_flags=flags)


def current_trace_id() -> str | None:
    """The trace id of the current span when it is sampled (an exemplar's); None otherwise."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid and context.trace_flags.sampled else None
