"""The effectful shell around the failure state machine: takes fetched records to a terminal state.

Per round, every record that is due is decoded, looked up and applied; all records that reached a
terminal state in the round are written in ONE transaction (inbox row + order change + effects +
outbox rows, or inbox row + quarantine row + envelope). Each record keeps its own guarantee inside the
shared transaction: its inbox row is the proof it was applied once, and a record that fails is left out
of the write instead of rolling back its neighbours. A failing record holds back the records behind it
in its partition (blocking retry), never the other partitions.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.customers import CustomersClient
from service.config import Settings
from service.domain import model
from service.domain.codes import ErrorCode
from service.domain.messages import DecodeFailure, OrderMessage, OrderPlacedV1, decode
from service.errors import InfrastructureUnavailable, RecordFailure
from service.faults import crash_point
from service.metrics import Metrics
from service.policy.classify import Action, Failure, classify
from service.policy.envelope import event_headers, failure_envelope, iso
from service.policy.owners import owner_for
from service.policy.records import Coordinates, SourceRecord
from service.policy.retry import AttemptHistory, RetryPolicy
from service.stopping import sleep_unless_stopped
from service.store import effects, inbox, orders, outbox, quarantine
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.quarantine import QuarantineRow
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.processor")

Clock = Callable[[], datetime]
OnTerminal = Callable[[Sequence[SourceRecord]], Awaitable[None]]

_CUSTOMER_LOOKUP_CONCURRENCY = 16
_MAX_CONFLICT_ROUNDS = 5


class Outcome(StrEnum):
    """How a record ended."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    QUARANTINED = "quarantined"


@dataclass(eq=False)  # identity semantics: two deliveries of one message are two pending records
class Pending:
    """A fetched record on its way to a terminal state."""

    record: SourceRecord
    decoded: OrderMessage | DecodeFailure
    origin: Coordinates
    history: AttemptHistory | None = None
    due: float = 0.0  # loop time before which the record must not be attempted again
    exhausted: ErrorCode | None = None  # set when the budget is spent: quarantine on the next write

    @property
    def message_id(self) -> str:
        """The record's idempotency identity."""
        return self.record.message_id

    @property
    def order_id(self) -> str | None:
        """The order the record is about, when it decoded."""
        return None if isinstance(self.decoded, DecodeFailure) else self.decoded.order_id

    @property
    def schema_name(self) -> str | None:
        """The payload schema, when readable."""
        if isinstance(self.decoded, DecodeFailure):
            return self.decoded.schema_name
        return self.decoded.schema_name


@dataclass
class _Write:
    """Everything one round writes, in one transaction."""

    inbox_rows: list[InboxRow] = field(default_factory=list)
    created: list[model.Order] = field(default_factory=list)
    changed: list[model.Order] = field(default_factory=list)
    effects: list[model.Effect] = field(default_factory=list)
    messages: list[OutboxMessage] = field(default_factory=list)
    quarantined: list[QuarantineRow] = field(default_factory=list)
    outcomes: list[tuple[Pending, Outcome, ErrorCode | None]] = field(default_factory=list)


class _Conflict(Exception):
    """A concurrent consumer wrote the same message id or order first: redo the round."""


class Processor:
    """Applies batches of source records; the Kafka loop only fetches and commits offsets."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        customers: CustomersClient,
        policy: RetryPolicy,
        metrics: Metrics,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._customers = customers
        self._policy = policy
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._tenants = frozenset(settings.known_tenants)
        self._topics = settings.topics

    async def process(self, records: Sequence[SourceRecord], on_terminal: OnTerminal, stop: asyncio.Event) -> None:
        """Take every record to a terminal state, calling `on_terminal` after each committed write.

        Returns early when `stop` is set: records still waiting for a retry are then not terminal, their
        offsets stay uncommitted, and Kafka delivers them again to whoever owns the partition next.
        """
        queues: dict[tuple[str, int], deque[Pending]] = defaultdict(deque)
        for record in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
            queues[(record.topic, record.partition)].append(self._pending(record))
        loop = asyncio.get_running_loop()
        while any(queues.values()):
            if stop.is_set():
                return
            now = loop.time()
            due = [p for queue in queues.values() if queue and queue[0].due <= now for p in queue]
            if not due:
                wake = min(queue[0].due for queue in queues.values() if queue)
                await sleep_unless_stopped(stop, wake - now)
                continue
            done = await self._round(due, stop)
            for queue in queues.values():
                while queue and queue[0] in done:
                    queue.popleft()
            if done:
                await on_terminal([p.record for p in done])

    def _pending(self, record: SourceRecord) -> Pending:
        return Pending(record=record, decoded=decode(record.value), origin=record.coordinates)

    async def _round(self, due: list[Pending], stop: asyncio.Event) -> set[Pending]:
        """Attempt the due records once; return those that reached a terminal state (committed)."""
        delay = 1.0
        for _ in range(_MAX_CONFLICT_ROUNDS):
            try:
                return await self._attempt(due)
            except _Conflict:
                continue
            except InfrastructureUnavailable:
                # The database is away: nothing was written and no attempt is spent; wait and retry.
                log.warning("database_unavailable", retry_in_seconds=delay)
                await sleep_unless_stopped(stop, delay)
                if stop.is_set():
                    return set()
                delay = min(delay * 2, 30.0)
        return set()

    async def _attempt(self, due: list[Pending]) -> set[Pending]:
        async with UnitOfWork(self._engine) as uow:
            seen = await inbox.known(uow.connection, self._settings.consumer_name, (p.message_id for p in due))
            exists = await orders.existing(uow.connection, filter(None, (p.order_id for p in due)))
        customers, failures = await self._look_up_customers(due, seen, exists)
        ready = _ready(due, failures)
        if not ready:
            done: set[Pending] = set()
        else:
            try:
                done = await self._write(ready, seen, customers)
            except (_Conflict, InfrastructureUnavailable):
                raise
            except Exception as error:
                if len(ready) == 1:
                    log.debug("record_write_failed", message_id=ready[0].message_id, exc_info=error)
                    failures[ready[0]] = Failure(ErrorCode.UNEXPECTED_ERROR)
                    done = set()
                else:
                    # One bad record must not fail its neighbours: apply them one at a time.
                    done = await self._write_one_by_one(ready, seen, customers, failures)
        await self._decide(due, failures)
        return done

    async def _write_one_by_one(
        self,
        ready: list[Pending],
        seen: set[str],
        customers: dict[str, model.CustomerStatus],
        failures: dict[Pending, Failure],
    ) -> set[Pending]:
        done: set[Pending] = set()
        blocked: set[tuple[str, int]] = set()
        for pending in ready:
            partition = (pending.record.topic, pending.record.partition)
            if partition in blocked:
                continue
            try:
                done |= await self._write([pending], seen, customers)
            except (_Conflict, InfrastructureUnavailable):
                raise
            except Exception as error:
                log.debug("record_write_failed", message_id=pending.message_id, exc_info=error)
                failures[pending] = Failure(ErrorCode.UNEXPECTED_ERROR)
                blocked.add(partition)
        return done

    async def _look_up_customers(
        self, due: list[Pending], seen: set[str], exists: set[str]
    ) -> tuple[dict[str, model.CustomerStatus], dict[Pending, Failure]]:
        """Ask the customer directory about the customers of new orders, concurrently, once per customer."""
        wanted: dict[str, list[Pending]] = defaultdict(list)
        for pending in due:
            message = pending.decoded
            if (
                isinstance(message, OrderPlacedV1)
                and pending.exhausted is None
                and pending.message_id not in seen
                and message.order_id not in exists
                and message.tenant in self._tenants
            ):
                wanted[message.customer_id].append(pending)
        statuses: dict[str, model.CustomerStatus] = {}
        failures: dict[Pending, Failure] = {}
        if not wanted or not self._customers.enabled:
            return statuses, failures
        limit = asyncio.Semaphore(_CUSTOMER_LOOKUP_CONCURRENCY)

        async def look_up(customer_id: str) -> None:
            async with limit:
                try:
                    statuses[customer_id] = await self._customers.status(customer_id)
                except RecordFailure as error:
                    for pending in wanted[customer_id]:
                        failures[pending] = Failure(error.code, error.retry_after)
                except Exception as error:
                    log.debug("customer_lookup_failed", exc_info=error)
                    for pending in wanted[customer_id]:
                        failures[pending] = Failure(ErrorCode.UNEXPECTED_ERROR)

        await asyncio.gather(*(look_up(customer_id) for customer_id in wanted))
        return statuses, failures

    async def _write(
        self, ready: list[Pending], seen: set[str], customers: dict[str, model.CustomerStatus]
    ) -> set[Pending]:
        """Apply the ready records in one transaction and commit it."""
        async with UnitOfWork(self._engine) as uow:
            connection = uow.connection
            current = await orders.lock(connection, filter(None, (p.order_id for p in ready)))
            write = self._plan(ready, seen, customers, current)
            consumer = self._settings.consumer_name
            inserted = await inbox.add(connection, consumer, write.inbox_rows)
            if len(inserted) != len(write.inbox_rows):
                raise _Conflict
            created = await orders.create(connection, write.created)
            if len(created) != len(write.created):
                raise _Conflict
            await orders.update(connection, write.changed)
            await effects.add(connection, write.effects)
            await quarantine.add(connection, consumer, write.quarantined)
            await outbox.add(connection, write.messages)
            await uow.commit()
        crash_point("after-commit", self._settings.fault_crash_at)
        for pending, outcome, code in write.outcomes:
            self._metrics.record(outcome.value, code.value if code else None)
            if outcome is not Outcome.PROCESSED:
                log.info(
                    f"record_{outcome.value}",
                    message_id=pending.message_id,
                    failure_id=pending.origin.failure_id if outcome is Outcome.QUARANTINED else None,
                    error_code=code.value if code else None,
                    trace_id=pending.record.trace_id,
                )
        return {pending for pending, _, _ in write.outcomes}

    def _plan(
        self,
        ready: list[Pending],
        seen: set[str],
        customers: dict[str, model.CustomerStatus],
        current: dict[str, model.Order],
    ) -> _Write:
        """Decide, in memory and in partition order, what each ready record writes."""
        write = _Write()
        state = dict(current)
        touched: dict[str, None] = {}  # insertion-ordered set of changed order ids
        applied_ids = set(seen)
        for pending in ready:
            if pending.message_id in applied_ids:
                write.outcomes.append((pending, Outcome.DUPLICATE, None))
                continue
            applied_ids.add(pending.message_id)
            message = pending.decoded
            if pending.exhausted is not None:
                self._quarantine(write, pending, pending.exhausted)
                continue
            if isinstance(message, DecodeFailure):
                self._quarantine(write, pending, message.code)
                continue
            context = model.Context(self._tenants, _customer_status(customers, message))
            result = model.apply(message, state.get(message.order_id), context)
            if isinstance(result, model.Rejected):
                self._reject(write, pending, result.code)
                continue
            state[message.order_id] = result.order
            touched[message.order_id] = None
            write.effects.extend(result.effects)
            write.messages.extend(self._event(pending, event) for event in result.events)
            write.inbox_rows.append(self._inbox_row(pending, "processed", None))
            write.outcomes.append((pending, Outcome.PROCESSED, None))
        # An order created and changed in the same round is inserted once, in its final state.
        write.created = [state[order_id] for order_id in touched if order_id not in current]
        write.changed = [state[order_id] for order_id in touched if order_id in current]
        return write

    def _inbox_row(self, pending: Pending, status: str, code: ErrorCode | None) -> InboxRow:
        origin = pending.origin
        return InboxRow(
            message_id=pending.message_id,
            status=status,
            source_topic=origin.topic,
            source_partition=origin.partition,
            source_offset=origin.offset,
            order_id=pending.order_id,
            error_code=code.value if code else None,
            received_at=pending.record.timestamp,
        )

    def _event(self, pending: Pending, event: model.Event) -> OutboxMessage:
        document = {
            "type": event.type,
            "orderId": event.order_id,
            "messageId": pending.message_id,
            **event.payload,
        }
        headers = event_headers(pending.message_id, event.type, pending.record.trace_id)
        return OutboxMessage.json(self._topics.events, event.order_id, headers, document)

    def _reject(self, write: _Write, pending: Pending, code: ErrorCode) -> None:
        origin = pending.origin
        document = {
            "type": "order.rejected",
            "orderId": pending.order_id,
            "messageId": pending.message_id,
            "errorCode": code.value,
            "payloadSchema": pending.schema_name,
            "source": {"topic": origin.topic, "partition": origin.partition, "offset": origin.offset},
            "rejectedAt": iso(self._clock()),
        }
        headers = {
            **event_headers(pending.message_id, "order.rejected", pending.record.trace_id),
            "error-code": code,
        }
        write.messages.append(OutboxMessage.json(self._topics.rejected, pending.order_id, headers, document))
        write.inbox_rows.append(self._inbox_row(pending, "rejected", code))
        write.outcomes.append((pending, Outcome.REJECTED, code))

    def _quarantine(self, write: _Write, pending: Pending, code: ErrorCode) -> None:
        now = self._clock()
        history = pending.history or AttemptHistory.first(now)
        envelope = failure_envelope(
            pending.record,
            pending.origin,
            consumer=self._settings.consumer_name,
            history=history,
            code=code,
            payload_schema=pending.schema_name,
        )
        key = pending.record.key_text or pending.order_id
        write.messages.append(OutboxMessage.json(self._topics.quarantine, key, envelope.headers(), envelope.document))
        write.quarantined.append(
            QuarantineRow(
                failure_id=envelope.failure_id,
                message_id=pending.message_id,
                error_code=code.value,
                owner=owner_for(code),
                order_key=key,
                envelope=envelope.document,
                payload=pending.record.value,
                source_headers=[[name, value.decode("utf-8", "replace")] for name, value in pending.record.headers],
                attempts=history.attempts,
                first_failed_at=history.first_failed_at,
                last_failed_at=history.last_failed_at,
            )
        )
        write.inbox_rows.append(self._inbox_row(pending, "quarantined", code))
        write.outcomes.append((pending, Outcome.QUARANTINED, code))

    async def _decide(self, due: list[Pending], failures: dict[Pending, Failure]) -> None:
        """Run `classify` on each failed record and schedule its next step."""
        if not failures:
            return
        now = self._clock()
        loop_now = asyncio.get_running_loop().time()
        for pending in due:
            failure = failures.get(pending)
            if failure is None:
                continue
            history = pending.history.failed_again(now) if pending.history else AttemptHistory.first(now)
            pending.history = history
            decision = classify(failure, history, self._policy, now, self._rng)
            self._metrics.failure(failure.code.value)
            log.info(
                "record_failed",
                message_id=pending.message_id,
                failure_id=pending.origin.failure_id,
                error_code=failure.code.value,
                attempt=history.attempts,
                decision=decision.action.value,
                retry_in_seconds=decision.delay.total_seconds() if decision.delay else None,
                trace_id=pending.record.trace_id,
            )
            if decision.action is Action.RETRY and decision.delay is not None:
                pending.due = loop_now + decision.delay.total_seconds()
            else:
                pending.exhausted = decision.code
                pending.due = loop_now


def _customer_status(customers: dict[str, model.CustomerStatus], message: OrderMessage) -> model.CustomerStatus:
    """What the directory said about a new order's customer; active when it was not asked (lookups disabled)."""
    if isinstance(message, OrderPlacedV1):
        return customers.get(message.customer_id, model.CustomerStatus.ACTIVE)
    return model.CustomerStatus.ACTIVE


def _ready(due: list[Pending], failures: dict[Pending, Failure]) -> list[Pending]:
    """The records that can be written now: in each partition, those before its first failed record."""
    blocked: set[tuple[str, int]] = set()
    ready = []
    for pending in due:
        partition = (pending.record.topic, pending.record.partition)
        if partition in blocked:
            continue
        if pending in failures:
            blocked.add(partition)
            continue
        ready.append(pending)
    return ready
