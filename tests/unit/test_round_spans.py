"""A traced round's process spans (service/tracing.py) in the round's shell: each round ends its own spans, even when
the consumer's rounds overlap (it plans the next one while one's transaction runs). No database, no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBasedTraceIdRatio

from service.adapters.otel import DerivedIds, NoQueryRoots
from service.policy import traces
from service.policy.delivery import Delivery
from service.policy.records import SourceRecord
from service.policy.round import Facts
from service.tracing import Tracing
from tests.support.rounds import TOPIC, FakeRounds, processor, record


class HeldRounds(FakeRounds):
    """A store whose first look at the facts waits until `release` is set: the round that asks is held mid-way."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def facts(self, due: Collection[Delivery], *, keys: bool) -> Facts:
        if not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        return await super().facts(due, keys=keys)


async def test_overlapping_rounds_each_end_their_own_records_spans_with_their_outcomes() -> None:
    # Given a traced processor whose first round is held while a second one runs to its end
    exported = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    store = HeldRounds()
    shell = processor(store, tracing=Tracing(provider))
    first, second = (
        shell.pending(record(offset, f"create:T-{offset}".encode(), key=f"K{offset}")) for offset in (0, 1)
    )

    # When both rounds run, the second one entirely within the first
    held = asyncio.create_task(shell.attempt_round({first: first.arrival}, asyncio.Event()))
    await store.holding.wait()
    overlapping = await shell.attempt_round({second: second.arrival}, asyncio.Event())
    store.release.set()
    attempted = await held

    # Then each record left, and its one process span ended with its outcome and the round's trace id
    assert attempted.left == {first}
    assert overlapping.left == {second}
    process = [span for span in exported.get_finished_spans() if span.name.startswith("process ")]
    assert sorted((span.attributes or {})["messaging.message.id"] for span in process) == ["m0", "m1"]
    assert {(span.attributes or {})["outcome"] for span in process} == {"processed"}
    trace_ids = {(span.attributes or {})["messaging.message.id"]: f"{span.context.trace_id:032x}" for span in process}
    assert (attempted.trace_id, overlapping.trace_id) == (trace_ids["m0"], trace_ids["m1"])


def test_a_record_continues_its_producers_trace_or_roots_its_own_and_carries_its_span() -> None:
    # Given a tracer as the service builds it (derived ids, parent-based sampling), that samples no root
    exported = InMemorySpanExporter()
    provider = TracerProvider(sampler=NoQueryRoots(ParentBasedTraceIdRatio(0.0)), id_generator=DerivedIds())
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing = Tracing(provider)
    shell = processor(FakeRounds())
    producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    unsampled = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"
    headers = {0: producer, 1: unsampled}
    deliveries = [
        shell.pending(
            SourceRecord(
                TOPIC,
                0,
                n,
                0,
                b"K",
                b"create:T",
                (("message-id", f"m{n}".encode()),) + ((("traceparent", headers[n].encode()),) if n in headers else ()),
            )
        )
        for n in range(3)
    ]

    # When their process spans start and end
    spans = tracing.process(deliveries, "things-service")
    tracing.ended(spans, {})

    # Then the first continues its producer's sampled trace as a child of its span, and is exported
    (exported_span,) = [span for span in exported.get_finished_spans() if span.name == f"process {TOPIC}"]
    assert exported_span.parent is not None
    assert (exported_span.context.trace_id, exported_span.parent.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    # And the two the sampler does not trace have no span and no context to pass on (the second's producer did not
    # sample its trace; the third's derived trace is not among the roots sampled)
    assert list(spans) == [deliveries[0]]
    assert [delivery.record.span for delivery in deliveries[1:]] == [None, None]
    ref = traces.parse(deliveries[0].record.span)
    assert ref is not None
    assert (ref.trace_id, ref.span_id, ref.sampled) == (
        "0af7651916cd43dd8448eb211c80319c",
        f"{exported_span.context.span_id:016x}",
        True,
    )
