"""The spans outside the consumer, on an in-memory exporter: the relay's `send`, an effect's call, the reconciler's
look-up and the HTTP client's request; each continues the context its row carries, says only its coordinates and
outcome, and hands its context on in the headers the rules name."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service.adapters.http import HttpClient
from service.adapters.transport import Answer, Outgoing, TimedOut
from service.config import Topics
from service.orders.settings import OrderSettings
from service.policy import traces
from service.policy.effects import EffectPolicy, Found, Sent
from service.policy.propagation import propagated
from service.ports import EffectRegistry, EffectSpec
from service.store.effects import EffectRow
from service.store.outbox import ClaimedRow
from service.store.reprocess import Candidate, copy_of
from service.tracing import FAILURE_ID, Tracing
from service.worker.effects import EffectWorker
from service.worker.reconciler import Reconciler
from service.worker.relay import Relay

# The contexts rows carry: the attempts that wrote them (sampled).
WRITER = traces.SpanRef("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True)
QUARANTINER = traces.SpanRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)
PRODUCERS = b"00-11111111111111111111111111111111-2222222222222222-01"  # a producer's own traceparent
SECRET = b"card 4111 1111 1111 1111"  # a payload or a header value: never in a span


@pytest.fixture
def traced() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    """Tracing on, its spans kept in memory as each ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Tracing(provider), exporter
    provider.shutdown()


def _values(span: ReadableSpan) -> list[str]:
    return [str(value) for value in (span.attributes or {}).values()]


def _parent_of(span: ReadableSpan) -> traces.SpanRef | None:
    parent = span.parent
    return None if parent is None else traces.SpanRef(f"{parent.trace_id:032x}", f"{parent.span_id:016x}", True)


def _context_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


# -- the header rules -----------------------------------------------------------------------------------------------


def test_a_copy_keeps_every_producer_header_byte_exact_and_its_own_span_header_is_replaced_in_place() -> None:
    headers = (("traceparent", PRODUCERS), (traces.SPAN_HEADER, b"old"), ("raw", b"\xff\x00"), ("message-id", b"M"))

    sent = propagated(headers, copy=True, context="00-new")

    assert sent == (
        ("traceparent", PRODUCERS),
        (traces.SPAN_HEADER, b"00-new"),
        ("raw", b"\xff\x00"),
        ("message-id", b"M"),
    )


def test_a_new_message_gets_traceparent_after_its_headers() -> None:
    sent = propagated((("message-id", b"M"),), copy=False, context="00-new")

    assert sent == (("message-id", b"M"), ("traceparent", b"00-new"))


# -- the relay ------------------------------------------------------------------------------------------------------


def _rows() -> list[ClaimedRow]:
    event_headers = (("event-id", SECRET), ("message-id", b"M-1"), ("event-type", b"order.created"))
    copy_headers = (("traceparent", PRODUCERS), ("message-id", b"M-2"), ("failure-id", b"src/0/7"), ("x", SECRET))
    return [
        ClaimedRow(1, "s.events", "A-1", event_headers, SECRET, b"A-1", WRITER.header, copy=False),
        ClaimedRow(2, "s.retry.30s", "A-2", copy_headers, SECRET, b"\x00", QUARANTINER.header, copy=True),
        ClaimedRow(3, "s.events", "A-3", (("message-id", b"M-3"),), SECRET, b"A-3", None, copy=False),
    ]


def test_a_send_span_continues_its_rows_context_and_its_context_goes_out_where_the_rules_say(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    rows = _rows()
    copy_before = rows[1].headers

    # When the relay starts a batch's spans, and the broker takes the first two rows on partition 2
    sends = tracing.sends(rows)
    sends.acknowledged(0, 2)
    sends.acknowledged(1, 2)
    sends.close("unsent")

    # Then one PRODUCER span per row with a context, each the child of the attempt that wrote it
    event, copy = exporter.get_finished_spans()
    assert [(span.name, span.kind) for span in (event, copy)] == [
        ("send s.events", SpanKind.PRODUCER),
        ("send s.retry.30s", SpanKind.PRODUCER),
    ]
    assert (_parent_of(event), _parent_of(copy)) == (WRITER, QUARANTINER)
    assert event.parent is not None
    assert event.parent.is_remote
    assert dict(copy.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "s.retry.30s",
        "messaging.destination.partition.id": "2",
        "messaging.message.id": "M-2",
        FAILURE_ID: "src/0/7",
    }  # (no key: the copy's own Kafka key is null; its ordering key may be a payload's)
    assert not any(SECRET.decode() in value or "order.created" in value for value in _values(event) + _values(copy))
    # And the new message says its span in `traceparent`; the copy keeps the producer's headers byte-exact and says it
    # in its own header; the row without a context has no span and goes out as it was
    assert rows[0].headers[-1] == ("traceparent", _context_of(event).encode())
    assert rows[1].headers == (*copy_before, (traces.SPAN_HEADER, _context_of(copy).encode()))
    assert rows[2].headers == (("message-id", b"M-3"),)


class _Refusing:
    """A producer whose lone sends are refused as too large for the first row, and taken for the others."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[None]:
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if value == b"large":
            answer.set_exception(MessageSizeTooLargeError())
        else:
            answer.set_result(None)
        return answer


async def test_a_row_sent_alone_ends_its_span_with_the_brokers_answer(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    relay = Relay(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lambda: None,  # type: ignore[arg-type,return-value]
        lambda: _Refusing(),  # type: ignore[arg-type,return-value]
        start_client=None,  # type: ignore[arg-type]
        batch_size=1,
        names=OrderSettings,
        tracing=tracing,
    )
    rows = [ClaimedRow(n, "s.events", "K", (), value, b"K", WRITER.header) for n, value in enumerate([b"large", b"ok"])]

    await relay._one_by_one(rows, tracing.sends(rows))

    refused, taken = exporter.get_finished_spans()
    assert (refused.status.status_code, (refused.attributes or {})["error.type"]) == (
        StatusCode.ERROR,
        "MESSAGE_TOO_LARGE",
    )
    assert (taken.status.status_code, (taken.attributes or {})["messaging.destination.partition.id"]) == (
        StatusCode.UNSET,
        "0",
    )


# -- an effect's call, the reconciler's look-up, and their HTTP requests ----------------------------------------------


class _Transport:
    """Answers every request with `status` (or raises `error`), keeping what was sent."""

    def __init__(self, status: int = 200, error: Exception | None = None) -> None:
        self.status, self.error = status, error
        self.sent: list[Outgoing] = []

    async def send(self, request: Outgoing, seconds: float) -> Answer:
        self.sent.append(request)
        if self.error is not None:
            raise self.error
        return Answer(self.status, {}, b"{}")

    async def close(self) -> None:
        pass


class _Kind:
    """An effect kind whose call and look-up are one POST and one GET to its provider."""

    spec = EffectSpec("thing.do", idempotent=True, provider_setting="things_url")
    enabled = True

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    async def call(self, effect: EffectRow) -> Sent:
        await self._http.post(f"https://things.example:8443/things/{effect.aggregate_id}", json=effect.payload)
        return Sent("ref-1")

    async def look_up(self, effect: EffectRow) -> Found:
        await self._http.get(f"https://things.example:8443/things/{effect.aggregate_id}")
        return Found("ref-1")

    async def on_outcomes(self, *_: Any) -> None:
        pass


def _effect(context: str | None, aggregate: str = "A-1") -> EffectRow:
    return EffectRow(f"{aggregate}/thing.do", aggregate, "thing.do", {"card": SECRET.decode()}, 2, 0, None, context)


async def test_an_effects_call_continues_its_rows_context_and_its_request_is_a_client_span_beneath_it(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    transport = _Transport()
    http = HttpClient(transport, 1.0, tracing)
    worker = EffectWorker(
        None,  # type: ignore[arg-type]
        EffectRegistry([_Kind(http)]),
        EffectPolicy(),
        None,  # type: ignore[arg-type]
        random.Random(0),
        topics=Topics("s"),
        lease=timedelta(seconds=60),
        concurrency=2,
        budget=5.0,
        names=OrderSettings,
        tracing=tracing,
    )
    claimed = [_effect(WRITER.header), _effect(None, "A-2")]

    outcomes = await worker._execute_all(claimed, lease_ends=float("inf"))

    # Then the effect with a context was called in an INTERNAL span named by its kind, the child of its writer, with
    # its POST a CLIENT span beneath it; the one without a context made its call untraced
    assert outcomes == [Sent("ref-1"), Sent("ref-1")]
    request, call = exporter.get_finished_spans()
    assert (call.name, call.kind, _parent_of(call)) == ("thing.do", SpanKind.INTERNAL, WRITER)
    assert dict(call.attributes or {}) == {"effect.kind": "thing.do", "effect.attempt": 2, "outcome": "sent"}
    assert (request.name, request.kind) == ("POST", SpanKind.CLIENT)
    assert request.parent is not None
    assert request.parent.span_id == call.context.span_id
    assert dict(request.attributes or {}) == {
        "http.request.method": "POST",
        "server.address": "things.example",
        "server.port": 8443,
        "http.response.status_code": 200,
    }
    assert transport.sent[0].headers["traceparent"] == _context_of(request)
    assert "traceparent" not in transport.sent[1].headers
    # And what its outcome writes continues the call's span
    assert (claimed[0].trace_context, claimed[1].trace_context) == (_context_of(call), None)


async def test_a_reconcilers_look_up_continues_the_effects_context(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    http = HttpClient(_Transport(), 1.0, tracing)
    reconciler = Reconciler(
        None,  # type: ignore[arg-type]
        EffectRegistry([_Kind(http)]),
        EffectPolicy(),
        None,  # type: ignore[arg-type]
        topics=Topics("s"),
        lease=timedelta(seconds=60),
        dedup_window=timedelta(days=1),
        retention=None,  # type: ignore[arg-type]
        lookup_budget=5.0,
        program="p",
        consumer_name="c",
        tracing=tracing,
    )

    found, effect = await reconciler._traced(tracing, _Kind(http), _effect(WRITER.header), 5.0)

    request, look_up = exporter.get_finished_spans()
    assert found == Found("ref-1")
    assert (look_up.name, _parent_of(look_up), (look_up.attributes or {})["outcome"]) == (
        "look_up thing.do",
        WRITER,
        "found",
    )
    assert (request.name, request.parent and request.parent.span_id) == ("GET", look_up.context.span_id)
    assert effect.trace_context == _context_of(look_up)


@pytest.mark.parametrize(
    ("transport", "error_type"),
    [(_Transport(status=503), "503"), (_Transport(error=TimedOut("no answer")), "TimedOut")],
)
async def test_a_request_that_fails_ends_its_span_as_an_error_and_never_names_its_path(
    traced: tuple[Tracing, InMemorySpanExporter], transport: _Transport, error_type: str
) -> None:
    tracing, exporter = traced
    http = HttpClient(transport, 1.0, tracing)

    with trace.use_span(tracing.tracer.start_span("record"), end_on_exit=True), contextlib.suppress(TimedOut):
        await http.get("https://things.example/things/A-1", params={"card": SECRET.decode()})

    request, _ = exporter.get_finished_spans()
    assert (request.status.status_code, (request.attributes or {})["error.type"]) == (StatusCode.ERROR, error_type)
    assert not any("A-1" in value or "card" in value or "/things" in value for value in _values(request))


async def test_a_request_outside_any_span_or_with_tracing_off_sends_no_traceparent(
    traced: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    transport = _Transport()

    await HttpClient(transport, 1.0, tracing).get("https://things.example/things/A-1")
    await HttpClient(transport, 1.0, Tracing()).get("https://things.example/things/A-1")

    assert exporter.get_finished_spans() == ()
    assert ["traceparent" in sent.headers for sent in transport.sent] == [False, False]


# -- reprocess and edit copies --------------------------------------------------------------------------------------


def _candidate(trace_context: str | None) -> Candidate:
    headers = [["traceparent", PRODUCERS.decode()], [traces.SPAN_HEADER, "stale"], ["message-id", "M-1"]]
    return Candidate(
        "c", "src/0/7", "M-1", "A-1", "INVALID", "open", b"{}", headers, {"source": {}}, 0, trace_context=trace_context
    )


def test_a_copy_sent_back_carries_the_quarantining_attempts_context_and_the_producers_headers_as_they_were() -> None:
    traced_copy = copy_of(_candidate(QUARANTINER.header), "s.reprocess", sender=("reprocess-run-id", "R"), attempt=1)
    untraced = copy_of(_candidate(None), "s.reprocess", sender=("reprocess-run-id", "R"), attempt=1)

    assert traced_copy.trace_context == QUARANTINER.header
    assert traced_copy.headers[0] == ["traceparent", PRODUCERS.decode()]
    assert [header for header in traced_copy.headers if header[0] == traces.SPAN_HEADER] == [
        [traces.SPAN_HEADER, QUARANTINER.header]
    ]
    assert untraced.trace_context is None
    assert untraced.headers[0] == ["traceparent", PRODUCERS.decode()]
    # (a stale header of ours the record came with is not sent back: the service's own, never a producer's)
    assert [header for header in untraced.headers if header[0] == traces.SPAN_HEADER] == []
