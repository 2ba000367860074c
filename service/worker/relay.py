"""The outbox relay: publishes unpublished outbox rows to Kafka, then marks them published.

At-least-once: a relay that dies between Kafka's acknowledgement and its commit publishes the rows again,
with the same `event-id` / `failure-id` headers, so readers deduplicate on those.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnknownError,
    UnknownTopicOrPartitionError,
)
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.kafka import (
    MAX_UNCOMPRESSED_MESSAGE,
    InvalidRecordError,
    partition_of,
    start_with_backoff,
    stop_quietly,
)
from service.config import Settings
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.faults import crash_point
from service.metrics import Metrics
from service.stopping import sleep_unless_stopped
from service.store import outbox, wakeups
from service.store.outbox import ClaimedRow
from service.store.uow import UnitOfWork
from service.worker.spacing import SPACING_SECONDS, Spacing

log = structlog.get_logger("order_service.relay")
T = TypeVar("T")

_IDLE_POLL_SECONDS = 0.2
# Batches claimed and sent before the oldest one's acknowledgements are awaited (each holds a transaction open):
# while one batch's claim or mark waits for the database, the others keep the broker busy (docs/performance.md).
_IN_FLIGHT = 5
# How often a relay counts the relays that are up and takes or gives back key slots (service/store/outbox.py).
_REBALANCE_SECONDS = 1.0
# Longer than the producer's request timeout (15 s), so that Kafka's own answer, when there is one, comes first.
_WAITING_LOG_SECONDS = 20.0
# The errors that say Kafka will never take this record as it is, whatever the retry, and the code its row is
# set aside with: too large, or content the broker refuses. Not INVALID_TIMESTAMP: the relay's records carry its
# own clock's time, so that answer is about the clock (or the topic's window), and waited out like an outage.
SET_ASIDE_TOO_LARGE = "MESSAGE_TOO_LARGE"
SET_ASIDE_INVALID = "MESSAGE_INVALID"
_REFUSALS: dict[type[KafkaError], str] = {
    MessageSizeTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordListTooLargeError: SET_ASIDE_TOO_LARGE,
    InvalidRecordError: SET_ASIDE_INVALID,  # e.g. a record without a key on a compacted topic (Kafka 2.5 and later)
}
_REFUSED = tuple(_REFUSALS)
# The answer a record's content gets from Kafka before 2.5 (a record without a key on a compacted topic), but a CRC
# error in transit too: a row that gets it when sent alone is sent once more, after a pause the first time in a pass
# (a pass of such rows would otherwise take a second each). Said again, the row is set aside as MESSAGE_INVALID
# when its partition took another row in the pass, or when it got it in three passes (the relay's backoff between
# them); else the pass ends there, as for an outage. Any other answer (an unexpected server error, a format or
# compression the topic does not take) is an outage of the topic, waited out: setting rows aside for it would
# reorder their keys.
_SUSPECT = (CorruptRecordException,)
_SUSPECT_PAUSE_SECONDS = 1.0
_SUSPECT_PASSES = 3
# A topic the broker answers for and does not have (auto-creation is off, or the name is not one Kafka takes): its
# rows wait in the outbox, unclaimed, while every other topic's flow (and their keys' rows of other topics: as behind
# a set-aside row); the relay asks the broker for it again this often. Telling it from an outage takes the broker's
# list of topics: aiokafka gives up on a topic's metadata with the same error in both cases.
_MISSING_TOPIC_CHECK_SECONDS = 30.0
# The longest the relay waits for the broker's list of topics: at a re-check, in the loop that publishes; when a
# topic's metadata did not come, as long as the producer's requests (aiokafka asks the known brokers in turn).
_RECHECK_LISTING_SECONDS = 3.0
_LISTING_SECONDS = 15.0


class TopicMissing(Exception):
    """The broker answers and has no such topic: the row waits for it, neither published nor set aside."""


class Relay:
    """Claims rows with FOR UPDATE SKIP LOCKED, of the key slots it holds; several relays share the keys out."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        metrics: Metrics,
        make_producer: Callable[[], AIOKafkaProducer],
        make_one_by_one_producer: Callable[[], AIOKafkaProducer],
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._metrics = metrics
        self._make_producer = make_producer
        self._make_one_by_one_producer = make_one_by_one_producer
        self.spoiled = False  # the producer must be replaced (a refused record broke its sequence numbers)
        self._batches = 0  # batches committed with rows published: a restart that published resets the backoff
        self._missing: frozenset[str] = frozenset()  # topics the broker does not have: their rows are not claimed
        self._suspected: Counter[int] = Counter()  # per outbox id, the passes it got a corrupt answer twice in
        self._missing_checked = 0.0  # when the broker was last asked for them (monotonic)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set; a broker or database outage is waited out, never a crash."""
        delay = 1.0
        while not stop.is_set():
            producer = self._make_producer()
            self.spoiled = False
            if not await start_with_backoff(producer.start, stop, "relay"):
                await stop_quietly(producer)
                return
            replaced, batches = False, self._batches
            try:
                async with outbox.Slots(self._engine) as slots, wakeups.Wakeups(self._engine, wakeups.OUTBOX) as woken:
                    log.info("relay_started", slots=len(slots.held))
                    await self._publish(producer, slots, stop, woken.waiter())
                    delay = 1.0
                if self.spoiled:
                    self.spoiled, replaced = False, True
                    log.info("relay_producer_replaced", reason="a record was refused")
            except InfrastructureUnavailable:
                delay = self._backoff(delay, batches)
                log.warning("database_unavailable", retry_in_seconds=delay)
            except ConcurrentWrite:
                log.info("relay_batch_redone", reason="deadlock or serialization failure")
                continue
            except KafkaError as error:
                # A fresh producer after a broker outage: the old one's idempotence state may be stale.
                delay = self._backoff(delay, batches)
                log.warning("kafka_publish_failed", error=type(error).__name__, retry_in_seconds=delay)
            finally:
                await producer.stop()
            if replaced:
                continue
            await sleep_unless_stopped(stop, delay)
            delay = min(delay * 2, 30.0)

    def _backoff(self, delay: float, batches: int) -> float:
        """The wait before the next start: the next step of the backoff, or its first when this start published
        (`batches` then: a new outage, not the same one again)."""
        return 1.0 if self._batches > batches else delay

    async def _publish(
        self, producer: AIOKafkaProducer, slots: outbox.Slots, stop: asyncio.Event, waiter: wakeups.Waiter
    ) -> None:
        """Publish batch after batch until `stop` is set or the producer is spoiled, a few at a time: behind a
        backlog (a claim came back full) the next batch is claimed and sent while the last ones' acknowledgements
        are awaited, so that the database and the broker work at once. A batch takes none of the keys of the
        batches in flight, and batches settle in claim order. After a claim that was not full, the next starts at
        least 20 ms after it (service/worker/spacing.py)."""
        started: list[asyncio.Task[int]] = []
        in_flight: deque[tuple[asyncio.Task[int], frozenset[str]]] = deque()
        rebalance_at = time.monotonic() + _REBALANCE_SECONDS
        spacing = Spacing(SPACING_SECONDS)
        try:
            while not stop.is_set() and not self.spoiled:
                await spacing.turn(stop)
                if stop.is_set():
                    break
                if time.monotonic() >= rebalance_at:
                    # Nothing in flight while slots change hands: a slot given back holds no claimed row.
                    await _settle(in_flight)
                    await slots.rebalance()
                    rebalance_at = time.monotonic() + _REBALANCE_SECONDS
                    if self._missing and time.monotonic() >= self._missing_checked + _MISSING_TOPIC_CHECK_SECONDS:
                        await self._look_for_missing(producer)
                busy = frozenset[str]().union(*(keys for _, keys in in_flight))
                previous = in_flight[-1][0] if in_flight else None
                claimed: asyncio.Future[outbox.Claim] = asyncio.get_running_loop().create_future()
                batch = asyncio.create_task(self._publish_batch(producer, slots.held, busy, claimed, previous))
                started = [task for task in started if not task.done()] + [batch]
                either: set[asyncio.Future[Any]] = {batch, claimed}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not claimed.done():  # the claim failed
                    batch.result()
                taken = claimed.result()
                rows = taken.rows
                if taken.full:
                    spacing.full()
                in_flight.append((batch, frozenset(row.key for row in rows if row.key is not None)))
                if not rows and not busy:  # the outbox is drained, for now
                    await _settle(in_flight)
                    # New rows wake it (a notification per inserting transaction); the poll is for one that never came.
                    await waiter.wait(stop, _IDLE_POLL_SECONDS)
                elif not taken.full:
                    # What is left is of keys in flight, or the outbox is drained up to a few rows: the next claim
                    # waits for the oldest batch, and takes what came meanwhile in one batch instead of finding
                    # nothing, or a row or two, each time a batch is sent (at a steady rate, most claims did).
                    await in_flight.popleft()[0]
                while len(in_flight) >= _IN_FLIGHT or (in_flight and in_flight[0][0].done()):
                    await in_flight.popleft()[0]
            await _settle(in_flight)
        finally:
            # Every batch started settles (marks what Kafka took) before the producer goes; on the way out with an
            # error, theirs are the same outage told again.
            await asyncio.gather(*started, return_exceptions=True)

    async def _publish_batch(
        self,
        producer: AIOKafkaProducer,
        slots: frozenset[int],
        busy: frozenset[str],
        claimed: asyncio.Future[outbox.Claim],
        previous: asyncio.Task[int] | None,
    ) -> int:
        """Claim a batch (then `claimed` has its rows) and send it; once Kafka answered for every row and
        the batch before settled, mark what was published and set aside what was refused; return how many."""
        async with UnitOfWork(self._engine) as uow:
            claim = await outbox.claim(
                uow.connection, self._settings.relay_batch_size, slots, busy, missing=self._missing
            )
            claimed.set_result(claim)
            rows = claim.rows
            if not rows:
                return 0
            outcomes = await _said_while_waiting(_send_all(producer, rows), previous)
            if previous is not None:
                # The batch before settles first: a refusal there spoils the producer for this one's failures too.
                await asyncio.wait({previous})
            self._missed([(row, outcome) for row, outcome in zip(rows, outcomes, strict=True)])
            published = [row for row, outcome in zip(rows, outcomes, strict=True) if outcome is None]
            failed = [
                (row, outcome)
                for row, outcome in zip(rows, outcomes, strict=True)
                if outcome is not None and not isinstance(outcome, TopicMissing)
            ]
            refused: list[tuple[ClaimedRow, KafkaError]] = []
            error: BaseException | None = None
            if failed and (self.spoiled or any(isinstance(outcome, _refusals() + _SUSPECT) for _, outcome in failed)):
                # After a refusal the idempotent producer's sequence for that partition is broken (the records
                # after it fail `OutOfOrderSequenceNumber`): it is replaced, and the failed rows go one by one.
                self.spoiled = True
                more, refused, error = await self._one_by_one([row for row, _ in failed])
                published += more
            elif failed:
                error = failed[0][1]
            crash_point("after-publish", self._settings.fault_crash_at)
            # What Kafka acknowledged is marked even when others failed: else it would go out again each round.
            await outbox.mark_published(uow.connection, [row.id for row in published])
            codes = [(row, _set_aside_code(refusal)) for row, refusal in refused]
            for code in sorted({code for _, code in codes}):
                await outbox.set_aside(uow.connection, [row.id for row, kept in codes if kept == code], code)
            await uow.commit()
        self._batches += bool(published)
        self._metrics.published.inc(len(published))
        if error is not None:
            raise error
        for row, refusal in refused:
            # Ids, topic and size only: the row's content is whatever a producer sent.
            log.warning(
                "outbox_row_set_aside",
                outbox_id=row.id,
                topic=row.topic,
                code=_set_aside_code(refusal),
                error=type(refusal).__name__,
                bytes=row.size,
            )
        return len(rows)

    def _missed(self, outcomes: list[tuple[ClaimedRow, BaseException | None]]) -> None:
        """Remember the topics a batch found missing: later claims leave their rows."""
        found = Counter(row.topic for row, outcome in outcomes if isinstance(outcome, TopicMissing))
        for topic in sorted(found.keys() - self._missing):
            log.warning(
                "outbox_topic_missing", topic=topic, rows=found[topic], retry_in_seconds=_MISSING_TOPIC_CHECK_SECONDS
            )
        if found.keys() - self._missing:
            if not self._missing:  # (a topic found missing later does not put off the check of those before it)
                self._missing_checked = time.monotonic()
            self._missing |= found.keys()

    async def _look_for_missing(self, producer: AIOKafkaProducer) -> None:
        """Ask the broker for the missing topics again: those it has now are claimed again."""
        self._missing_checked = time.monotonic()
        present = await _topics(producer, _RECHECK_LISTING_SECONDS)
        if present is None:
            return  # no answer: asked again at the next check
        for topic in sorted(self._missing & present):
            log.info("outbox_topic_found", topic=topic)
        self._missing -= present

    async def _one_by_one(
        self, rows: list[ClaimedRow]
    ) -> tuple[list[ClaimedRow], list[tuple[ClaimedRow, KafkaError]], KafkaError | None]:
        """Send each row alone and await it, in id order (so each key's rows keep their order); return those
        Kafka took, those it refused for their content (with its answer), and the error that stopped it early, if
        one did (the rows after that one are left unpublished, for the next round)."""
        producer = self._make_one_by_one_producer()
        published: list[ClaimedRow] = []
        refused: list[tuple[ClaimedRow, KafkaError]] = []
        try:
            await producer.start()
            partitions: dict[str, list[int]] = {}
            took: set[tuple[str, int]] = set()  # the partitions that took a row in this pass
            paused = False
            for row in rows:
                target = (row.topic, await _partition(producer, row, partitions))
                try:
                    try:
                        await (await _send_row(producer, row, partitions))
                    except _SUSPECT:
                        if not paused:
                            await asyncio.sleep(_SUSPECT_PAUSE_SECONDS)
                            paused = True
                        await (await _send_row(producer, row, partitions))
                except _refusals() as refusal:
                    refused.append((row, refusal))
                except _SUSPECT as suspect:
                    # Twice in a row: the row's content, if its partition took another row meanwhile or the row got
                    # it in pass after pass (a partition of such rows only); else a fault, ended and waited out.
                    self._suspected[row.id] += 1
                    if target not in took and self._suspected[row.id] < _SUSPECT_PASSES:
                        raise
                    del self._suspected[row.id]
                    refused.append((row, suspect))
                else:
                    published.append(row)
                    took.add(target)
                    self._suspected.pop(row.id, None)
        except KafkaError as error:
            return published, refused, error
        finally:
            await producer.stop()
        return published, refused, None


async def _settle(in_flight: deque[tuple[asyncio.Task[int], frozenset[str]]]) -> None:
    """Wait for the batches in flight to settle, oldest first (raising the error of one that failed)."""
    while in_flight:
        await in_flight.popleft()[0]


def _refusals() -> tuple[type[KafkaError], ...]:
    """The refusals, with the class aiokafka answers INVALID_RECORD with: ours once registered, or a later aiokafka's
    own (which `register_error_codes` leaves in place)."""
    invalid_record = kafka_errors.kafka_errors.get(InvalidRecordError.errno)
    if invalid_record is None or invalid_record is InvalidRecordError or issubclass(UnknownError, invalid_record):
        return _REFUSED  # (never a class an unexpected server error is too: that would set rows aside for a fault)
    return (*_REFUSED, invalid_record)


def _set_aside_code(refusal: KafkaError) -> str:
    """The code a row Kafka refused for its content is set aside with."""
    return next((code for kind, code in _REFUSALS.items() if isinstance(refusal, kind)), SET_ASIDE_INVALID)


async def _said_while_waiting(sending: Coroutine[Any, Any, T], previous: asyncio.Task[int] | None) -> T:
    """Await a send, with one log line per interval while it waits (said by the oldest batch in flight only: the
    others wait for the same broker).

    A send waits while the broker is away: aiokafka's sender retries a batch it holds, and `_submit` waits for room
    behind it. Cancelling that send would not help: stopping the producer flushes what it holds, and the rows would
    go out twice. So the relay waits, and says so.
    """
    task = asyncio.ensure_future(sending)
    waited = 0.0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_WAITING_LOG_SECONDS)
            if done:
                return task.result()
            waited += _WAITING_LOG_SECONDS
            if previous is None or previous.done():
                log.warning("kafka_publish_waiting", waited_seconds=waited)
    finally:
        task.cancel()  # (a no-op once it is done; else the send ends with the caller)


async def _send_all(producer: AIOKafkaProducer, rows: list[ClaimedRow]) -> list[BaseException | None]:
    """Send the rows at once; each one's error (`TopicMissing` for a topic the broker does not have), or None once
    Kafka acknowledged it.

    The rows go out in record batches built here, one partition each (the producer's batch API, much cheaper per
    record than `send`: docs/performance.md). A row goes to the partition `send` would pick, and a partition's rows
    are appended in id order and its batches submitted one after the other, so each key's rows keep their order.
    The relay relies on aiokafka's `BatchBuilder` and `DefaultRecordBatchBuilder.estimate_size_in_bytes` as they
    are in the versions its dependency range allows.
    """
    outcomes: list[BaseException | None] = [None] * len(rows)
    partitions: dict[str, list[int]] = {}
    missing = await _resolve(producer, {row.topic for row in rows}, partitions)
    chains: dict[tuple[str, int], list[tuple[BatchBuilder, list[int]]]] = {}
    for index, row in enumerate(rows):
        headers = list(row.headers)
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(row.kafka_key, row.payload, headers)
        if size > MAX_UNCOMPRESSED_MESSAGE:
            # What `send` would refuse before sending: it never reaches the broker, and is set aside.
            outcomes[index] = MessageSizeTooLargeError(f"{row.size} bytes, over the producer's request limit")
            continue
        if row.topic in missing:
            outcomes[index] = TopicMissing(row.topic)
            continue
        target = (row.topic, await _partition(producer, row, partitions))
        chain = chains.setdefault(target, [])
        if (
            not chain
            or chain[-1][0].append(timestamp=None, key=row.kafka_key, value=row.payload, headers=headers) is None
        ):
            builder = producer.create_batch()
            builder.append(timestamp=None, key=row.kafka_key, value=row.payload, headers=headers)  # a first always fits
            chain.append((builder, []))
        chain[-1][1].append(index)

    async def one_partition(target: tuple[str, int], chain: list[tuple[BatchBuilder, list[int]]]) -> None:
        # A partition's batches one after the other, each once Kafka took the one before: the broker keeps no
        # sequence for a fresh idempotent producer whose first batch it refused, and would take the next one, whose
        # rows would overtake the refused batch's rows of the same keys. A refused batch's rows and every later
        # batch's go to `_one_by_one` unsent, in order.
        for position, (builder, _) in enumerate(chain):
            try:
                await (await _submit(producer, builder, target))
            except Exception as error:
                for _, later in chain[position:]:
                    for index in later:
                        outcomes[index] = error
                return

    await asyncio.gather(*(one_partition(target, chain) for target, chain in chains.items()))
    return outcomes


async def _resolve(producer: AIOKafkaProducer, topics: set[str], partitions: dict[str, list[int]]) -> set[str]:
    """Ask for the topics' partitions, all at once (into `partitions`); return those the broker does not have.

    aiokafka waits for a topic's metadata up to its request timeout (15 s) before it gives up on it, the same way
    whether the broker is away or has no such topic: asked one after another, three new missing topics held the
    batch for 45 s.
    """
    missing: set[str] = set()

    async def one(topic: str) -> None:
        try:
            partitions[topic] = sorted(await producer.partitions_for(topic))
        except UnknownTopicOrPartitionError:
            present = await _topics(producer, _LISTING_SECONDS)
            if present is None or topic in present:
                raise  # the broker is away, or the topic's metadata is late: an outage, waited out
            missing.add(topic)

    asked = [asyncio.ensure_future(one(topic)) for topic in topics]
    try:
        await asyncio.gather(*asked)
    except BaseException:
        # The first failure ends the batch: the other questions go with it, not on into a producer about to stop.
        for question in asked:
            question.cancel()
        await asyncio.gather(*asked, return_exceptions=True)
        raise
    return missing


async def _topics(producer: AIOKafkaProducer, within: float) -> frozenset[str] | None:
    """The topics the broker has, or None when no broker answered `within` seconds (aiokafka tries each known broker
    in turn, each up to its request timeout)."""
    try:
        async with asyncio.timeout(within):
            listing = await producer.client.fetch_all_metadata()
    except (KafkaError, TimeoutError):
        return None
    return frozenset(listing.topics())


async def _submit(producer: AIOKafkaProducer, builder: BatchBuilder, target: tuple[str, int]) -> asyncio.Future[Any]:
    """Hand a built batch to the producer; the future of Kafka's answer for all its records.

    The producer queues one built batch per partition at a time: the next waits until the sender has taken it,
    and gives up after the request timeout (`KafkaTimeoutError`) while the broker is away and the sender keeps
    retrying the one before. Giving up here would drop the outcomes of the batches already handed over, and roll
    back rows the producer still holds (they would go out twice), so the relay waits for the broker, as it does
    for a topic's first metadata (`_said_while_waiting` says so). A producer that is closed or failed raises.
    """
    builder.close()
    topic, partition = target
    while True:
        try:
            future: asyncio.Future[Any] = await producer.send_batch(builder, topic, partition=partition)
        except KafkaTimeoutError:
            continue
        return future


async def _partition(producer: AIOKafkaProducer, row: ClaimedRow, partitions: dict[str, list[int]]) -> int:
    """The partition `send` would pick for the row (`partitions`: each topic's, as far as this batch asked).

    A copy of a record that had no key goes out without one, to the partition its ordering key picks (as a keyed
    copy would), so the copies of one order keep their order.
    """
    if row.topic not in partitions:
        partitions[row.topic] = sorted(await producer.partitions_for(row.topic))
    of_topic = partitions[row.topic]
    key = row.kafka_key if row.kafka_key is not None else row.key.encode() if row.key is not None else None
    return partition_of(key, of_topic)


async def _send_row(
    producer: AIOKafkaProducer, row: ClaimedRow, partitions: dict[str, list[int]]
) -> asyncio.Future[Any]:
    """Hand one row to the producer (`partitions`: each topic's partitions, as far as this batch asked)."""
    partition = await _partition(producer, row, partitions)
    future: asyncio.Future[Any] = await producer.send(
        row.topic, row.payload, key=row.kafka_key, partition=partition, headers=list(row.headers)
    )
    return future
