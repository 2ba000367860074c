"""The consumer's spans (service/tracing.py) on a round without I/O, exported to memory: one `process <topic>` span
per record and attempt on the messaging conventions, in its producer's trace or in the one derived from the
consumer's name and its message id; the round's write linked to the records' spans and never their parent; and
nothing taken from a record but its coordinates, text key, message id and failure id."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from service.adapters.otel import DerivedIds
from service.codes import ErrorCode
from service.errors import RecordFailure
from service.policy.records import SourceRecord, trace_id_of
from service.policy.traces import SPAN_HEADER, derived_trace_id, parse
from service.tracing import Tracing
from tests.support.rounds import TOPIC, FakeRounds, Things, processor

CONSUMER = "things-service"
PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{PRODUCER_TRACE}-00f067aa0ba902b7-01"
ALLOWED = {
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.consumer.group.name",
    "messaging.destination.partition.id",
    "messaging.kafka.offset",
    "messaging.kafka.message.key",
    "messaging.message.id",
    "failure.id",
    "outcome",
    "error.type",
}


@pytest.fixture
def exported() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, id_generator=DerivedIds())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    yield tracing, exporter
    tracing.shutdown()


def source(offset: int, value: bytes, *headers: tuple[str, bytes], key: bytes = b"T-1") -> SourceRecord:
    return SourceRecord(TOPIC, 0, offset, 0, key, value, (("message-id", f"m{offset}".encode()), *headers))


async def one_round(tracing: Tracing, *records: SourceRecord, handler: Things | None = None) -> Any:
    shell = processor(FakeRounds(), handler, tracing=tracing)
    due = [shell.pending(record) for record in records]
    return shell, await shell.attempt_round({delivery: delivery.arrival for delivery in due}, asyncio.Event())


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_a_record_without_a_traceparent_is_processed_in_the_trace_its_consumer_and_message_id_derive(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    # Given tracing on, and a record without a traceparent
    tracing, exporter = exported

    # When a round applies it
    await one_round(tracing, source(0, b"create:T-1"))

    # Then one process span, a root in the derived trace, on the messaging conventions
    spans = exporter.get_finished_spans()
    [process] = named(spans, f"process {TOPIC}")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None
    assert f"{process.context.trace_id:032x}" == derived_trace_id(CONSUMER, "m0")
    assert dict(process.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": TOPIC,
        "messaging.consumer.group.name": CONSUMER,
        "messaging.destination.partition.id": "0",
        "messaging.kafka.offset": 0,
        "messaging.kafka.message.key": "T-1",
        "messaging.message.id": "m0",
        "failure.id": f"{TOPIC}/0/0",
        "outcome": "processed",
    }
    # And the round's write is one span of its own trace that links to it, with its share a child of the record's
    writes = named(spans, "write")
    [round_write] = [span for span in writes if span.parent is None]
    [share] = [span for span in writes if span.parent is not None]
    assert [link.context.span_id for link in round_write.links] == [process.context.span_id]
    assert round_write.context.trace_id != process.context.trace_id
    assert share.parent is not None
    assert share.parent.span_id == process.context.span_id
    assert [link.context.span_id for link in share.links] == [round_write.context.span_id]


async def test_a_record_with_a_traceparent_continues_its_producers_trace(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    await one_round(tracing, source(0, b"create:T-1", ("traceparent", PARENT.encode())))
    [process] = named(exporter.get_finished_spans(), f"process {TOPIC}")
    assert f"{process.context.trace_id:032x}" == PRODUCER_TRACE
    assert process.parent is not None
    assert f"{process.parent.span_id:016x}" == "00f067aa0ba902b7"


async def test_a_failed_attempt_is_an_error_span_and_the_next_attempt_links_to_it(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    # Given a directory that fails once
    tracing, exporter = exported
    calls = 0

    async def flaky(key: str) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RecordFailure(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream="directory")
        return {"exists": True}

    shell, attempted = await one_round(tracing, source(0, b"create:T-1"), handler=Things(flaky))
    [first] = named(exporter.get_finished_spans(), f"process {TOPIC}")

    # When the same delivery is attempted again
    await shell.attempt_round(dict(attempted.retry), asyncio.Event())

    # Then the first span failed with the code, the second succeeded in the same trace, linked to the first
    second = named(exporter.get_finished_spans(), f"process {TOPIC}")[1]
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "DOWNSTREAM_UNAVAILABLE"
    assert (first.attributes or {})["outcome"] == "failed"
    assert (second.attributes or {})["outcome"] == "processed"
    assert second.context.trace_id == first.context.trace_id
    assert [link.context.span_id for link in second.links] == [first.context.span_id]


async def test_a_copy_links_to_the_attempt_its_own_header_names_and_a_source_records_header_is_not_trusted(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    before = f"00-{PRODUCER_TRACE}-1111111111111111-01"
    ours = (SPAN_HEADER, before.encode())
    copy = SourceRecord(
        f"{TOPIC}.reprocess",
        0,
        5,
        0,
        b"T-1",
        b"create:T-1",
        (("message-id", b"m0"), ("failure-id", b"things/0/0"), ours),
    )
    await one_round(tracing, copy, source(1, b"create:T-2", ours, key=b"T-2"))
    spans = {span.attributes["messaging.destination.name"]: span for span in named_process(exporter)}  # type: ignore[index]
    assert [f"{link.context.span_id:016x}" for link in spans[f"{TOPIC}.reprocess"].links] == ["1111111111111111"]
    assert list(spans[TOPIC].links) == []


def named_process(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith("process ")]


async def test_tracing_off_still_gives_every_record_a_trace_id_and_no_span_context() -> None:
    shell = processor(FakeRounds(), tracing=Tracing())
    delivery = shell.pending(source(0, b"create:T-1"))
    assert delivery.record.trace_id is None  # derived where it is needed, not for every record
    assert trace_id_of(delivery.record, CONSUMER) == derived_trace_id(CONSUMER, "m0")
    assert delivery.record.span is None


@settings(max_examples=60, deadline=None, print_blob=True)
@given(
    key=st.binary(max_size=40),
    value=st.binary(max_size=60),
    header=st.tuples(st.text(max_size=12), st.binary(max_size=40)),
)
def test_no_span_attribute_holds_a_payload_or_a_header_value(
    key: bytes, value: bytes, header: tuple[str, bytes]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, id_generator=DerivedIds())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    try:
        asyncio.run(one_round(tracing, source(0, b"create:" + value, header, key=key)))
        for span in exporter.get_finished_spans():
            attributes = dict(span.attributes or {})
            assert set(attributes) <= ALLOWED | {"db.system.name", "messaging.batch.message_count"}
            key_text = attributes.get("messaging.kafka.message.key")
            assert key_text is None or key_text.encode() == key
            shown = [str(v) for name, v in attributes.items() if name != "messaging.kafka.message.key"]
            for secret in (value, header[1]):
                text = secret.decode("ascii", errors="ignore").strip("\x00")
                if len(text) >= 4 and text.isprintable():
                    assert not any(text in value_shown for value_shown in shown)
    finally:
        tracing.shutdown()


def test_a_traceparent_is_read_only_when_well_formed() -> None:
    assert parse(PARENT) is not None
    for bad in ("", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", f"ff-{PRODUCER_TRACE}-00f067aa0ba902b7-01", "00-xyz"):
        assert parse(bad) is None
