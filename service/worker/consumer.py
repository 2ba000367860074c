"""The Kafka side of consuming: fetching into lanes, pause/resume, offset commits, parked releases.

Each assigned partition is a lane (service/worker/lanes.py): its fetched records wait in order in memory. A lane
whose head is not due (a retry-tier record held until its due time) or that is full pauses its partition in the Kafka
client, so nothing more is fetched for it, while every other partition keeps flowing. Records that wait for a
downstream's breaker are woken when it closes. The poll loop itself never sleeps longer than the next due time, or at
a steady rate the rounds' spacing (a round that would not be full starts at least `_ROUND_SPACING_SECONDS` after the
one before). An offset is committed only after its record left the processor (its transaction committed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError

from service.adapters.breakers import Breakers
from service.adapters.kafka import start_with_backoff, stop_quietly, to_source
from service.errors import InfrastructureUnavailable
from service.explain import kafka_reason
from service.metrics import Metrics
from service.policy.backoff import outage_wait
from service.policy.breaker import Breaker, State
from service.policy.delivery import Delivery, RetryState
from service.policy.heartbeat import PartitionView
from service.stopping import sleep_unless_stopped, wait_unless_stopped
from service.worker.lanes import Lanes, Taken
from service.worker.offsets import Offsets
from service.worker.partitions import partition_views
from service.worker.processor import LOOKUP_CONCURRENCY, Processor
from service.worker.spacing import SPACING_SECONDS
from service.worker.unreadable import skip_unreadable

log = structlog.get_logger("consumer")

_MAX_WAIT_SECONDS = 0.5
_FETCH_WAIT_MS = 500
_ROUND_BATCHES = 2  # a round attempts up to this many fetch batches
# While one round's statement runs, another plans and a third waits for PostgreSQL: with two, both were often
# waiting on PostgreSQL at once and the machine sat partly idle in a drain (docs/performance.md).
_ROUNDS_IN_FLIGHT = 3
# The most context look-ups (HTTP calls) a consumer makes at once: what its share of an HTTP client must hold.
CONTEXT_LOOKUPS = _ROUNDS_IN_FLIGHT * LOOKUP_CONCURRENCY
# While the records the lanes hold that no round has taken and those the broker held beyond what was fetched (of the
# partitions not paused) make less than a round's worth, the next round starts at least this long after the one
# before: at a steady rate a round for each fetch pays a transaction and an offset commit for a few records, and
# fewer, larger rounds leave that CPU to the rest of the pipeline, for a few milliseconds more per record
# (docs/performance.md). A record after a quiet spell, and every round behind a backlog, start without the spacing
# (behind a large one, once a round's worth is fetched: ConsumerLoop._may_start). Records held for a later retry count
# as held: behind a round's worth of them, rounds start unspaced.
_ROUND_SPACING_SECONDS = SPACING_SECONDS
# The longest a round behind a backlog waits for a round's worth of records (ConsumerLoop._may_start): a few times
# what a drain's fetcher takes to bring one (docs/performance.md), and short, because a backlog the broker reported
# and does not serve (a partition whose leader went away since) makes every such round wait this long.
_FILL_SECONDS = 0.25
# Records fetched and not terminal, in rounds. With two rounds in flight and only their records fetched, both
# tended to finish together and leave nothing to start until the fetcher had decoded the next records, with
# PostgreSQL idle meanwhile; a third round's worth fixed that. With three in flight they finish one at a time, and a
# fourth round's worth fetched ahead drained no faster, only in more memory.
_FETCHED_ROUNDS = 3
_RELEASE_EVERY_SECONDS = 0.5
_RELEASE_KEYS = 50  # parked keys released at most at once
_RELEASE_PER_KEY = 100  # ... and records of each
# How long a revoked partition waits for the rounds in flight before it goes: well inside the rebalance timeout.
_HAND_OVER_SECONDS = 10.0


@dataclass(frozen=True)
class KafkaDiagnosis:
    """How the loop starts its Kafka client and says why Kafka failed; the composition root binds both to the
    process's settings (its TLS, its login, the variables a reason names)."""

    start: Callable[[Callable[[], Awaitable[Any]], asyncio.Event, str], Awaitable[bool]] = start_with_backoff
    reason: Callable[[list[BaseException], str | None], str | None] = kafka_reason


_UNDIAGNOSED = KafkaDiagnosis()


class ConsumerLoop:
    """Fetches into lanes, hands due records to the processor, pauses waiting lanes, commits offsets.

    Two tasks share the lanes: the fetcher fetches and decodes the next records while rounds' database work is
    in flight, and the round loop starts up to three rounds of what is due. The lanes are bounded (a full lane
    pauses its partition; with the rounds' worth fetched the fetcher waits), so memory stays flat with any backlog.
    """

    def __init__(
        self,
        processor: Processor,
        metrics: Metrics,
        make_consumer: Callable[[], AIOKafkaConsumer],
        topics: list[str],
        batch_size: int,
        breakers: Breakers | None = None,
        kafka: KafkaDiagnosis = _UNDIAGNOSED,
    ) -> None:
        self._processor = processor
        self._breakers = breakers
        self._kafka = kafka
        self._arrived = asyncio.Event()
        self._metrics = metrics
        self._make_consumer = make_consumer
        self._topics = topics
        self._batch_size = batch_size
        self._round_size = batch_size * _ROUND_BATCHES
        self._lanes = Lanes(self._round_size, bound=self._round_size * _FETCHED_ROUNDS)
        self._paused: set[TopicPartition] = set()
        self._offsets = Offsets(self._arrived.set, kafka.reason)
        self._next_release = 0.0
        self._round_started = float("-inf")  # when the last round started (loop time)
        self._filled_by: float | None = None  # while a round waits for a round's worth: the latest it starts
        self._fetched_to: dict[TopicPartition, int] = {}  # the offset of the next record to fetch, per partition
        self._room = asyncio.Event()  # set when records leave the lanes: the fetcher may fetch again
        self._rounds: dict[asyncio.Task[None], set[str]] = {}  # round -> message ids, orders and keys
        self._error: Exception | None = None
        self._consumer: AIOKafkaConsumer | None = None  # while running: what the heartbeat reads
        self._refused: str | None = None  # while the broker refuses its fetches: why

    def partitions(self) -> tuple[PartitionView, ...]:
        """The assigned partitions as the heartbeat shows them (service/worker/partitions.py)."""
        if self._consumer is None:
            return ()
        now = asyncio.get_running_loop().time()
        return partition_views(self._consumer, self._lanes, self._offsets, self._paused, now)

    def problems(self) -> tuple[str, ...]:
        """What the consumer knows is misconfigured now: a fetch the broker refuses (an ACL)."""
        return (f"fetch refused: {self._refused}",) if self._refused else ()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set, then finish the in-flight transactions, commit and return."""
        if self._breakers is not None:
            self._breakers.listen(self._breaker_moved)
        consumer = self._make_consumer()
        consumer.subscribe(self._topics, listener=_Rebalance(self, consumer))
        if not await self._kafka.start(consumer.start, stop, "consumer"):
            await stop_quietly(consumer)
            return
        log.info("consumer_started", topics=self._topics)
        self._consumer = consumer
        loop = asyncio.get_running_loop()
        fetching = asyncio.create_task(self._fetch(consumer, stop))
        try:
            while not stop.is_set() and not fetching.done():
                self._raise_from_failed_rounds()
                if self._offsets.owed:
                    self._offsets.commit_soon(consumer)
                await self._release_parked(loop.time())
                now = loop.time()
                spaced_until = self._round_started + _ROUND_SPACING_SECONDS
                if len(self._rounds) < _ROUNDS_IN_FLIGHT and self._may_start(consumer, now, spaced_until):
                    taken = self._lanes.take(now, list(self._rounds.values()))
                    if taken.due:
                        self._round_started = now
                        self._start_round(consumer, stop, taken)
                        continue
                    if not self._rounds:
                        self._reconcile_pauses(consumer, now)
                        self._offsets.report_lag(consumer, self._lanes, self._metrics, now)
                await self._wait(stop, now, spaced_until)
        finally:
            fetching.cancel()
            await asyncio.gather(fetching, *self._rounds.keys(), return_exceptions=True)
            await self._offsets.finish(consumer)
            await self._processor.let_go()
            await consumer.stop()
            self._consumer = None
            log.info("consumer_stopped")
        self._raise_from_failed_rounds()
        if not fetching.cancelled() and fetching.exception() is not None:
            raise fetching.exception()  # type: ignore[misc]

    def _breaker_moved(self, downstream: str, breaker: Breaker) -> None:
        """A downstream's breaker closed, or a probe failed alone (another request may probe now): the records that
        wait for it are due now."""
        woken = breaker.state is State.CLOSED or (breaker.state is State.OPEN and breaker.suspects)
        if woken and self._lanes.wake(downstream):
            self._arrived.set()

    async def _fetch(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Fetch and decode into lanes while rounds write, until the lanes hold the rounds' worth of records.

        At that bound the fetcher stops asking instead of pausing the partitions: the Kafka client keeps the
        one fetch per partition it has buffered (at most `max_partition_fetch_bytes` each), and the next records
        are at hand the moment a round ends. Pausing would make it drop that buffer and fetch it again.
        """
        loop = asyncio.get_running_loop()
        refused = 0  # fetches the broker refused in a row (an ACL): the wait after each doubles while it goes on
        while not stop.is_set():
            room = self._lanes.room()
            if room <= 0:
                self._room.clear()
                await wait_unless_stopped(stop, self._room, _MAX_WAIT_SECONDS)
                continue
            try:
                batches = await consumer.getmany(timeout_ms=_FETCH_WAIT_MS, max_records=min(room, self._batch_size))
            except UnicodeDecodeError:
                await skip_unreadable(
                    consumer, self._fetched_to, self._is_paused, self._lanes.add, self._processor.unreadable, self._take
                )
                self._arrived.set()
                continue
            except KafkaError as error:
                # An ACL the broker refuses (contract §11: one line naming the operation and the resource, then
                # wait and ask again, never a crash loop): nothing is fetched, so nothing goes wrong meanwhile.
                why = self._kafka.reason([error], "READ") or type(error).__name__
                refused += 1
                self._refused = why
                wait = outage_wait(refused)
                log.warning("kafka_fetch_refused", reason=why, retry_in_seconds=wait)
                await sleep_unless_stopped(stop, wait)
                continue
            refused, self._refused = 0, None
            if not batches:
                continue
            self._take(batches)
            self._reconcile_pauses(consumer, loop.time())
            self._arrived.set()

    def _is_paused(self, partition: TopicPartition) -> bool:
        return partition in self._paused

    def _take(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Fetched records into their lanes; remember where each partition's next record is."""
        delivery = self._processor.pending
        for partition, records in batches.items():
            if records:
                self._lanes.add(
                    (partition.topic, partition.partition), [delivery(to_source(record)) for record in records]
                )
                self._fetched_to[partition] = records[-1].offset + 1

    async def _wait(self, stop: asyncio.Event, now: float, spaced_until: float) -> None:
        """Wait for fetched records, a finished round, the next due time, the end of the rounds' spacing or of a
        wait for a full round, or half a second, whichever is first."""
        times = [now + _MAX_WAIT_SECONDS]
        if spaced_until > now:
            times.append(spaced_until)
        if (next_due := self._lanes.next_due(now)) is not None:
            times.append(next_due)
        if self._filled_by is not None and self._filled_by > now:
            times.append(self._filled_by)
        timeout = min(times) - now
        self._arrived.clear()
        await wait_unless_stopped(stop, self._arrived, timeout)

    async def hand_over(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
        """Before revoked partitions go to another member: let the rounds in flight finish (bounded), commit what
        they made terminal, then drop the lanes. The next owner then starts after those records instead of racing
        this member's late writes with its own."""
        self._lanes.freeze((partition.topic, partition.partition) for partition in partitions)
        try:
            if self._rounds:
                await asyncio.wait(list(self._rounds), timeout=_HAND_OVER_SECONDS)
            await self._offsets.hand_over(consumer, set(partitions), _HAND_OVER_SECONDS)
        finally:
            self.forget(partitions)  # whatever happened above: the next owner has these partitions

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Drop the lanes of revoked partitions: their records were not terminal; the next owner gets them."""
        self._lanes.forget((partition.topic, partition.partition) for partition in partitions)
        self._offsets.forget(partitions)
        for partition in partitions:
            self._paused.discard(partition)
            self._fetched_to.pop(partition, None)
        self._room.set()

    def _start_round(self, consumer: AIOKafkaConsumer, stop: asyncio.Event, taken: Taken) -> None:
        """Attempt what was taken in a task of its own: the next round is planned while this one's transaction
        runs."""
        self._rounds[asyncio.create_task(self._round(consumer, stop, taken.due))] = taken.ids

    async def _round(self, consumer: AIOKafkaConsumer, stop: asyncio.Event, due: dict[Delivery, RetryState]) -> None:
        left: Collection[Delivery] = ()
        retried: Mapping[Delivery, RetryState] = {}
        started = time.perf_counter()
        trace_id = None
        try:
            attempted = await self._processor.attempt_round(due, stop)
            left, retried, trace_id = attempted.left, attempted.retry, attempted.trace_id
        except Exception as error:
            self._error = error
            return
        finally:
            self._metrics.round_took(time.perf_counter() - started, trace_id)
            self._rounds.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self._offsets.settle(self._lanes.settle(due, left, retried))
            self._arrived.set()
            self._room.set()
        if self._offsets.owed:
            self._offsets.commit_soon(consumer)
        now = asyncio.get_running_loop().time()
        self._reconcile_pauses(consumer, now)
        self._offsets.report_lag(consumer, self._lanes, self._metrics, now)

    def _raise_from_failed_rounds(self) -> None:
        """A round that raised (a bug, not a record failure) stops the consumer, as it would in-line."""
        if self._error is not None:
            raise self._error

    def _reconcile_pauses(self, consumer: AIOKafkaConsumer, now: float) -> None:
        """Pause exactly the partitions that must not fetch now; resume the others."""
        # Only partitions this member owns now: a lane of a partition revoked mid-round is gone or going.
        assigned = consumer.assignment()
        wanted = {TopicPartition(*lane) for lane in self._lanes.stalled(now)} & assigned
        pause, resume = wanted - self._paused, (self._paused - wanted) & assigned
        if pause:
            consumer.pause(*pause)
        if resume:
            consumer.resume(*resume)
        self._paused = wanted

    def _may_start(self, consumer: AIOKafkaConsumer, now: float, spaced_until: float) -> bool:
        """Whether a round may start now, a slot being free.

        Behind a backlog (the broker held a round's worth beyond what was fetched, on the partitions that may fetch),
        while another round is in flight, a round waits until the lanes hold a round's worth (due or not), for at
        most `_FILL_SECONDS`: started with what had been decoded when a slot freed, a drain's rounds were mostly
        fractions of a round, each paying a round's fixed costs in the consumer and PostgreSQL (docs/performance.md,
        "The consumer's loop"). With less beyond what was fetched, a round starts at once if
        what is fetched and what is left make a round's worth, else at least the spacing after the one before.
        The lanes' bound leaves a round's worth of room while a slot is free.
        """
        waiting, fetchable = self._lanes.waiting(), self._fetchable(consumer)
        filling = waiting < self._round_size <= fetchable and bool(self._rounds)
        if not filling:
            self._filled_by = None
            return waiting + fetchable >= self._round_size or now >= spaced_until
        if self._filled_by is None:
            self._filled_by = now + _FILL_SECONDS
        if now < self._filled_by:
            return False
        self._filled_by = None
        return True

    def _fetchable(self, consumer: AIOKafkaConsumer) -> int:
        """Records the broker held, at the last fetch, beyond what this loop has fetched, on the partitions it may
        fetch now (no request is made): a paused partition's backlog would keep rounds waiting for records that do
        not come."""
        behind = 0
        for partition in consumer.assignment():  # (the client asserts that a partition asked about is assigned)
            if partition in self._paused:
                continue
            fetched_to = self._fetched_to.get(partition)
            high = consumer.highwater(partition) if fetched_to is not None else None
            if high is not None and fetched_to is not None and high > fetched_to:
                behind += high - fetched_to
        return behind

    async def _release_parked(self, now: float) -> None:
        """Load parked records of keys that are free again into lanes of their own (ORDERS_ORDERING=key)."""
        if now < self._next_release:
            return
        self._next_release = now + _RELEASE_EVERY_SECONDS
        # Only what the lanes' bound has room for: the lanes bound the consumer's memory whatever is parked. With no
        # room, one key while none is in memory (parked keys move on behind a backlog too), else none: the call still
        # renews this member's claims on the parked records it holds, which another member would take at their end.
        busy = self._lanes.parked_keys()
        room = self._lanes.room()
        keys = max(1, min(_RELEASE_KEYS, room // _RELEASE_PER_KEY)) if room > 0 else 0 if busy else 1
        try:
            released = await self._processor.releasable(busy, keys, _RELEASE_PER_KEY)
        except InfrastructureUnavailable:
            return
        except DBAPIError as error:  # a deadlock or a timeout of this cycle's claim: the next cycle claims again
            log.warning(
                "parked_release_failed", error=type(error.orig).__name__ if error.orig else type(error).__name__
            )
            return
        for delivery in released:
            self._lanes.add(delivery.lane, [delivery])
        if released:
            log.info("parked_released", records=len(released), keys=len({p.key for p in released}))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Log the partitions this member owns after each rebalance, and drop revoked lanes."""

    def __init__(self, loop: ConsumerLoop, consumer: AIOKafkaConsumer) -> None:
        self._loop = loop
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._loop.hand_over(self._consumer, list(revoked))
        log.info("partitions_revoked", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))
