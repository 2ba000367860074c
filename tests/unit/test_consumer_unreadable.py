"""Records the Kafka client cannot decode, probed one by one while a rebalance gives the partition back: every
offset is quarantined or applied before the partition is committed past it. A fake client and processor."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from service.codes import ErrorCode
from service.metrics import Metrics
from service.orders.messages import decode
from service.policy.delivery import Delivery, RetryState
from service.policy.handling import DecodeFailure
from service.policy.records import SourceRecord
from service.worker.consumer import ConsumerLoop
from service.worker.processor import Attempted
from tests.support import eventually

TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)


class _Processor:
    """Applies every round at once, and remembers the offsets it was handed."""

    def __init__(self) -> None:
        self.applied: list[int] = []

    async def attempt_round(self, due: dict[Delivery, RetryState], stop: asyncio.Event) -> Attempted:
        self.applied += [d.record.offset for d in due]
        return Attempted(frozenset(due), {})

    def pending(self, record: SourceRecord) -> Delivery:
        return Delivery(record, decode(record.value), record.coordinates, 0)

    def unreadable(self, topic: str, partition: int, offset: int) -> Delivery:
        record = SourceRecord(topic, partition, offset, 0, None, None)
        return Delivery(record, DecodeFailure(ErrorCode.UNREADABLE_RECORD), record.coordinates, 0)

    async def let_go(self) -> None:
        pass

    async def releasable(self, busy: set[str], keys: int = 50, per_key: int = 100) -> list[Delivery]:
        return []


class _Consumer:
    """Offsets 0..5 on one partition; 0, 1 and 2 cannot be read by the client. The second probe sees a rebalance
    that gives the partition back to this member, from its committed offset."""

    def __init__(self) -> None:
        self.pos, self.committed, self.probes = 0, None, 0
        self.commits: list[dict[TopicPartition, int]] = []
        self.loop: ConsumerLoop | None = None

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.committed = offsets[TP]

    def _record(self, offset: int) -> ConsumerRecord[Any, Any]:
        return ConsumerRecord(
            TOPIC, 0, offset, 0, 0, f"K{offset}".encode(), b"{}", None, 2, 2, (("message-id", f"K{offset}".encode()),)
        )

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int, max_records: int) -> Any:
        if partitions:
            self.probes += 1
            if self.probes == 2:
                assert self.loop is not None
                await self.loop.hand_over(self, [TP])  # type: ignore[arg-type]
                self.pos = self.committed or 0  # assigned again: the client fetches from the committed offset
        else:
            await asyncio.sleep(0.01)
        if self.pos in (0, 1, 2):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        if self.pos >= 6:
            return {}
        out = [self._record(o) for o in range(self.pos, min(6, self.pos + (1 if partitions else max_records)))]
        self.pos = out[-1].offset + 1
        return {TP: out}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset

    async def seek_to_committed(self, tp: TopicPartition) -> dict[TopicPartition, int | None]:
        self.pos = self.committed or 0
        return {tp: self.committed}

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.pos = 0

    async def position(self, tp: TopicPartition) -> int:
        return self.pos

    def pause(self, *p: TopicPartition) -> None:
        pass

    def resume(self, *p: TopicPartition) -> None:
        pass

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def highwater(self, tp: TopicPartition) -> int | None:
        return 6


async def test_a_probe_that_a_rebalance_interrupts_goes_on_from_where_the_client_stands() -> None:
    # Given a partition whose offsets 0, 1 and 2 the client cannot decode, and a rebalance during the second probe
    # that gives the partition back to this member from its committed offset (nothing committed yet: offset 0)
    processor, consumer = _Processor(), _Consumer()
    loop = ConsumerLoop(processor, Metrics("orders"), lambda: consumer, [TOPIC], 10)  # type: ignore[arg-type]
    consumer.loop = loop
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))

    # When the loop has committed the partition to its end
    await eventually(lambda: _true(consumer.commits and consumer.commits[-1] == {TP: 6}), timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(running, timeout=5)

    # Then every offset was handed to the processor (the unreadable ones to be quarantined) before that commit
    assert sorted(set(processor.applied)) == [0, 1, 2, 3, 4, 5]


async def _true(value: bool) -> bool:
    return value
