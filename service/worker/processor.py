"""The effectful shell around the failure state machine: takes records one round closer to a terminal state.

A round attempts every record that is due. All records that reach a terminal state in the round are
written in ONE transaction (inbox row + order change + effects + outbox rows; or inbox row + quarantine row
+ envelope; or a parked row; or a hand-off to a retry tier). Each record keeps its own guarantee inside the
shared transaction: its inbox row is the proof it was applied once, and a record that fails is left out of
the write instead of rolling back its neighbours. A failing record holds back the records behind it in its
lane (its partition, or its key's parked records), never other lanes.

The consumer loop owns the lanes and the Kafka side; this class only decides and writes.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.domain.codes import Code, ErrorCode, FailureKind
from service.durations import format_duration
from service.errors import ConcurrentWrite, InfrastructureUnavailable, RecordFailure
from service.faults import crash_point, fail_point
from service.metrics import Metrics
from service.policy import ordering, redelivery
from service.policy.backpressure import BackpressurePolicy, pause_for, run_after_round
from service.policy.classify import Action, Failure, classify
from service.policy.envelope import event_headers, failure_envelope
from service.policy.handling import DecodeFailure, Rejected
from service.policy.headers import from_json, to_json
from service.policy.owners import owner_for, parse_owners
from service.policy.records import Coordinates, SourceRecord, pack_key, unpack_key
from service.policy.retry import AttemptHistory, RetryPolicy
from service.stopping import sleep_unless_stopped
from service.store import batch, inbox, lookups, parking, quarantine, retries
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.parking import ParkedRecord, StoredParked
from service.store.quarantine import QuarantineRow
from service.store.retries import RetryRow
from service.store.uow import UnitOfWork, is_passing
from service.worker.handler import Handler

log = structlog.get_logger("order_service.processor")

Clock = Callable[[], datetime]

_LOOKUP_CONCURRENCY = 16
_MAX_CONFLICT_ROUNDS = 5
# A member's claim on the parked records it releases; renewed every release cycle (half a second) while they are
# in its memory, so it only runs out when the member is gone or stalled, and another member then takes them.
_RELEASE_LEASE = timedelta(seconds=30)
PARKED_TOPIC = "(parked)"
_FREE_KEY = ordering.KeyState()  # a key with no retry head, block or parked records


class Outcome(StrEnum):
    """How a record left the processor; all but HELD let its offset be committed."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    QUARANTINED = "quarantined"
    PARKED = "parked"
    STALE = "stale"
    RETRY_SCHEDULED = "retry_scheduled"
    HELD = "held"


@dataclass(eq=False, slots=True)  # identity semantics: two deliveries of one message are two pending records
class Pending:
    """A fetched (or unparked) record on its way to a terminal state.

    Its identities (message id, order id, ordering key, lane, thread) are computed once, when it is made: a
    round asks for them many times per record.
    """

    record: SourceRecord
    decoded: Any  # the domain's message (Handler.decode), or a DecodeFailure
    origin: Coordinates
    origin_timestamp_ms: int
    parked_id: int | None = None  # came out of the parked table
    history: AttemptHistory | None = None
    in_tier: bool = False  # delivered from a retry tier (no blocking retries there)
    reprocess: bool = False  # a quarantined record sent back by `order-service reprocess`
    reopen: bool = False  # a reprocessed record whose inbox row says `quarantined`: moved, not inserted
    due: float = 0.0  # loop time before which the record must not be attempted
    backpressure: bool = False  # waiting because a downstream asked to slow down: pause the partition
    verdict: ErrorCode | None = None  # budget spent: quarantine with this code on the next write
    next_tier: timedelta | None = None  # hand over to the retry tier with this delay on the next write
    last_code: ErrorCode | None = None
    in_flight: bool = False  # a round is attempting it now
    message_id: str = field(init=False)  # the record's idempotency identity
    failed: bool = field(init=False)  # the bytes did not decode into a message
    aggregate_id: str | None = field(init=False)  # the aggregate the record is about, when it decoded
    key: str | None = field(init=False)  # the ordering key: the record key, else the aggregate id
    lane: tuple[str, int] = field(init=False)  # applied in order: a partition, or the parked records of one key
    thread: tuple[str, int, str] = field(init=False)  # what must stay in order: a key within a lane

    def __post_init__(self) -> None:
        record = self.record
        self.message_id = record.message_id
        self.failed = isinstance(self.decoded, DecodeFailure)
        self.aggregate_id = None if self.failed else self.decoded.aggregate_id
        self.key = record.key_text or self.aggregate_id
        if self.parked_id is not None:
            self.lane = (f"{PARKED_TOPIC}/{self.key}", -1)
        else:
            self.lane = (record.topic, record.partition)
        # A record without a key is a thread of its own.
        self.thread = (*self.lane, self.key if self.key is not None else f"#{record.offset}")

    @property
    def schema_name(self) -> str | None:
        """The payload schema, when readable."""
        schema: str | None = self.decoded.schema_name
        return schema


@dataclass(frozen=True)
class _Facts:
    """What the database says about a round's records (one look-up), and the ordering state of their keys."""

    known: lookups.Known
    keys: dict[str, ordering.KeyState]


@dataclass(frozen=True)
class _Plan:
    """A round's inputs to the write: routes, database facts, the duplicates among the records (decided once
    per record and round), and what the customer directory said."""

    routes: dict[Pending, ordering.Route]
    facts: _Facts
    duplicates: set[Pending]
    looked_up: dict[str, Any]  # the outside facts the handler looked up, by key


@dataclass
class _Write:
    """Everything one round writes, in one transaction."""

    inbox_rows: list[InboxRow] = field(default_factory=list)
    reopened: list[InboxRow] = field(default_factory=list)  # quarantined messages a reprocess applied
    reprocessed: list[str] = field(default_factory=list)  # their failure ids
    requarantined: list[tuple[Pending, ErrorCode]] = field(default_factory=list)
    created: list[Any] = field(default_factory=list)  # the domain's aggregates
    changed: list[Any] = field(default_factory=list)
    effects: list[Any] = field(default_factory=list)  # the domain's effects (idempotency_key, kind, payload)
    messages: list[OutboxMessage] = field(default_factory=list)
    quarantined: list[QuarantineRow] = field(default_factory=list)
    parked: list[ParkedRecord] = field(default_factory=list)
    unparked: list[int] = field(default_factory=list)
    unclaimed: list[int] = field(default_factory=list)  # parked rows left parked: their key is held again
    retrying: list[RetryRow] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    blocks: list[tuple[str, str]] = field(default_factory=list)
    outcomes: list[tuple[Pending, Outcome, Code | None]] = field(default_factory=list)
    stepped: Collection[str] = ()  # message ids with a retry row, per the round's look-up
    holding: Collection[str] = ()  # of those, the ones that hold their key (a retrying head)


class Processor:
    """Applies rounds of records; the Kafka loop fetches, keeps lanes and commits offsets."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        handler: Handler,
        policy: RetryPolicy,
        backpressure: BackpressurePolicy,
        metrics: Metrics,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._handler = handler
        self._policy = policy
        self._backpressure = backpressure
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        self._topics = settings.topics
        self._consumer = settings.consumer_name
        self._owners = parse_owners(settings.quarantine_owners)
        self._failing: dict[str, int] = defaultdict(int)  # consecutive transient failures per downstream
        # A reprocessed record gets the blocking retries only; if it fails again it goes back to quarantine.
        self._reprocess_policy = replace(policy, tiers=())
        # Who claims parked records for release: one process, one lease holder (several members share a table).
        self._member = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    def pending(self, record: SourceRecord) -> Pending:
        """A fetched record as a Pending; a tier copy carries its origin and history in headers."""
        pending = Pending(record, self._handler.decode(record.value), record.coordinates, record.timestamp_ms)
        if record.topic == self._topics.reprocess:
            origin = redelivery.origin_of(record)
            if origin is not None:
                pending.origin, pending.origin_timestamp_ms = origin
                pending.reprocess = True
            return pending
        copy = redelivery.parse(record) if record.topic.startswith(f"{self._topics.source}.retry.") else None
        if copy is not None:
            pending.origin = copy.origin
            pending.origin_timestamp_ms = copy.origin_timestamp_ms
            pending.history = copy.history
            pending.in_tier = True
            wait = (copy.due_at - self._clock()).total_seconds()
            pending.due = asyncio.get_running_loop().time() + max(0.0, wait)
        return pending

    def unreadable(self, topic: str, partition: int, offset: int) -> Pending:
        """A record the Kafka client cannot decode: only its coordinates are known (the consumer loop)."""
        record = SourceRecord(topic, partition, offset, int(self._clock().timestamp() * 1000), None, None)
        decoded = DecodeFailure(ErrorCode.UNREADABLE_RECORD)
        return Pending(record, decoded, record.coordinates, record.timestamp_ms)

    def unparked(self, stored: StoredParked) -> Pending:
        """A parked record, taken out to be applied now that its key is free."""
        parked = stored.record
        record = SourceRecord(
            topic=parked.source_topic,
            partition=parked.source_partition,
            offset=parked.source_offset,
            timestamp_ms=parked.timestamp_ms,
            key=unpack_key(parked.source_key) if parked.source_key is not None else parked.ordering_key.encode(),
            value=parked.value,
            headers=from_json(parked.headers),
        )
        # The id it was parked under, computed once at the source: never recomputed from a copy.
        record.message_id = parked.message_id
        return Pending(record, self._handler.decode(record.value), record.coordinates, record.timestamp_ms, stored.id)

    async def releasable(self, busy: set[str], keys: int = 50, per_key: int = 100) -> list[Pending]:
        """Claim parked records of keys that are free again, oldest first; `busy` keys are already in memory
        (their claims are renewed). Another member's claimed keys are left to it until its lease ends."""
        async with UnitOfWork(self._engine) as uow:
            stored = await parking.releasable(
                uow.connection,
                self._consumer,
                self._member,
                exclude=busy,
                keys=keys,
                per_key=per_key,
                lease=_RELEASE_LEASE,
            )
            await uow.commit()
        return [self.unparked(row) for row in stored]

    async def let_go(self) -> None:
        """Give up this member's claims on parked records (on the way out), so another member takes them now."""
        try:
            async with UnitOfWork(self._engine) as uow:
                await parking.unclaim(uow.connection, self._member)
                await uow.commit()
        except InfrastructureUnavailable:
            pass  # the leases end on their own

    async def attempt(self, due: Sequence[Pending], stop: asyncio.Event) -> set[Pending]:
        """Attempt the due records once; return those that left (committed), in any outcome.

        Records that failed get a new `due`, `history`, `verdict` or `next_tier` for the next round.
        """
        delay = 1.0
        for _ in range(_MAX_CONFLICT_ROUNDS):
            try:
                return await self._attempt(list(due))
            except ConcurrentWrite:
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
        facts = await self._facts(due)
        routes = {p: self._route(p, facts) for p in due}
        duplicates = {p for p in due if self._is_duplicate(p, facts)}
        applicable = [p for p in due if routes[p] is ordering.Route.APPLY and p not in duplicates]
        looked_up, failures = await self._look_up(applicable, facts)
        ready = _ready(due, failures, hold_behind_tier=self._settings.ordering == "key")
        done: set[Pending] = set()
        plan = _Plan(routes, facts, duplicates, looked_up)
        if ready:
            try:
                done = await self._write(ready, plan)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as error:
                if len(ready) == 1:
                    done = await self._write_failed(ready[0], plan, failures, error)
                else:
                    # One bad record must not fail its neighbours: apply them one at a time.
                    done = await self._write_one_by_one(ready, plan, failures)
        await self._decide(due, failures)
        return done

    async def _facts(self, due: list[Pending]) -> _Facts:
        keys = {p.key for p in due if p.key} if self._settings.ordering == "key" else set()
        # Which aggregates exist decides what the handler looks up and which aggregates the write must lock.
        aggregate_ids = {p.aggregate_id for p in due if p.aggregate_id}
        async with UnitOfWork(self._engine) as uow:
            known = await lookups.known(
                uow.connection,
                self._consumer,
                self._handler.rows.lookup,
                {p.message_id for p in due},
                aggregates=aggregate_ids,
                keys=keys,
            )
        states = {
            key: ordering.KeyState(known.heads.get(key), key in known.blocked, key in known.parked)
            for key in known.heads.keys() | known.blocked | known.parked
        }
        return _Facts(known, states)

    def _route(self, pending: Pending, facts: _Facts) -> ordering.Route:
        # A tier copy or a reprocessed record is the head of its key: it never waits behind its own key.
        if pending.key is None or pending.in_tier or pending.reprocess:
            return ordering.Route.APPLY
        state = facts.keys.get(pending.key, _FREE_KEY)
        return ordering.route(
            self._settings.ordering, state, message_id=pending.message_id, from_parked=pending.parked_id is not None
        )

    def _reads(self, pending: Pending, plan: _Plan) -> bool:
        """Whether the write must read and lock the record's order. Not for a duplicate, and not for a new order
        the look-up found absent: if a concurrent consumer creates it meanwhile, the round's insert fails on the
        order's key and the round is redone, now with the order locked."""
        if pending in plan.duplicates:
            return False
        return not self._handler.creates(pending.decoded) or pending.aggregate_id in plan.facts.known.aggregates

    def _is_duplicate(self, pending: Pending, facts: _Facts) -> bool:
        """Already terminal, or already handed to a retry tier by an earlier copy (a crash between the
        hand-off commit and the offset commit), or an old step of a record that moved on."""
        status = facts.known.seen.get(pending.message_id)
        if pending.reprocess:
            # A quarantined message may become processed once; one already processed stays a no-op.
            return status in ("processed", "rejected")
        if status is not None:
            return True
        if pending.parked_id is None and pending.message_id in facts.known.parked_ids:
            return True  # parked already: delivered again (its offset had not been committed yet)
        step = facts.known.steps.get(pending.message_id)
        if step is None:
            return pending.in_tier  # a tier copy of a record that is terminal already
        return not pending.in_tier or pending.history is None or pending.history.tier_step != step

    async def _look_up(self, candidates: list[Pending], facts: _Facts) -> tuple[dict[str, Any], dict[Pending, Failure]]:
        """Ask the handler's downstream what `candidates` (applicable, not duplicates) need, before the
        transaction: concurrently, once per key."""
        wanted: dict[str, list[Pending]] = defaultdict(list)
        failures: dict[Pending, Failure] = {}
        looked_up: dict[str, Any] = {}
        downstream = self._handler.downstream
        if downstream is None:
            return looked_up, failures
        known = facts.known.aggregates
        for pending in candidates:
            if pending.verdict is None and pending.next_tier is None and not pending.failed:
                key = self._handler.context_key(pending.decoded, known)
                if key is not None:
                    wanted[key].append(pending)
        if not wanted:
            return looked_up, failures
        limit = asyncio.Semaphore(_LOOKUP_CONCURRENCY)
        timeout = self._settings.processing_timeout.total_seconds()

        async def look_up(key: str) -> None:
            async with limit:
                try:
                    async with asyncio.timeout(timeout):
                        looked_up[key] = await self._handler.look_up(key)
                    self._failing[downstream] = 0
                    return
                except TimeoutError:
                    failure = Failure(ErrorCode.PROCESSING_TIMEOUT, downstream=downstream)
                except RecordFailure as error:
                    failure = Failure(error.code, error.retry_after, error.downstream)
                except Exception as error:
                    log.debug("lookup_failed", exc_info=error)
                    failure = Failure(ErrorCode.UNEXPECTED_ERROR)
                for pending in wanted[key]:
                    failures[pending] = failure

        await asyncio.gather(*(look_up(key) for key in wanted))
        return looked_up, failures

    async def _write_one_by_one(
        self, ready: list[Pending], plan: _Plan, failures: dict[Pending, Failure]
    ) -> set[Pending]:
        done: set[Pending] = set()
        blocked: set[tuple[str, int, str]] = set()
        for pending in ready:
            if pending.thread in blocked:
                continue
            try:
                done |= await self._write([pending], plan)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as error:
                left = await self._write_failed(pending, plan, failures, error)
                if not left:
                    blocked.add(pending.thread)
                done |= left
        return done

    async def _write_failed(
        self, pending: Pending, plan: _Plan, failures: dict[Pending, Failure], error: Exception
    ) -> set[Pending]:
        """A record whose write failed on its own. One on its way to quarantine is quarantined by the last-resort
        path, whose rows hold nothing taken from the record but its bytes (`bytea`), so that it cannot fail the
        same way again; any other record failed `UNEXPECTED_ERROR` and is retried within its budget."""
        log.debug("record_write_failed", message_id=pending.message_id, error=type(error).__name__)
        if _quarantine_bound(pending, plan) and not is_passing(error):
            log.error("quarantine_write_failed", message_id=pending.message_id, error=type(error).__name__)
            try:
                return await self._write([pending], plan, last_resort=True)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as again:
                log.error("last_resort_quarantine_failed", message_id=pending.message_id, error=type(again).__name__)
        failures[pending] = Failure(ErrorCode.UNEXPECTED_ERROR)
        return set()

    async def _write(self, ready: list[Pending], plan: _Plan, *, last_resort: bool = False) -> set[Pending]:
        """Apply the ready records in one transaction and commit it (`last_resort`: quarantine the one record
        with an envelope of nothing but its identities, see `_write_failed`)."""
        async with UnitOfWork(self._engine) as uow:
            c = uow.connection
            wanted = (p.aggregate_id for p in ready if plan.routes[p] is ordering.Route.APPLY and self._reads(p, plan))
            current = await self._handler.lock(c, filter(None, wanted))
            write = self._plan(ready, plan, current, last_resort=last_resort)
            if write.quarantined and not last_resort:
                fail_point("quarantine-write", self._settings.fault_fail_at)
            reopened = await inbox.reopen(c, self._consumer, write.reopened)
            if len(reopened) != len(write.reopened):
                raise ConcurrentWrite("a quarantined message was moved concurrently")
            await quarantine.mark_reprocessed(c, write.reprocessed)
            await parking.unblock_failures(c, write.reprocessed)
            for again, failed_code in write.requarantined:
                history = again.history or AttemptHistory.first(self._clock())
                await quarantine.requarantine(
                    c, again.origin.failure_id, failed_code.value, history.attempts, history.last_failed_at
                )
            await batch.write(
                c,
                self._consumer,
                self._handler.rows,
                inbox_rows=write.inbox_rows,
                created=write.created,
                changed=write.changed,
                new_effects=write.effects,
                quarantined=write.quarantined,
                messages=write.messages,
            )
            await parking.park(c, self._consumer, write.parked)
            await parking.unpark(c, write.unparked)
            await parking.unclaim(c, self._member, write.unclaimed)
            await parking.block(c, self._consumer, write.blocks)
            await retries.upsert(c, self._consumer, write.retrying)
            if write.retrying:
                # A member that lost the partition while it wrote may hand over a record the new owner has already
                # finished: no retry row may outlive its record's terminal state.
                await retries.drop_finished(c, self._consumer, [row.message_id for row in write.retrying])
            await retries.finish(c, self._consumer, write.finished)
            crash_point("mid-write", self._settings.fault_crash_at)
            await uow.commit()
        crash_point("after-commit", self._settings.fault_crash_at)
        counts: Counter[tuple[Outcome, Code | None]] = Counter()
        for pending, outcome, code in write.outcomes:
            counts[outcome, code] += 1
            if outcome is not Outcome.PROCESSED:
                log.info(
                    f"record_{outcome.value}",
                    message_id=pending.message_id,
                    failure_id=pending.origin.failure_id if pending.history or code else None,
                    error_code=code.value if code else None,
                    key=pending.key if outcome in (Outcome.PARKED, Outcome.HELD) else None,
                    trace_id=pending.record.trace_id,
                )
        for (outcome, code), count in counts.items():
            self._metrics.record(outcome.value, code.value if code else None, count)
        return {pending for pending, _, _ in write.outcomes}

    def _plan(self, ready: list[Pending], plan: _Plan, current: dict[str, Any], *, last_resort: bool = False) -> _Write:
        """Decide, in memory and in lane order, what each ready record writes."""
        write = _Write(stepped=plan.facts.known.steps.keys(), holding=plan.facts.known.head_ids)
        state = dict(current)
        touched: dict[str, None] = {}  # insertion-ordered set of changed aggregate ids
        seen_now: set[str] = set()
        facts = plan.facts
        for pending in ready:
            route = plan.routes[pending]
            if route is ordering.Route.HOLD:
                if pending.parked_id is not None:
                    write.unclaimed.append(pending.parked_id)
                write.outcomes.append((pending, Outcome.HELD, None))
                continue
            if pending in plan.duplicates or pending.message_id in seen_now:
                self._leave(write, pending, Outcome.DUPLICATE, None, orphan=self._orphaned(pending, facts))
                continue
            seen_now.add(pending.message_id)
            pending.reopen = pending.reprocess and facts.known.seen.get(pending.message_id) == "quarantined"
            if route is ordering.Route.PARK:
                self._park(write, pending)
                continue
            message = pending.decoded
            if last_resort:
                code = pending.verdict or (message.code if isinstance(message, DecodeFailure) else None)
                self._quarantine(write, pending, code or ErrorCode.UNEXPECTED_ERROR, last_resort=True)
            elif pending.next_tier is not None:
                self._to_tier(write, pending)
            elif pending.verdict is not None:
                self._quarantine(write, pending, pending.verdict)
            elif isinstance(message, DecodeFailure):
                self._quarantine(write, pending, message.code)
            else:
                before = state.get(message.aggregate_id)
                if before is not None and ordering.is_stale(
                    self._settings.ordering, self._handler.sequence(message), before.sequence
                ):
                    self._terminal(write, pending, "processed", None)
                    self._leave(write, pending, Outcome.STALE, None)
                    continue
                result = self._handler.apply(message, before, plan.looked_up)
                if isinstance(result, Rejected):
                    self._reject(write, pending, result.code)
                    continue
                state[message.aggregate_id] = result.order
                touched[message.aggregate_id] = None
                write.effects.extend(result.effects)
                for event in result.events:
                    write.messages.append(self._event(pending, event, result.order.version))
                self._terminal(write, pending, "processed", None)
                self._leave(write, pending, Outcome.PROCESSED, None)
        # An aggregate created and changed in the same round is inserted once, in its final state.
        write.created = [state[key] for key in touched if key not in current]
        write.changed = [state[key] for key in touched if key in current]
        return write

    def _leave(
        self, write: _Write, pending: Pending, outcome: Outcome, code: Code | None, *, orphan: bool = False
    ) -> None:
        """Book-keeping every departing record shares: out of the parked table and the retry table.

        A record that reaches its terminal state takes its retry row with it in the same transaction. A duplicate
        keeps the row (a tier copy of an old step must not end the record's current step) unless the record is
        terminal already: then the row is an `orphan` that a revoked member's late hand-off left behind.
        """
        if pending.parked_id is not None:
            write.unparked.append(pending.parked_id)
        if orphan or (outcome is not Outcome.DUPLICATE and (pending.in_tier or pending.message_id in write.stepped)):
            write.finished.append(pending.message_id)
        if orphan:
            log.warning("retry_orphan_removed", message_id=pending.message_id)
        write.outcomes.append((pending, outcome, code))

    @staticmethod
    def _orphaned(pending: Pending, facts: _Facts) -> bool:
        """A duplicate whose record is terminal while a retry row for it still exists."""
        known = facts.known
        return pending.message_id in known.steps and known.seen.get(pending.message_id) is not None

    def _terminal(self, write: _Write, pending: Pending, status: str, code: Code | None) -> None:
        """The inbox row of a record that reached `status`; a reprocessed quarantined record moves its row."""
        row = self._inbox_row(pending, status, code)
        if pending.reopen:
            write.reopened.append(row)
        else:
            write.inbox_rows.append(row)
        if pending.reprocess:
            write.reprocessed.append(pending.origin.failure_id)

    def _inbox_row(self, pending: Pending, status: str, code: Code | None) -> InboxRow:
        origin = pending.origin
        return InboxRow(
            message_id=pending.message_id,
            status=status,
            source_topic=origin.topic,
            source_partition=origin.partition,
            source_offset=origin.offset,
            aggregate_id=pending.aggregate_id,
            error_code=code.value if code else None,
            received_ms=pending.record.timestamp_ms,
        )

    def _event(self, pending: Pending, event: Any, version: int) -> OutboxMessage:
        event_type, aggregate_id, document = self._handler.event(event, version, pending.message_id)
        headers = event_headers(pending.message_id, event_type, pending.record.trace_id)
        return OutboxMessage.json(self._topics.events, aggregate_id, headers, document)

    def _park(self, write: _Write, pending: Pending) -> None:
        assert pending.key is not None
        record = pending.record
        write.parked.append(
            ParkedRecord(
                ordering_key=pending.key,
                message_id=pending.message_id,
                source_topic=record.topic,
                source_partition=record.partition,
                source_offset=record.offset,
                timestamp_ms=record.timestamp_ms,
                value=record.value,
                headers=to_json(record.headers),
                source_key=pack_key(record.key),
            )
        )
        write.outcomes.append((pending, Outcome.PARKED, None))

    def _to_tier(self, write: _Write, pending: Pending) -> None:
        """Hand the record to its next retry tier: a copy on `<source>.retry.<delay>` via the outbox."""
        assert pending.history is not None
        assert pending.next_tier is not None
        assert pending.last_code is not None
        history = pending.history.sent_to_tier()
        due_at = self._clock() + pending.next_tier
        headers = redelivery.tier_headers(
            pending.record,
            pending.message_id,
            pending.origin,
            pending.origin_timestamp_ms,
            history,
            due_at,
            pending.last_code,
        )
        topic = self._topics.retry(format_duration(pending.next_tier))
        value = pending.record.value or b""
        write.messages.append(OutboxMessage(topic, pending.key, to_json(headers), value, pack_key(pending.record.key)))
        write.retrying.append(
            RetryRow(
                message_id=pending.message_id,
                ordering_key=pending.key,
                failure_id=pending.origin.failure_id,
                attempts=history.attempts,
                tier_step=history.tier_step,
                first_failed_at=history.first_failed_at,
                last_failed_at=history.last_failed_at,
                due_at=due_at,
                error_code=pending.last_code.value,
            )
        )
        if pending.parked_id is not None:
            write.unparked.append(pending.parked_id)
        write.outcomes.append((pending, Outcome.RETRY_SCHEDULED, pending.last_code))

    def _reject(self, write: _Write, pending: Pending, code: Code) -> None:
        event_type, document = self._handler.rejection(
            pending.message_id, pending.aggregate_id, code, pending.schema_name, pending.origin, self._clock()
        )
        headers = {**event_headers(pending.message_id, event_type, pending.record.trace_id), "error-code": code}
        write.messages.append(OutboxMessage.json(self._topics.rejected, pending.aggregate_id, headers, document))
        self._terminal(write, pending, "rejected", code)
        self._leave(write, pending, Outcome.REJECTED, code)

    def _quarantine(self, write: _Write, pending: Pending, code: ErrorCode, *, last_resort: bool = False) -> None:
        if pending.reprocess:
            # It failed again: back to the queue with a higher repeat count, nothing flows back on its own.
            write.requarantined.append((pending, code))
            if not pending.reopen:
                write.inbox_rows.append(self._inbox_row(pending, "quarantined", code))
            self._leave(write, pending, Outcome.QUARANTINED, code)
            return
        now = self._clock()
        history = pending.history or AttemptHistory.first(now)
        envelope = failure_envelope(
            pending.record,
            pending.origin,
            consumer=self._consumer,
            history=history,
            code=code,
            payload_schema=None if last_resort else pending.schema_name,
            timestamp_ms=pending.origin_timestamp_ms,
        )
        if last_resort:
            envelope.document["lastResort"] = True
        key = pending.key
        stored_key = None if last_resort else key  # the last resort stores nothing taken from the record as text
        write.messages.append(
            OutboxMessage.json(self._topics.quarantine, stored_key, envelope.headers(), envelope.document)
        )
        write.quarantined.append(
            QuarantineRow(
                failure_id=envelope.failure_id,
                message_id=pending.message_id,
                error_code=code.value,
                owner=owner_for(code, self._owners),
                ordering_key=stored_key,
                envelope=envelope.document,
                payload=pending.record.value,
                source_headers=to_json(pending.record.headers),  # every name and value as base64 when not text
                attempts=history.attempts,
                first_failed_at=history.first_failed_at,
                last_failed_at=history.last_failed_at,
            )
        )
        # A head that waited in a retry tier and is now quarantined keeps its key held (ORDERS_ORDERING=key),
        # unless an operator released the key while it waited (its retry row no longer holds the key).
        if (
            pending.in_tier
            and key is not None
            and self._settings.ordering == "key"
            and pending.message_id in write.holding
        ):
            write.blocks.append((key, envelope.failure_id))
        write.inbox_rows.append(self._inbox_row(pending, "quarantined", code))
        self._leave(write, pending, Outcome.QUARANTINED, code)

    async def _decide(self, due: list[Pending], failures: dict[Pending, Failure]) -> None:
        """Apply backpressure or run `classify` on each failed record, and schedule its next step."""
        if not failures:
            return
        now = self._clock()
        loop_now = asyncio.get_running_loop().time()
        failed_on = Counter(
            f.downstream for f in failures.values() if f.downstream and f.code.kind is FailureKind.TRANSIENT
        )
        for downstream, count in failed_on.items():
            self._failing[downstream] = run_after_round(self._failing[downstream], count, self._backpressure)
        for pending in due:
            failure = failures.get(pending)
            if failure is None:
                continue
            self._metrics.failure(failure.code.value, _tier_of(pending))
            pause = pause_for(failure, self._failing[failure.downstream or ""], self._backpressure)
            started = pending.history.first_failed_at if pending.history else now
            budget = self._policy.for_kind(failure.code.kind).total.max_elapsed
            if pause is not None and (now + pause) - started <= budget:
                # Backpressure: the downstream asked us to wait. Wait without spending an attempt; the elapsed
                # budget still runs, so a downstream that never comes back still ends in quarantine.
                pending.history = pending.history or AttemptHistory(0, now, now)
                pending.due = loop_now + pause.total_seconds()
                pending.backpressure = True
                await self._log_pause(pending, failure, pause)
                continue
            pending.backpressure = False
            history = pending.history.failed_again(now) if pending.history else AttemptHistory.first(now)
            pending.history = history
            pending.last_code = failure.code
            policy = self._reprocess_policy if pending.reprocess else self._policy
            decision = classify(failure, history, policy, now, self._rng, in_tier=pending.in_tier)
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
            elif decision.action is Action.RETRY_LATER:
                pending.next_tier = decision.delay
                pending.due = loop_now
            else:
                pending.verdict = decision.code
                pending.due = loop_now

    async def _log_pause(self, pending: Pending, failure: Failure, pause: timedelta) -> None:
        self._metrics.pause(failure.downstream or "unknown")
        log.warning(
            "backpressure_pause",
            topic=pending.record.topic,
            partition=pending.record.partition,
            downstream=failure.downstream,
            error_code=failure.code.value,
            pause_seconds=pause.total_seconds(),
            message_id=pending.message_id,
        )
        try:
            async with UnitOfWork(self._engine) as uow:
                await parking.log_pause(
                    uow.connection,
                    self._consumer,
                    pending.record.topic,
                    pending.record.partition,
                    failure.downstream,
                    failure.code.value,
                    pause.total_seconds(),
                )
                await uow.commit()
        except InfrastructureUnavailable:
            log.warning("database_unavailable", what="pause log")


def _quarantine_bound(pending: Pending, plan: _Plan) -> bool:
    """Whether the record's write was its quarantine (a spent budget or input that does not decode)."""
    if pending.reprocess or pending.next_tier is not None or plan.routes[pending] is not ordering.Route.APPLY:
        return False
    if pending in plan.duplicates:
        return False
    return pending.verdict is not None or pending.failed


def _tier_of(pending: Pending) -> str:
    """Where an attempt happened: `blocking` (first delivery), a retry tier's delay, or `reprocess`."""
    if pending.reprocess:
        return "reprocess"
    if pending.in_tier:
        return pending.record.topic.rsplit(".", 1)[-1]
    return "blocking"


def _ready(due: list[Pending], failures: dict[Pending, Failure], *, hold_behind_tier: bool) -> list[Pending]:
    """The records that can be written now: all but a failed record and the records of its key behind it.

    Under key ordering, the records behind a record that is handed to a retry tier in this round wait for the
    next round too, where they find the key held and are parked.
    """
    blocked: set[tuple[str, int, str]] = set()
    ready = []
    for pending in due:
        if pending.thread in blocked:
            continue
        if pending in failures:
            blocked.add(pending.thread)
            continue
        ready.append(pending)
        if hold_behind_tier and pending.next_tier is not None:
            blocked.add(pending.thread)
    return ready
