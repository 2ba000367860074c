"""The outbox relay: publishes unpublished outbox rows to Kafka, then marks them published.

At-least-once: a relay that dies between Kafka's acknowledgement and its commit publishes the rows again,
with the same `event-id` / `failure-id` headers, so readers deduplicate on those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.kafka import start_with_backoff, stop_quietly
from service.config import Settings
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.faults import crash_point
from service.metrics import Metrics
from service.stopping import sleep_unless_stopped
from service.store import outbox
from service.store.outbox import ClaimedRow
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.relay")
T = TypeVar("T")

_IDLE_POLL_SECONDS = 0.2
# Longer than the producer's request timeout (15 s), so that Kafka's own answer, when there is one, comes first.
_WAITING_LOG_SECONDS = 20.0
# The errors that say Kafka will never take this record as it is, whatever the retry, and the code its row is
# set aside with: too large, or content the broker refuses (a timestamp outside the topic's window). A record the
# broker finds corrupt is not among them: a CRC error in transit passes with the next try.
SET_ASIDE_TOO_LARGE = "MESSAGE_TOO_LARGE"
SET_ASIDE_INVALID = "MESSAGE_INVALID"
_REFUSALS: dict[type[KafkaError], str] = {
    MessageSizeTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordTooLargeError: SET_ASIDE_TOO_LARGE,
    RecordListTooLargeError: SET_ASIDE_TOO_LARGE,
    InvalidTimestampError: SET_ASIDE_INVALID,
}
_REFUSED = tuple(_REFUSALS)


class Relay:
    """Claims rows with FOR UPDATE SKIP LOCKED; several relays may run at once."""

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

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set; a broker or database outage is waited out, never a crash."""
        delay = 1.0
        while not stop.is_set():
            producer = self._make_producer()
            self.spoiled = False
            if not await start_with_backoff(producer.start, stop, "relay"):
                await stop_quietly(producer)
                return
            log.info("relay_started")
            replaced = False
            try:
                while not stop.is_set() and not self.spoiled:
                    published = await self.publish_once(producer)
                    delay = 1.0
                    if published == 0:
                        await sleep_unless_stopped(stop, _IDLE_POLL_SECONDS)
                if self.spoiled:
                    self.spoiled, replaced = False, True
                    log.info("relay_producer_replaced", reason="a record was refused for its size")
            except InfrastructureUnavailable:
                log.warning("database_unavailable", retry_in_seconds=delay)
            except ConcurrentWrite:
                log.info("relay_batch_redone", reason="deadlock or serialization failure")
                continue
            except KafkaError as error:
                # A fresh producer after a broker outage: the old one's idempotence state may be stale.
                log.warning("kafka_publish_failed", error=type(error).__name__, retry_in_seconds=delay)
            finally:
                await producer.stop()
            if replaced:
                continue
            await sleep_unless_stopped(stop, delay)
            delay = min(delay * 2, 30.0)

    async def publish_once(self, producer: AIOKafkaProducer) -> int:
        """Publish one claimed batch; return how many rows were published or set aside."""
        async with UnitOfWork(self._engine) as uow:
            rows = await outbox.claim(uow.connection, self._settings.relay_batch_size)
            if not rows:
                return 0
            outcomes = await _said_while_waiting(_send_all(producer, rows))
            published = [row for row, outcome in zip(rows, outcomes, strict=True) if outcome is None]
            failed = [(row, outcome) for row, outcome in zip(rows, outcomes, strict=True) if outcome is not None]
            refused: list[tuple[ClaimedRow, str]] = []
            error: BaseException | None = None
            if failed and any(isinstance(outcome, _REFUSED) for _, outcome in failed):
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
            for code in sorted({code for _, code in refused}):
                await outbox.set_aside(uow.connection, [row.id for row, kept in refused if kept == code], code)
            await uow.commit()
        self._metrics.published.inc(len(published))
        if error is not None:
            raise error
        for row, code in refused:
            # Ids, topic and size only: the row's content is whatever a producer sent.
            log.warning("outbox_row_set_aside", outbox_id=row.id, topic=row.topic, code=code, bytes=row.size)
        return len(rows)

    async def _one_by_one(
        self, rows: list[ClaimedRow]
    ) -> tuple[list[ClaimedRow], list[tuple[ClaimedRow, str]], KafkaError | None]:
        """Send each row alone and await it, in id order (so each key's rows keep their order); return those
        Kafka took, those it refused for their content (with the set-aside code), and the error that stopped it
        early, if one did (the rows after that one are left unpublished, for the next round)."""
        producer = self._make_one_by_one_producer()
        published: list[ClaimedRow] = []
        refused: list[tuple[ClaimedRow, str]] = []
        try:
            await producer.start()
            for row in rows:
                try:
                    await (await _send_row(producer, row))
                except _REFUSED as refusal:
                    refused.append((row, _set_aside_code(refusal)))
                else:
                    published.append(row)
        except KafkaError as error:
            return published, refused, error
        finally:
            await producer.stop()
        return published, refused, None


def _set_aside_code(refusal: KafkaError) -> str:
    """The code a row Kafka refused for its content is set aside with."""
    return next(code for kind, code in _REFUSALS.items() if isinstance(refusal, kind))


async def _said_while_waiting(sending: Coroutine[Any, Any, T]) -> T:
    """Await a send, with one log line per interval while it waits.

    aiokafka waits for a topic's first metadata without end while the broker is away (its metadata update
    retries forever). Cancelling that send would not help: stopping the producer flushes what it holds, and
    the rows would go out twice. So the relay waits, and says so.
    """
    task = asyncio.ensure_future(sending)
    waited = 0.0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_WAITING_LOG_SECONDS)
            if done:
                return task.result()
            waited += _WAITING_LOG_SECONDS
            log.warning("kafka_publish_waiting", waited_seconds=waited)
    finally:
        task.cancel()  # (a no-op once it is done; else the send ends with the caller)


async def _send_all(producer: AIOKafkaProducer, rows: list[ClaimedRow]) -> list[BaseException | None]:
    """Send the rows at once; each one's error, or None once Kafka acknowledged it."""
    outcomes: list[BaseException | None] = [None] * len(rows)
    sending: list[tuple[int, asyncio.Future[Any]]] = []
    for index, row in enumerate(rows):
        try:
            sending.append((index, await _send_row(producer, row)))
        except _REFUSED as error:  # refused by the client's own size check, before it was sent
            outcomes[index] = error
    results = await asyncio.gather(*(future for _, future in sending), return_exceptions=True)
    for (index, _), result in zip(sending, results, strict=True):
        outcomes[index] = result if isinstance(result, BaseException) else None
    return outcomes


async def _send_row(producer: AIOKafkaProducer, row: ClaimedRow) -> asyncio.Future[Any]:
    key = row.key_bytes
    partition = None
    if key is None and row.key is not None:
        # A copy of a record that had no key: it goes out without one, to the partition its ordering key picks
        # (as a keyed copy would), so the copies of one order keep their order.
        partitions = sorted(await producer.partitions_for(row.topic))
        partition = DefaultPartitioner()(row.key.encode(), partitions, partitions)
    future: asyncio.Future[Any] = await producer.send(
        row.topic, row.payload, key=key, partition=partition, headers=list(row.headers)
    )
    return future
