"""The outbox relay: publishes unpublished outbox rows to Kafka, then marks them published.

At-least-once: a relay that dies between Kafka's acknowledgement and its commit publishes the rows again,
with the same `event-id` / `failure-id` headers, so readers deduplicate on those.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.kafka import stop_quietly
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.explain import Names, kafka_reason
from service.faults import crash_point
from service.metrics import Metrics
from service.policy.backoff import outage_wait
from service.stopping import sleep_unless_stopped
from service.store import outbox, wakeups
from service.store.outbox import ClaimedRow
from service.store.uow import UnitOfWork
from service.tracing import Sends, Tracing
from service.worker.publishing import (
    SUSPECT,
    TopicMissing,
    broker_topics,
    partition_for,
    refusals,
    send_all,
    send_row,
    set_aside_code,
)
from service.worker.spacing import SPACING_SECONDS, Spacing

log = structlog.get_logger("relay")
T = TypeVar("T")

# Starts a Kafka client until it is up or `stop` is set (False then), saying why each try failed: the relay's
# producer, named `what` in the log (service/adapters/kafka.py, `start_with_backoff`, with the settings bound).
StartClient = Callable[[Callable[[], Awaitable[Any]], asyncio.Event, str], Awaitable[bool]]

_IDLE_POLL_SECONDS = 0.2
# Batches claimed and sent before the oldest one's acknowledgements are awaited (each holds a transaction open):
# while one batch's claim or mark waits for the database, the others keep the broker busy (docs/performance.md).
_IN_FLIGHT = 5
# How often a relay counts the relays that are up and takes or gives back key slots (service/store/outbox.py).
_REBALANCE_SECONDS = 1.0
# Longer than the producer's request timeout (15 s), so that Kafka's own answer, when there is one, comes first.
_WAITING_LOG_SECONDS = 20.0
# A row answered corrupt (publishing.SUSPECT) when sent alone is sent once more, after a pause the first time in a
# pass (a pass of such rows would otherwise take a second each). Said again, the row is set aside as MESSAGE_INVALID
# when its partition took another row in the pass, or when it got it in this many passes (the relay's backoff between
# them); else the pass ends there, as for an outage.
_SUSPECT_PAUSE_SECONDS = 1.0
_SUSPECT_PASSES = 3
# A topic the broker answers for and does not have (auto-creation is off, or the name is not one Kafka takes): its
# rows wait in the outbox, unclaimed, while every other topic's flow (and their keys' rows of other topics: as behind
# a set-aside row); the relay asks the broker for it again this often. Telling it from an outage takes the broker's
# list of topics: aiokafka gives up on a topic's metadata with the same error in both cases.
_MISSING_TOPIC_CHECK_SECONDS = 30.0
_RECHECK_LISTING_SECONDS = 3.0  # the longest a re-check waits for the list, in the loop that publishes


class Relay:
    """Claims rows with FOR UPDATE SKIP LOCKED, of the key slots it holds; several relays share the keys out."""

    def __init__(
        self,
        engine: AsyncEngine,
        metrics: Metrics,
        make_producer: Callable[[], AIOKafkaProducer],
        make_one_by_one_producer: Callable[[], AIOKafkaProducer],
        *,
        start_client: StartClient,
        batch_size: int,
        names: Names,
        crash_at: str | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._start_client = start_client
        # The `send` spans, while tracing (service/tracing.py): off, one check per batch.
        self._tracing = tracing if tracing is not None and tracing.enabled else None
        self._batch_size = batch_size  # rows claimed at once (<PREFIX>RELAY_BATCH_SIZE)
        self._names = names  # the settings' class: the variables a failure's reason names
        self._crash_at = crash_at  # the armed fault point (test instrumentation only: service/faults.py)
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
        failures = 0  # starts in a row that an outage ended
        while not stop.is_set():
            producer = self._make_producer()
            self.spoiled = False
            if not await self._start_client(producer.start, stop, "relay"):
                await stop_quietly(producer)
                return
            replaced, batches = False, self._batches
            try:
                async with outbox.Slots(self._engine) as slots, wakeups.Wakeups(self._engine, wakeups.OUTBOX) as woken:
                    log.info("relay_started", slots=len(slots.held))
                    await self._publish(producer, slots, stop, woken.waiter())
                    failures = 0
                if self.spoiled:
                    self.spoiled, replaced = False, True
                    log.info("relay_producer_replaced", reason="a record was refused")
            except InfrastructureUnavailable:
                failures = self._failed(failures, batches)
                log.warning("database_unavailable", retry_in_seconds=outage_wait(failures))
            except ConcurrentWrite:
                log.info("relay_batch_redone", reason="deadlock or serialization failure")
                continue
            except KafkaError as error:
                # A fresh producer after a broker outage: the old one's idempotence state may be stale.
                failures = self._failed(failures, batches)
                why = kafka_reason([error], doing="WRITE", names=self._names)
                wait = outage_wait(failures)
                log.warning("kafka_publish_failed", error=type(error).__name__, reason=why, retry_in_seconds=wait)
            finally:
                await producer.stop()
            if replaced:
                continue
            await sleep_unless_stopped(stop, outage_wait(failures))

    def _failed(self, failures: int, batches: int) -> int:
        """The starts in a row an outage ended, this one counted: the first again when this start published
        (`batches` then: a new outage, not the same one again)."""
        return 1 if self._batches > batches else failures + 1

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
            claim = await outbox.claim(uow.connection, self._batch_size, slots, busy, missing=self._missing)
            claimed.set_result(claim)
            rows = claim.rows
            if not rows:
                return 0
            sends = self._tracing.sends(rows) if self._tracing is not None else None
            try:
                answered = sends.acknowledged if sends is not None else None
                outcomes = await _said_while_waiting(send_all(producer, rows, answered), previous)
                if previous is not None:
                    # The batch before settles first: a refusal there spoils the producer for this one's failures.
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
                if failed and (self.spoiled or any(isinstance(outcome, refusals() + SUSPECT) for _, outcome in failed)):
                    # After a refusal the idempotent producer's sequence for that partition is broken (the records
                    # after it fail `OutOfOrderSequenceNumber`): it is replaced, and the failed rows go one by one.
                    self.spoiled = True
                    more, refused, error = await self._one_by_one([row for row, _ in failed], sends)
                    published += more
                elif failed:
                    error = failed[0][1]
            except BaseException as stopped:
                if sends is not None:
                    sends.close(type(stopped).__name__)
                raise
            if sends is not None:
                _unsent(sends, rows, outcomes)
            crash_point("after-publish", self._crash_at)
            # What Kafka acknowledged is marked even when others failed: else it would go out again each round.
            await outbox.mark_published(uow.connection, [row.id for row in published])
            codes = [(row, set_aside_code(refusal)) for row, refusal in refused]
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
                code=set_aside_code(refusal),
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
        present = await broker_topics(producer, _RECHECK_LISTING_SECONDS)
        if present is None:
            return  # no answer: asked again at the next check
        for topic in sorted(self._missing & present):
            log.info("outbox_topic_found", topic=topic)
        self._missing -= present

    async def _one_by_one(
        self, rows: list[ClaimedRow], sends: Sends | None = None
    ) -> tuple[list[ClaimedRow], list[tuple[ClaimedRow, KafkaError]], KafkaError | None]:
        """Send each row alone and await it, in id order (so each key's rows keep their order); return those
        Kafka took, those it refused for their content (with its answer), and the error that stopped it early, if
        one did (the rows after that one are left unpublished, for the next round). `sends`: their spans, each
        ended as its row's answer comes."""
        producer = self._make_one_by_one_producer()
        published: list[ClaimedRow] = []
        refused: list[tuple[ClaimedRow, KafkaError]] = []
        try:
            await producer.start()
            partitions: dict[str, list[int]] = {}
            took: set[tuple[str, int]] = set()  # the partitions that took a row in this pass
            paused = False
            for row in rows:
                partition = await partition_for(producer, row, partitions)
                target = (row.topic, partition)
                try:
                    try:
                        await (await send_row(producer, row, partition))
                    except SUSPECT:
                        if not paused:
                            await asyncio.sleep(_SUSPECT_PAUSE_SECONDS)
                            paused = True
                        await (await send_row(producer, row, partition))
                except refusals() as refusal:
                    refused.append((row, refusal))
                    if sends is not None:
                        sends.failed(row, set_aside_code(refusal))
                except SUSPECT as suspect:
                    # Twice in a row: the row's content, if its partition took another row meanwhile or the row got
                    # it in pass after pass (a partition of such rows only); else a fault, ended and waited out.
                    self._suspected[row.id] += 1
                    if target not in took and self._suspected[row.id] < _SUSPECT_PASSES:
                        raise
                    del self._suspected[row.id]
                    refused.append((row, suspect))
                    if sends is not None:
                        sends.failed(row, set_aside_code(suspect))
                else:
                    published.append(row)
                    if sends is not None:
                        sends.took(row, partition)
                    took.add(target)
                    self._suspected.pop(row.id, None)
        except KafkaError as error:
            return published, refused, error
        finally:
            await producer.stop()
        return published, refused, None


def _unsent(sends: Sends, rows: list[ClaimedRow], outcomes: list[BaseException | None]) -> None:
    """End the `send` spans still open when a batch is done: its rows left for a later batch, each with what its
    send met (an outage, a topic the broker does not have)."""
    for row, outcome in zip(rows, outcomes, strict=True):
        if outcome is not None:
            sends.failed(row, type(outcome).__name__)
    sends.close("unsent")


async def _settle(in_flight: deque[tuple[asyncio.Task[int], frozenset[str]]]) -> None:
    """Wait for the batches in flight to settle, oldest first (raising the error of one that failed)."""
    while in_flight:
        await in_flight.popleft()[0]


async def _said_while_waiting(sending: Coroutine[Any, Any, T], previous: asyncio.Task[int] | None) -> T:
    """Await a send, with one log line per interval while it waits (said by the oldest batch in flight only: the
    others wait for the same broker).

    A send waits while the broker is away: aiokafka's sender retries a batch it holds, and `send_all` waits for room
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
