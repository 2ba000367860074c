"""A traced round's process spans (service/tracing.py) in the round's shell: each round ends its own spans, even when
the consumer's rounds overlap (it plans the next one while one's transaction runs). No database, no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from service.policy.delivery import Delivery
from service.policy.round import Facts
from service.tracing import Tracing
from tests.support.rounds import FakeRounds, processor, record


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
