"""The relay's `send` spans on real Kafka and PostgreSQL: the claim hands each row's trace context over, and what the
broker receives carries the span's context where the rules say (an in-memory exporter; no collector)."""

from __future__ import annotations

from datetime import timedelta

from dependency_injector import providers
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.policy import traces
from service.policy.headers import to_json
from service.policy.records import pack_key
from service.store import effects, outbox
from service.store.outbox import OutboxMessage
from service.store.uow import UnitOfWork
from service.tracing import Tracing
from tests.support import Topics, eventually, read_topic, running, scalar, settings_for

WRITER = traces.SpanRef("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True)
QUARANTINER = traces.SpanRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)
PRODUCERS = b"00-11111111111111111111111111111111-2222222222222222-01"


async def test_each_published_row_with_a_context_is_sent_in_a_span_whose_context_goes_out_with_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given an event and a reprocess copy written by traced attempts, and an event written while tracing was off
    copy_headers = [("traceparent", PRODUCERS), ("message-id", b"M-2"), ("raw", b"\xff\x00")]
    async with UnitOfWork(engine) as uow:
        await outbox.add(
            uow.connection,
            [
                OutboxMessage.json(topics.events, "A-1", {"message-id": "M-1"}, {"n": 1}, WRITER.header),
                OutboxMessage(
                    topics.reprocess, "A-2", to_json(copy_headers), b"p", pack_key(b"A-2"), None, QUARANTINER.header
                ),
                OutboxMessage.json(topics.events, "A-3", {"message-id": "M-3"}, {"n": 3}),
            ],
        )
        await uow.commit()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)

    # When a traced relay publishes them
    settings = settings_for(database_url, kafka, topics)
    async with running(settings, "relay", configure=lambda c: c.tracing.override(providers.Object(tracing))):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    provider.shutdown()

    # Then the two rows with a context were each sent in a PRODUCER span, the child of the attempt that wrote it
    spans = {span.name: span for span in exporter.get_finished_spans() if span.name.startswith("send ")}
    event_span, copy_span = spans[f"send {topics.events}"], spans[f"send {topics.reprocess}"]
    assert len(spans) == 2
    assert [span.parent and span.parent.span_id for span in (event_span, copy_span)] == [
        int(WRITER.span_id, 16),
        int(QUARANTINER.span_id, 16),
    ]
    [copy] = await read_topic(kafka, topics.reprocess, expect=1)
    first, third = sorted(await read_topic(kafka, topics.events, expect=2), key=lambda record: record.key)
    assert (copy_span.attributes or {})["messaging.destination.partition.id"] == str(copy.partition)

    # And the event says its span in `traceparent`, the copy keeps the producer's headers byte-exact and says it in
    # its own header, and the untraced event goes out as it was written
    def context(span: object) -> bytes:
        spanned = span.get_span_context()  # type: ignore[attr-defined]
        return f"00-{spanned.trace_id:032x}-{spanned.span_id:016x}-01".encode()

    assert dict(first.headers)["traceparent"] == context(event_span)
    assert list(copy.headers) == [*copy_headers, (traces.SPAN_HEADER, context(copy_span))]
    assert "traceparent" not in dict(third.headers)


async def test_an_effect_is_claimed_and_looked_up_with_the_context_that_wrote_it(engine: AsyncEngine) -> None:
    # Given a pending effect written by a traced attempt
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, payload, trace_context)"
                " VALUES ('A-1/x', 'A-1', 'x', '{}', :context)"
            ),
            {"context": WRITER.header},
        )
        await uow.commit()

    # When a worker claims it, and (its lease run out) the reconciler reads it uncertain
    async with UnitOfWork(engine) as uow:
        [claimed] = await effects.claim(uow.connection, "w", timedelta(seconds=30), 10, "x")
        await uow.connection.execute(text("UPDATE effects SET state = 'uncertain'"))
        [uncertain] = await effects.uncertain(uow.connection, 10)
        await uow.commit()

    # Then both carry the context its call and look-up continue
    assert (claimed.trace_context, uncertain.trace_context) == (WRITER.header, WRITER.header)
