"""The consumer loop against a fake Kafka client and a fake processor: overlapping rounds commit offsets only
up to what is terminal, at its bound the fetcher stops asking Kafka without pausing, rounds that would not be
full are spaced while full ones start at once, and behind a backlog a round waits (for a while) for a round's worth
while another is in flight. The fake processor
holds each round until the test releases it; the fake client serves records and records commits and pauses."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from aiokafka import ConsumerRecord, TopicPartition

from service.metrics import Metrics
from service.orders.messages import decode
from service.policy.delivery import Delivery, RetryState
from service.policy.records import SourceRecord
from service.worker import consumer as consumer_module
from service.worker.consumer import ConsumerLoop
from service.worker.processor import Attempted
from tests.support import eventually

TOPIC = "orders"


class _Processor:
    """Holds each round until the test releases it, then reports every record of it as terminal."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[Delivery], asyncio.Event]] = []

    async def attempt_round(self, due: dict[Delivery, RetryState], stop: asyncio.Event) -> Attempted:
        release = asyncio.Event()
        self.rounds.append((list(due), release))
        await release.wait()
        return Attempted(frozenset(due), {})

    def pending(self, record: SourceRecord) -> Delivery:
        return Delivery(record, decode(record.value), record.coordinates, 0)

    async def let_go(self) -> None:
        pass

    async def releasable(self, busy: set[str], keys: int = 50, per_key: int = 100) -> list[Delivery]:
        return []


class _Consumer:
    """Serves `available` records (record n on partition n % `partitions`, each of its own key), as many per
    fetch as asked for; records commits, pauses and fetches."""

    def __init__(self, available: int, partitions: int) -> None:
        self.available = available
        self.partitions = partitions
        self.commits: list[dict[TopicPartition, int]] = []
        self.paused: set[TopicPartition] = set()
        self.fetches = 0
        self.fetched = 0

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        self.fetches += 1
        first, self.fetched = self.fetched, min(self.available, self.fetched + max_records)
        if first == self.fetched:
            await asyncio.sleep(0.01)  # the broker's long poll, shortened
        batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]] = {}
        for n in range(first, self.fetched):
            partition, offset = n % self.partitions, n // self.partitions
            headers = (("message-id", f"K{n}.1".encode()),)
            record = ConsumerRecord(TOPIC, partition, offset, 0, 0, f"K{n}".encode(), b"{}", None, 2, 2, headers)
            batches.setdefault(TopicPartition(TOPIC, partition), []).append(record)
        return batches

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in range(self.partitions)}

    def highwater(self, partition: TopicPartition) -> int | None:
        return None


async def _stopped(running: asyncio.Task[None], stop: asyncio.Event, processor: _Processor) -> None:
    """Stop the loop, releasing every round held, and wait for it to return."""
    stop.set()
    for _, release in processor.rounds:
        release.set()
    await asyncio.wait_for(running, timeout=5)


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def _running(consumer: _Consumer, processor: _Processor, batch_size: int) -> tuple[asyncio.Task[None], asyncio.Event]:
    loop = ConsumerLoop(processor, Metrics("orders"), lambda: consumer, [TOPIC], batch_size)  # type: ignore[arg-type]
    stop = asyncio.Event()
    return asyncio.create_task(loop.run(stop)), stop


async def _two_rounds_in_flight(
    consumer: _Consumer, batch_size: int
) -> tuple[_Processor, asyncio.Task[None], asyncio.Event]:
    """The loop running on `consumer`'s one partition, once it has (at least) two rounds in flight."""
    processor = _Processor()
    running, stop = _running(consumer, processor, batch_size)
    await eventually(lambda: _true(len(processor.rounds) >= 2), timeout=5, interval=0.01)
    return processor, running, stop


async def test_a_later_round_that_finishes_first_commits_nothing_past_the_earlier_one_then_everything() -> None:
    # Given six records on one partition and two rounds of them in flight (how many each took depends on how the
    # fetches and the round loop interleave)
    consumer = _Consumer(available=6, partitions=1)
    processor, running, stop = await _two_rounds_in_flight(consumer, batch_size=2)
    (first, release_first), (second, release_second), *_ = processor.rounds
    partition = TopicPartition(TOPIC, 0)
    assert max(p.record.offset for p in first) < min(p.record.offset for p in second)

    # When the later round finishes first
    release_second.set()
    await _settle()

    # Then the offset stays before the first record of the earlier round
    assert consumer.commits[-1] == {partition: 0}

    # And when the earlier round finishes, the offset moves past both, and past the last record once every
    # later round finished too
    release_first.set()
    done = max(p.record.offset for p in second) + 1
    await eventually(lambda: _true(consumer.commits[-1] == {partition: done}), timeout=5, interval=0.01)

    async def all_released_and_committed() -> bool:
        for _, release in processor.rounds:
            release.set()
        return consumer.commits[-1] == {partition: 6}

    await eventually(all_released_and_committed, timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(running, timeout=5)


async def test_at_its_bound_the_fetcher_stops_asking_without_pausing_and_asks_again_when_a_round_ends() -> None:
    # Given rounds of four records and room for three rounds' worth (twelve), on three partitions, and rounds that
    # do not finish until released
    processor = _Processor()
    consumer = _Consumer(available=1_000, partitions=3)
    running, stop = _running(consumer, processor, batch_size=2)

    # When it has fetched its bound
    await eventually(lambda: _true(consumer.fetched == 12), timeout=5, interval=0.01)
    fetches = consumer.fetches
    await _settle()

    # Then it asks Kafka for nothing more, and pauses no partition (a pause would drop what the client prefetched)
    assert consumer.fetches == fetches
    assert consumer.fetched == 12
    assert not consumer.paused

    # And when a round leaves, it fetches as many more, up to its bound again
    round_, release = processor.rounds[0]
    release.set()
    await eventually(lambda: _true(consumer.fetched == 12 + len(round_)), timeout=5, interval=0.01)
    await _settle()
    assert consumer.fetched == 12 + len(round_)
    await _stopped(running, stop, processor)


async def test_a_revoked_partition_waits_for_its_round_in_flight_and_commits_it_before_it_goes() -> None:
    # Given a round in flight on the only partition
    processor = _Processor()
    consumer = _Consumer(available=2, partitions=1)
    loop = ConsumerLoop(processor, Metrics("orders"), lambda: consumer, [TOPIC], 2)  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    await eventually(lambda: _true(len(processor.rounds) == 1), timeout=5, interval=0.01)
    partition = TopicPartition(TOPIC, 0)

    # When the partition is revoked, the hand-over waits for the round
    handing_over = asyncio.create_task(loop.hand_over(consumer, [partition]))  # type: ignore[arg-type]
    await _settle()
    assert not handing_over.done()

    # Then once the round commits, its offset is committed before the partition goes to another member
    (round_, release), *_ = processor.rounds
    release.set()
    await asyncio.wait_for(handing_over, timeout=5)
    assert consumer.commits[-1] == {partition: max(p.record.offset for p in round_) + 1}
    await _stopped(running, stop, processor)


class _SlowCommits(_Consumer):
    """A commit takes a broker round trip; `sent` are the commits on their way or done."""

    def __init__(self, available: int, partitions: int) -> None:
        super().__init__(available, partitions)
        self.sent: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.sent.append(dict(offsets))
        await asyncio.sleep(0.05)
        self.commits.append(dict(offsets))


async def test_the_last_rounds_offsets_are_committed_when_the_commit_in_flight_as_it_ended_returns() -> None:
    # Given two rounds of two records in flight on one partition, and commits that take 50 ms
    consumer = _SlowCommits(available=4, partitions=1)
    processor, running, stop = await _two_rounds_in_flight(consumer, batch_size=1)
    (_, release_first), (_, release_second) = processor.rounds
    partition = TopicPartition(TOPIC, 0)

    # When the first round ends (its commit goes out) and the second ends while that commit is on its way
    release_first.set()
    await eventually(lambda: _true(consumer.sent == [{partition: 2}]), timeout=5, interval=0.005)
    release_second.set()
    ended = time.monotonic()

    # Then the second round's offset is committed once the first commit returns, not at the loop's next wake-up
    # (half a second later: nothing else wakes it once the records are all fetched)
    await eventually(lambda: _true(consumer.commits[-1:] == [{partition: 4}]), timeout=5, interval=0.005)
    waited = time.monotonic() - ended
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    assert waited < 0.4, f"the last round's offset was committed {waited:.3f} s after it ended"


async def _true(value: bool) -> bool:
    return value


class _Instant(_Processor):
    """Reports every round terminal at once, with how many records each took."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def attempt_round(self, due: dict[Delivery, RetryState], stop: asyncio.Event) -> Attempted:
        self.sizes.append(len(due))
        return Attempted(frozenset(due), {})


class _Trickle(_Consumer):
    """One record a fetch, about two milliseconds apart: a steady rate, far below a round's worth at a time."""

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        await asyncio.sleep(0.002)
        return await super().getmany(timeout_ms, 1)


class _Timed(ConsumerLoop):
    """The loop, noting when (the loop time it decided at) it starts each round."""

    started: list[float]

    def _start_round(self, *args: Any) -> None:
        self.started.append(self._round_started)
        super()._start_round(*args)


async def _ten_rounds(consumer: _Consumer) -> tuple[list[float], list[int]]:
    """Run the loop (rounds of 100) on `consumer` until it has started ten rounds: when it decided to start each
    (loop time), and how many records each took."""
    processor = _Instant()
    loop = _Timed(processor, Metrics("orders"), lambda: consumer, [TOPIC], 50)  # type: ignore[arg-type]
    loop.started = []
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    await eventually(lambda: _true(len(loop.started) >= 10), timeout=10, interval=0.01)
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    return loop.started[:10], processor.sizes[:10]


async def test_at_a_steady_trickle_rounds_start_at_least_the_spacing_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given records that come one by one, a round's worth (100) never waiting at once, and rounds spaced 30 ms
    monkeypatch.setattr(consumer_module, "_ROUND_SPACING_SECONDS", 0.03)

    # When the loop has started ten rounds
    started, sizes = await _ten_rounds(_Trickle(available=10_000, partitions=2))

    # Then it started each at least the spacing after the one before, with what came meanwhile: without the spacing,
    # a round started for about every fetch
    gaps = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert all(gap >= 0.03 - 1e-9 for gap in gaps), gaps
    assert all(size < 100 for size in sizes)


async def test_behind_a_backlog_full_rounds_start_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a backlog of many rounds' worth, and a spacing longer than the test's deadline
    monkeypatch.setattr(consumer_module, "_ROUND_SPACING_SECONDS", 60.0)

    # When the loop has started ten rounds (it could not have, had any waited for the spacing)
    _, sizes = await _ten_rounds(_Consumer(available=5_000, partitions=2))

    # Then they were full
    assert sizes == [100] * 10


class _Behind(_Trickle):
    """A trickle of decoded records from partitions the broker holds far more of: a backlog not fetched yet."""

    def highwater(self, partition: TopicPartition) -> int | None:
        return self.fetched + 10_000


async def test_behind_a_backlog_not_fetched_yet_rounds_start_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given records decoded one by one while the broker holds a backlog beyond them, and a spacing longer than the
    # test's deadline
    monkeypatch.setattr(consumer_module, "_ROUND_SPACING_SECONDS", 60.0)

    # When the loop has started ten rounds (it could not have, had any waited for the spacing)
    _, sizes = await _ten_rounds(_Behind(available=10_000, partitions=2))

    # Then they were not full: each took what was decoded, as a drain's rounds do
    assert all(size < 100 for size in sizes)


class _HeldBehind(_Consumer):
    """One record a fetch, about two milliseconds apart, from partitions the broker holds far more of."""

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        await asyncio.sleep(0.002)
        return await super().getmany(timeout_ms, 1)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self.fetched + 10_000


async def test_behind_a_backlog_a_round_waits_for_a_rounds_worth_while_another_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a backlog decoded one record at a time, rounds of 100 (batches of 50), rounds that do not finish, and
    # a wait for a round's worth longer than the test's deadline
    monkeypatch.setattr(consumer_module, "_FILL_SECONDS", 60.0)
    processor = _Processor()
    consumer = _HeldBehind(available=10_000, partitions=2)
    running, stop = _running(consumer, processor, batch_size=50)

    # When three rounds have started
    await eventually(lambda: _true(len(processor.rounds) >= 3), timeout=10, interval=0.01)

    # Then the first started with what had been decoded (nothing else was in flight), and each later one waited for
    # a round's worth: started with what had been decoded when the slot freed, a drain's rounds took a few records
    # each
    first, second, third = (len(deliveries) for deliveries, _ in processor.rounds[:3])
    assert first < 100
    assert (second, third) == (100, 100)
    await _stopped(running, stop, processor)


async def test_a_round_waiting_for_a_rounds_worth_starts_when_no_other_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a backlog the broker serves one record at a time, rounds of 100, a wait for a round's worth longer than
    # the test's deadline, and a first round held in flight while a few records come
    monkeypatch.setattr(consumer_module, "_FILL_SECONDS", 60.0)
    processor = _Processor()
    consumer = _HeldBehind(available=10_000, partitions=2)
    running, stop = _running(consumer, processor, batch_size=50)
    await eventually(lambda: _true(len(processor.rounds) == 1 and consumer.fetched >= 10), timeout=10, interval=0.01)

    # When the first round ends
    processor.rounds[0][1].set()

    # Then the next starts at once with what came, without waiting for a round's worth: PostgreSQL would be idle
    await eventually(lambda: _true(len(processor.rounds) >= 2), timeout=5, interval=0.01)
    assert len(processor.rounds[1][0]) < 100
    await _stopped(running, stop, processor)


async def test_a_round_waits_for_a_rounds_worth_no_longer_than_the_fill_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a backlog the broker reports and serves one record at a time (as when the partition that holds it lost
    # its leader since), rounds of 100 that do not finish, and a wait for a round's worth of 50 ms
    monkeypatch.setattr(consumer_module, "_FILL_SECONDS", 0.05)
    processor = _Processor()
    consumer = _HeldBehind(available=10_000, partitions=2)
    loop = _Timed(processor, Metrics("orders"), lambda: consumer, [TOPIC], 50)  # type: ignore[arg-type]
    loop.started = []
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))

    # When two rounds have started
    await eventually(lambda: _true(len(processor.rounds) >= 2), timeout=10, interval=0.01)

    # Then the second waited for the fill time, then started with what had come: records of other partitions are
    # not held behind a round that may take the processing timeout
    waited = loop.started[1] - loop.started[0]
    assert 0.05 - 1e-9 <= waited < 1.0, waited
    assert len(processor.rounds[1][0]) < 100
    await _stopped(running, stop, processor)


class _CommitMarkers(_Trickle):
    """A steady trickle from a transactional producer: on each of many partitions, the broker's high watermark is
    one past the last record, its commit marker, which the client never returns as a record."""

    def highwater(self, partition: TopicPartition) -> int | None:
        served = (self.fetched - partition.partition + self.partitions - 1) // self.partitions
        return served + 1 if served else None


async def test_commit_markers_on_many_partitions_do_not_make_a_steady_rate_wait_for_full_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given records one at a time on 80 partitions, each with a commit marker after its last record, rounds of 100
    # that do not finish, and a spacing and a wait for a round's worth longer than the test's deadline
    monkeypatch.setattr(consumer_module, "_ROUND_SPACING_SECONDS", 60.0)
    monkeypatch.setattr(consumer_module, "_FILL_SECONDS", 60.0)
    processor = _Processor()
    consumer = _CommitMarkers(available=10_000, partitions=80)
    running, stop = _running(consumer, processor, batch_size=50)

    # When two rounds have started
    await eventually(lambda: _true(len(processor.rounds) >= 2), timeout=10, interval=0.01)

    # Then the second started once what was fetched and the markers made a round's worth, as behind a backlog, and
    # did not wait for a round's worth of records: 80 markers are not a backlog of a round's worth
    assert len(processor.rounds[1][0]) < 100
    await _stopped(running, stop, processor)


class _PausedBacklog(_Consumer):
    """Partition 0 serves its first record, then only what is fetched while it is not paused, and the broker holds
    thousands more of it; partition 1 serves one record a fetch, about two milliseconds apart, and nothing beyond."""

    def __init__(self) -> None:
        super().__init__(available=10_000, partitions=2)
        self.served = {0: 0, 1: 0}

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        await asyncio.sleep(0.002)
        self.fetches += 1
        partition = 0 if self.served[0] == 0 or TopicPartition(TOPIC, 0) not in self.paused else 1
        if partition == 0 and self.served[0] > 0:
            return {}  # partition 0 is not paused yet: nothing more of it until the round that stalls it ends
        offset = self.served[partition]
        self.served[partition] += 1
        key = f"K{partition}-{offset}"
        headers = (("message-id", f"{key}.1".encode()),)
        record = ConsumerRecord(TOPIC, partition, offset, 0, 0, key.encode(), b"{}", None, 2, 2, headers)
        return {TopicPartition(TOPIC, partition): [record]}

    def highwater(self, partition: TopicPartition) -> int | None:
        return 10_000 if partition.partition == 0 else self.served[1]


class _SlowDownstream(_Processor):
    """Partition 0 is a retry tier whose head fails and waits a minute for its next attempt (its partition pauses);
    rounds of the others are held until the test releases them."""

    def pending(self, record: SourceRecord) -> Delivery:
        return Delivery(record, decode(record.value), record.coordinates, 0, in_tier=record.partition == 0)

    async def attempt_round(self, due: dict[Delivery, RetryState], stop: asyncio.Event) -> Attempted:
        if all(delivery.record.partition == 0 for delivery in due):
            later = RetryState(due=asyncio.get_running_loop().time() + 60)
            return Attempted(frozenset(), dict.fromkeys(due, later))
        return await super().attempt_round(due, stop)


async def test_the_backlog_of_a_paused_partition_does_not_keep_rounds_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a partition paused behind a retry tier's head that is not due, whose backlog the broker holds, another
    # partition whose records come one at a time with nothing beyond them, rounds of 100 spaced 30 ms, and rounds of
    # the second partition that do not finish
    monkeypatch.setattr(consumer_module, "_ROUND_SPACING_SECONDS", 0.03)
    processor = _SlowDownstream()
    consumer = _PausedBacklog()
    running, stop = _running(consumer, processor, batch_size=50)

    # When two rounds of the second partition have started
    await eventually(lambda: _true(len(processor.rounds) >= 2), timeout=10, interval=0.01)

    # Then the second started the spacing after the first with what had come meanwhile: it did not wait for a
    # round's worth of records that the paused partition cannot bring
    assert TopicPartition(TOPIC, 0) in consumer.paused
    assert len(processor.rounds[1][0]) < 50
    await _stopped(running, stop, processor)


class _ParkedFlood(_Processor):
    """A parked table that always has as many free keys as asked for, each with as many records as asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.released = 0
        self.asked: list[int] = []  # how many keys each call asked for (0: only renew the claims held)

    async def releasable(self, busy: set[str], keys: int = 50, per_key: int = 100) -> list[Delivery]:
        self.asked.append(keys)
        deliveries = []
        for _ in range(keys):
            key = f"P{self.released}"
            self.released += 1
            for n in range(per_key):
                record = SourceRecord(TOPIC, 0, n, 0, key.encode(), b"{}", (("message-id", f"{key}.{n}".encode()),))
                deliveries.append(Delivery(record, decode(record.value), record.coordinates, 0, parked_id=n + 1))
        return deliveries


async def test_parked_records_are_released_only_into_the_room_the_lanes_bound_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a consumer whose lanes hold at most 300 records (batches of 50), 100 records to fetch, rounds that do
    # not finish, and a parked table with thousands of records of free keys, released every 10 ms
    monkeypatch.setattr(consumer_module, "_RELEASE_EVERY_SECONDS", 0.01)
    processor = _ParkedFlood()
    consumer = _Consumer(available=100, partitions=1)
    loop = ConsumerLoop(processor, Metrics("orders"), lambda: consumer, [TOPIC], 50)  # type: ignore[arg-type]
    ticks = 0
    release_parked = loop._release_parked

    async def counted(now: float) -> None:
        nonlocal ticks
        ticks += 1
        await release_parked(now)

    loop._release_parked = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))

    # When the loop has come round to releasing parked records several times
    await eventually(lambda: _true(ticks >= 5 and len(processor.asked) >= 4), timeout=10, interval=0.01)

    # Then the lanes hold their bound's worth of fetched and released records, and no more; and the loop kept
    # asking, for no key, so that the claims on the parked records it holds are renewed
    assert loop._lanes.held() == 300
    assert consumer.fetched + 100 * processor.released == 300
    assert processor.asked[-3:] == [0, 0, 0]
    stop.set()
    for _, release in processor.rounds:
        release.set()
    await asyncio.wait_for(running, timeout=10)
