"""The consumer loop's lane bookkeeping when rounds overlap: offsets never pass a record that is not terminal,
and reach the end once every record left, whatever order the rounds finish in. A fake processor decides when
each round finishes; a fake Kafka client records commits and pauses."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from service.domain.messages import decode
from service.metrics import Metrics
from service.policy.records import SourceRecord
from service.worker.consumer import ConsumerLoop
from service.worker.processor import Pending
from tests.support import eventually

TOPIC = "orders"
PARTITION = TopicPartition(TOPIC, 0)


class _Processor:
    """Holds each round until the test releases it, then reports every record of it as terminal."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[Pending], asyncio.Event]] = []
        self.failing: set[int] = set()  # offsets whose records are not terminal after their round

    async def attempt(self, due: list[Pending], stop: asyncio.Event) -> set[Pending]:
        release = asyncio.Event()
        self.rounds.append((due, release))
        await release.wait()
        return {p for p in due if p.record.offset not in self.failing}

    def pending(self, record: SourceRecord) -> Pending:
        return Pending(record, decode(record.value), record.coordinates, 0)


class _Consumer:
    """Records commits, pauses and fetches; every fetch returns as many new records as asked for, spread over
    three partitions."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.paused: set[TopicPartition] = set()
        self.fetches = 0
        self.fetched = 0

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        self.fetches += 1
        first, self.fetched = self.fetched, self.fetched + max_records
        batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]] = {}
        for n in range(first, self.fetched):
            headers = (("message-id", f"K{n}.1".encode()),)
            record = ConsumerRecord(TOPIC, n % 3, n // 3, 0, 0, f"K{n}".encode(), b"{}", None, 2, 2, headers)
            batches.setdefault(TopicPartition(TOPIC, n % 3), []).append(record)
        return batches

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def assignment(self) -> set[TopicPartition]:
        return {PARTITION}

    def highwater(self, partition: TopicPartition) -> int | None:
        return None


def _pending(offset: int, key: str) -> Pending:
    record = SourceRecord(TOPIC, 0, offset, 0, key.encode(), b"{}", ((("message-id", f"{key}.1".encode())),))
    return Pending(record, decode(record.value), record.coordinates, 0)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_later_round_that_finishes_first_commits_nothing_past_the_earlier_one_then_everything() -> None:
    processor = _Processor()
    consumer: Any = _Consumer()
    loop = ConsumerLoop(processor, Metrics(), lambda: consumer, [TOPIC], batch_size=2)  # type: ignore[arg-type]
    stop = asyncio.Event()
    # Given six records of six keys in one lane, taken by two overlapping rounds of four and two
    loop._lanes[(TOPIC, 0)] = deque(_pending(n, f"K{n}") for n in range(6))
    loop._start_round(consumer, stop, loop._due(0.0))
    loop._start_round(consumer, stop, loop._due(0.0))
    await _settle()
    (first, release_first), (second, release_second) = processor.rounds
    assert [p.record.offset for p in first] == [0, 1, 2, 3]
    assert [p.record.offset for p in second] == [4, 5]

    # When the later round finishes first
    release_second.set()
    await _settle()

    # Then the offset stays before the first record of the earlier round
    assert consumer.commits[-1] == {PARTITION: 0}

    # And when the earlier round finishes, the offset moves past the last record (not only past the first round)
    release_first.set()
    await _settle()
    if loop._uncommitted:
        await loop._commit(consumer)
    assert consumer.commits[-1] == {PARTITION: 6}
    assert not loop._lanes


async def test_a_round_that_finishes_after_its_partition_was_revoked_and_assigned_again_moves_no_offset() -> None:
    processor = _Processor()
    consumer: Any = _Consumer()
    loop = ConsumerLoop(processor, Metrics(), lambda: consumer, [TOPIC], batch_size=2)  # type: ignore[arg-type]
    stop = asyncio.Event()
    # Given a round of four records in flight, of which the third will fail (not terminal)
    processor.failing = {2}
    loop._lanes[(TOPIC, 0)] = deque(_pending(n, f"K{n}") for n in range(4))
    loop._start_round(consumer, stop, loop._due(0.0))
    await _settle()
    ((_, release_old),) = processor.rounds

    # When the partition is revoked and assigned back, and the first two records are fetched again
    loop.forget([PARTITION])
    loop._lanes[(TOPIC, 0)] = deque(_pending(n, f"K{n}") for n in range(2))
    release_old.set()
    await _settle()
    loop._start_round(consumer, stop, loop._due(0.0))
    await _settle()
    _, (_, release_new) = processor.rounds
    release_new.set()
    await _settle()
    if loop._uncommitted:
        await loop._commit(consumer)

    # Then the offset stops at the record that was never terminal, not past the old round's last record
    assert consumer.commits[-1] == {PARTITION: 2}


async def test_records_of_a_key_that_a_round_in_flight_writes_wait_for_it() -> None:
    processor = _Processor()
    consumer: Any = _Consumer()
    loop = ConsumerLoop(processor, Metrics(), lambda: consumer, [TOPIC], batch_size=1)  # type: ignore[arg-type]
    stop = asyncio.Event()
    # Given a round in flight with the records of keys A and B
    loop._lanes[(TOPIC, 0)] = deque([_pending(0, "A"), _pending(1, "B")])
    loop._start_round(consumer, stop, loop._due(0.0))
    await _settle()

    # When more records arrive: another of key A, then one of key C, then a second one of key A
    loop._lanes[(TOPIC, 0)].extend([_pending(2, "A"), _pending(3, "C"), _pending(4, "A")])

    # Then only key C may go into a second round while the first is in flight
    assert [p.record.offset for p in loop._due(0.0)] == [3]


async def test_at_its_bound_the_fetcher_stops_asking_without_pausing_and_asks_again_when_a_round_ends() -> None:
    processor = _Processor()
    consumer: Any = _Consumer()
    loop = ConsumerLoop(processor, Metrics(), lambda: consumer, [TOPIC], batch_size=2)  # type: ignore[arg-type]
    stop = asyncio.Event()
    # Given a fetcher with rounds of four records and room for three rounds' worth (twelve), on three partitions
    fetching = asyncio.create_task(loop._fetch(consumer, stop))

    async def fetched(count: int, held: int) -> bool:
        return consumer.fetched == count and sum(map(len, loop._lanes.values())) == held

    # When it has fetched its bound
    await eventually(lambda: fetched(12, held=12), timeout=5, interval=0.01)
    fetches = consumer.fetches
    await _settle()

    # Then it asks Kafka for nothing more, and pauses no partition (a pause would drop what the client prefetched)
    assert consumer.fetches == fetches
    assert not consumer.paused

    # And when a round of four leaves, it fetches four more, up to its bound again
    loop._start_round(consumer, stop, loop._due(0.0))
    await _settle()
    ((_, release),) = processor.rounds
    release.set()
    await eventually(lambda: fetched(16, held=12), timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(fetching, timeout=5)
