"""The effectful shell of a round: takes deliveries one round closer to a terminal state.

A round attempts every delivery that is due. All deliveries that reach a terminal state in the round are
written in ONE transaction (inbox row + aggregate change + effects + outbox rows; or inbox row + quarantine row
+ envelope; or a parked row; or a hand-off to a retry tier). Each record keeps its own guarantee inside the
shared transaction: its inbox row is the proof it was applied once, and a record that fails is left out of
the write instead of rolling back its neighbours. A failing record holds back the records behind it in its
lane (its partition, or its key's parked records), never other lanes.

A round is: fetch the facts → look up what the messages need outside → lock → decide → apply → commit. The decisions
are pure (service/policy/decide.py: the one value a write holds; service/policy/next_step.py: what follows a
failure); this class calls them between the I/O of a `RoundStore` (service/worker/round_store.py), the domain's
look-ups (wrapped in their timeout and failure classification, service/worker/middleware.py), and the logs and
metrics. The consumer loop owns the lanes (and with them each delivery's retry state) and the Kafka side.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import structlog

from service.adapters.breakers import Breakers
from service.codes import Code, ErrorCode
from service.config import Topics
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.metrics import Metrics
from service.policy import redelivery
from service.policy.backoff import outage_wait
from service.policy.breaker import State
from service.policy.classify import Failure
from service.policy.decide import decide
from service.policy.delivery import Delivery, RetryState
from service.policy.handling import DecodeFailure
from service.policy.headers import from_json
from service.policy.next_step import Budgets, charged_once
from service.policy.owners import Owners
from service.policy.records import SourceRecord, trace_id_of, unpack_key
from service.policy.retry import RetryPolicy
from service.policy.round import Outcome, Round, RoundPlan, Write, ready, survey, to_lock
from service.ports import Handler
from service.stopping import sleep_unless_stopped
from service.store.parking import StoredParked
from service.store.uow import is_passing
from service.tracing import Tracing
from service.worker.downtime import Downtime
from service.worker.failures import Failures
from service.worker.middleware import FaultPoints, classified, faulty_commit, faulty_write, timed
from service.worker.round_store import RoundStore
from service.worker.writes import RowMaker

log = structlog.get_logger("processor")

Clock = Callable[[], datetime]

LOOKUP_CONCURRENCY = 16  # a round's context look-ups (a directory the domain asks) at once
_MAX_CONFLICT_ROUNDS = 5
_NO_FAULTS = FaultPoints()


@dataclass(frozen=True, slots=True)
class RoundSettings:
    """What a consumer's rounds take from the settings (built by the composition root, service/containers.py)."""

    topics: Topics
    consumer: str  # ORDERS_CONSUMER_NAME
    ordering: str  # ORDERS_ORDERING
    processing_timeout: timedelta  # a look-up's longest wait
    quarantine_owners: Mapping[str, str] = field(default_factory=dict)  # error code -> owner, over the domain's
    faults: FaultPoints = _NO_FAULTS


@dataclass(frozen=True, slots=True)
class Attempted:
    """What a round did: the deliveries that left (committed, in any outcome), and the new retry state of each
    delivery that failed (the lanes keep it for the next round)."""

    left: frozenset[Delivery]
    retry: Mapping[Delivery, RetryState]
    trace_id: str | None = None  # the first sampled process span's, while tracing (the round's latency exemplar)


@dataclass
class RoundSpans:
    """A traced round's process spans and the outcomes they end with."""

    spans: dict[Delivery, Any]
    outcomes: dict[Delivery, tuple[str, str | None]] = field(default_factory=dict)


# The traced round of the task that runs it: the consumer plans its next round while one's transaction runs, so two
# rounds of one processor can overlap, each in its own task (and so its own context).
_ROUND: ContextVar[RoundSpans | None] = ContextVar("round_spans", default=None)


_NOTHING = Attempted(frozenset(), {})


class Processor:
    """Applies rounds of deliveries; the Kafka loop fetches, keeps lanes and commits offsets."""

    def __init__(
        self,
        settings: RoundSettings,
        store: RoundStore,
        handler: Handler[Any, Any, Any],
        owners: Owners,
        policy: RetryPolicy,
        metrics: Metrics,
        clock: Clock,
        rng: random.Random,
        downtime: Downtime,
        breakers: Breakers | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._breakers = breakers
        self._tracing = tracing if tracing is not None and tracing.enabled else None
        self._handler = handler
        self._metrics = metrics
        self._clock = clock
        self._topics = settings.topics
        self._consumer = settings.consumer
        self._ordering = settings.ordering
        self._timeout = settings.processing_timeout.total_seconds()
        self._rows = RowMaker(settings.topics, self._consumer, owners, settings.quarantine_owners, handler).rows
        self._faulty_write = faulty_write(settings.faults)
        self._faulty_commit = faulty_commit(settings.faults)
        self._downtime = downtime
        self._failures = Failures(Budgets.of(policy), metrics, clock, rng, downtime, self._consumer)

    def pending(self, record: SourceRecord) -> Delivery:
        """A fetched record as a delivery; a tier copy carries its origin and history in headers. A tier or reprocess
        copy addressed to another consumer name (two consumers of one source share its topics) is foreign: it is
        committed past, never applied."""
        decoded = self._handler.decode(record.value)
        copied = record.topic == self._topics.reprocess or record.topic.startswith(self._topics.retry_prefix)
        if copied and redelivery.addressed_elsewhere(record, self._consumer):
            return Delivery(record, decoded, record.coordinates, record.timestamp_ms, foreign=True)
        if record.topic == self._topics.reprocess:
            origin = redelivery.origin_of(record)
            if origin is not None:
                coordinates, timestamp_ms = origin
                return Delivery(record, decoded, coordinates, timestamp_ms, reprocess=True)
            return Delivery(record, decoded, record.coordinates, record.timestamp_ms)
        copy = redelivery.parse(record) if record.topic.startswith(self._topics.retry_prefix) else None
        if copy is None:
            return Delivery(record, decoded, record.coordinates, record.timestamp_ms)
        wait = (copy.due_at - self._clock()).total_seconds()
        # A copy fetched past its due time waited for our relay, broker or consumer, not for its downstream.
        history = copy.history.excusing(timedelta(seconds=max(0.0, -wait)))
        due = asyncio.get_running_loop().time() + max(0.0, wait)
        arrival = RetryState(history, due, downtime_mark=self._downtime.total)
        return Delivery(record, decoded, copy.origin, copy.origin_timestamp_ms, arrival=arrival, in_tier=True)

    def unreadable(self, topic: str, partition: int, offset: int) -> Delivery:
        """A record the Kafka client cannot decode: only its coordinates are known (the consumer loop)."""
        record = SourceRecord(topic, partition, offset, int(self._clock().timestamp() * 1000), None, None)
        decoded = DecodeFailure(ErrorCode.UNREADABLE_RECORD)
        return Delivery(record, decoded, record.coordinates, record.timestamp_ms)

    def unparked(self, stored: StoredParked) -> Delivery:
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
        record.link = stored.trace_context  # the attempt that parked it
        decoded = self._handler.decode(record.value)
        return Delivery(record, decoded, record.coordinates, record.timestamp_ms, stored.id)

    async def releasable(self, busy: set[str], keys: int = 50, per_key: int = 100) -> list[Delivery]:
        """Claim parked records of keys that are free again, oldest first; `busy` keys are already in memory
        (their claims are renewed). Another member's claimed keys are left to it until its lease ends."""
        return [self.unparked(row) for row in await self._store.releasable(busy, keys, per_key)]

    async def let_go(self) -> None:
        """Give up this member's claims on parked records (on the way out), so another member takes them now."""
        await self._store.let_go()

    async def attempt(self, due: Sequence[Delivery], stop: asyncio.Event) -> frozenset[Delivery]:
        """Attempt deliveries once, each in the retry state it arrived with; return those that left.

        For callers without lanes (one-off rounds); the consumer loop uses `attempt_round`.
        """
        return (await self.attempt_round({delivery: delivery.arrival for delivery in due}, stop)).left

    async def attempt_round(self, due: Mapping[Delivery, RetryState], stop: asyncio.Event) -> Attempted:
        """Attempt the due deliveries (with their retry states, in lane order) once."""
        failures = 0
        for _ in range(_MAX_CONFLICT_ROUNDS):
            started = self._downtime.now()
            try:
                return await self._attempt(due)
            except ConcurrentWrite:
                continue
            except InfrastructureUnavailable:
                # The database is away: nothing was written and no attempt is spent; wait and retry. The wait is
                # downtime: it does not count against the records' elapsed budgets.
                failures += 1
                delay = outage_wait(failures)
                log.warning("database_unavailable", retry_in_seconds=delay)
                with self._downtime.waiting(since=started):  # the attempt that found it too (a pool's timeout)
                    await sleep_unless_stopped(stop, delay)
                if stop.is_set():
                    return _NOTHING
        return _NOTHING

    async def _attempt(self, due: Mapping[Delivery, RetryState]) -> Attempted:
        tracing = self._tracing
        if tracing is None:
            return await self._attempt_untraced(due)
        traced = RoundSpans(tracing.process(list(due), self._consumer))
        token = _ROUND.set(traced)
        try:
            attempted = await self._attempt_untraced(due)
            for delivery, state in attempted.retry.items():
                if delivery not in traced.outcomes:
                    code = state.last_code.value if state.last_code is not None else None
                    traced.outcomes[delivery] = ("waiting", None) if state.breaker else ("failed", code)
            return replace(attempted, trace_id=tracing.sampled_trace_id(traced.spans.values()))
        finally:
            _ROUND.reset(token)
            tracing.ended(traced.spans, traced.outcomes)

    async def _attempt_untraced(self, due: Mapping[Delivery, RetryState]) -> Attempted:
        key_ordering = self._ordering == "key"
        round_ = survey(due, await self._store.facts(due, keys=key_ordering), self._ordering)
        looked_up, failures = await self._look_up(round_)
        writable = ready(round_, failures, hold_behind_tier=key_ordering)
        done: frozenset[Delivery] = frozenset()
        if writable:
            try:
                done = await self._write(writable, round_, looked_up)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as error:
                if len(writable) == 1:
                    done = await self._write_failed(writable[0], round_, looked_up, failures, error)
                else:
                    # One bad record must not fail its neighbours: apply them one at a time.
                    done = await self._write_one_by_one(writable, round_, looked_up, failures)
        return Attempted(done, self._failures.decide(round_, failures))

    async def _look_up(self, round_: Round) -> tuple[dict[str, Any], dict[Delivery, Failure]]:
        """Ask the handler's downstream what the round's messages need, before the transaction: concurrently,
        once per key."""
        failures: dict[Delivery, Failure] = {}
        looked_up: dict[str, Any] = {}
        downstream = self._handler.downstream
        if downstream is None:
            return looked_up, failures
        wanted: dict[str, list[Delivery]] = defaultdict(list)
        known = round_.facts.aggregates
        for delivery in round_.due:
            if round_.needs_context(delivery):
                key = self._handler.context_key(delivery.decoded, known)
                if key is not None:
                    wanted[key].append(delivery)
        if not wanted:
            return looked_up, failures
        limit = asyncio.Semaphore(LOOKUP_CONCURRENCY)
        call = classified(downstream)(timed(self._timeout)(self._handler.look_up))
        guard = self._breakers[downstream] if self._breakers is not None else None
        closed_before = guard is not None and guard.breaker.state is State.CLOSED

        traced = _ROUND.get()
        spans = traced.spans if traced is not None else None

        async def look_up(key: str) -> None:
            async with limit:
                if spans is None:
                    answer = await call(key)
                else:
                    # Its HTTP spans are children of the first record's process span that asks for it.
                    with self._tracing.within(spans.get(wanted[key][0])):  # type: ignore[union-attr]
                        answer = await call(key)
            if isinstance(answer, Failure):
                failures.update(charged_once(answer, wanted[key], round_.due))
            else:
                looked_up[key] = answer

        await asyncio.gather(*(look_up(key) for key in wanted))
        if failures and closed_before and guard is not None and guard.breaker.state is not State.CLOSED:
            # The round's look-ups opened the downstream's breaker: an outage, and its failures are no record's.
            # Without this, the first `threshold - 1` answers of the run that opens it would be charged, once per
            # member and per outage: a record whose tier copies move between members would pay each time. (A breaker
            # open before the round charged none of its calls already, and gives nothing back: a record that fails
            # alone while another cause holds the breaker open is charged as a lone failure.)
            failures = {
                delivery: replace(failure, charged=False) if failure.downstream == downstream else failure
                for delivery, failure in failures.items()
            }
        return looked_up, failures

    async def _write_one_by_one(
        self, writable: list[Delivery], round_: Round, looked_up: dict[str, Any], failures: dict[Delivery, Failure]
    ) -> frozenset[Delivery]:
        done: set[Delivery] = set()
        blocked: set[tuple[str, int, str]] = set()
        for delivery in writable:
            if delivery.thread in blocked:
                continue
            try:
                done |= await self._write([delivery], round_, looked_up)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as error:
                left = await self._write_failed(delivery, round_, looked_up, failures, error)
                if not left:
                    blocked.add(delivery.thread)
                done |= left
        return frozenset(done)

    async def _write_failed(
        self,
        delivery: Delivery,
        round_: Round,
        looked_up: dict[str, Any],
        failures: dict[Delivery, Failure],
        error: Exception,
    ) -> frozenset[Delivery]:
        """A delivery whose write failed on its own. One on its way to quarantine is quarantined by the last-resort
        path, whose rows hold nothing taken from the record but its bytes (`bytea`), so that it cannot fail the
        same way again; any other failed `UNEXPECTED_ERROR` and is retried within its budget."""
        log.debug("record_write_failed", message_id=delivery.message_id, error=type(error).__name__)
        if round_.quarantine_bound(delivery) and not is_passing(error):
            log.error("quarantine_write_failed", message_id=delivery.message_id, error=type(error).__name__)
            try:
                return await self._write([delivery], round_, looked_up, last_resort=True)
            except (ConcurrentWrite, InfrastructureUnavailable):
                raise
            except Exception as again:
                log.error("last_resort_quarantine_failed", message_id=delivery.message_id, error=type(again).__name__)
        failures[delivery] = Failure(ErrorCode.UNEXPECTED_ERROR)
        return frozenset()

    async def _write(
        self, writable: list[Delivery], round_: Round, looked_up: dict[str, Any], *, last_resort: bool = False
    ) -> frozenset[Delivery]:
        """Lock, decide what the writable deliveries write, apply it and commit, in one transaction (`last_resort`:
        the one delivery's quarantine with an envelope of nothing but its identities, see `_write_failed`)."""
        traced = _ROUND.get()
        spans = traced.spans if traced is not None else None
        with self._tracing.write(spans, writable) if spans is not None else nullcontext():  # type: ignore[union-attr]
            async with self._store.transaction() as transaction:
                current = await transaction.lock(to_lock(writable, round_, self._handler.creates))
                write = decide(
                    writable,
                    round_,
                    looked_up,
                    current,
                    self._clock(),
                    self._handler,
                    self._rows,
                    last_resort=last_resort,
                )
                await self._faulty_write(transaction.apply)(write)
                await self._faulty_commit(transaction.commit)()
        self._report(write.plan, round_.due)
        return frozenset([step.delivery for step in write.plan.steps])

    def _report(self, plan: RoundPlan, due: Mapping[Delivery, RetryState]) -> None:
        """Log each delivery that left other than processed (at info; a duplicate at debug), and count the outcomes
        once per round."""
        for message_id in plan.orphans:
            log.warning("retry_orphan_removed", message_id=message_id)
        # Counted here, not with a Counter over every step: each step's key would hash an enum in Python.
        counts: Counter[tuple[Write, Code | None]] = Counter()
        traced = _ROUND.get()
        if traced is not None:
            for delivery, write, code, _, _ in plan.steps:
                failed = write in (Write.QUARANTINE, Write.LAST_RESORT, Write.REQUARANTINE)
                traced.outcomes[delivery] = (write.outcome.value, code.value if failed and code else None)
        for delivery, write, code, _, _ in plan.steps:
            if write is not Write.APPLY:
                counts[write, code] += 1
                outcome = write.outcome
                # A duplicate is routine (a redelivery after a restart or a rebalance, a producer's retry): its
                # count is enough at info, as an applied record's is; its line is for debugging.
                (log.debug if write is Write.DUPLICATE else log.info)(
                    f"record_{outcome.value}",
                    message_id=delivery.message_id,
                    failure_id=delivery.origin.failure_id if due[delivery].history or code else None,
                    error_code=code.value if code else None,
                    key=delivery.key if outcome in (Outcome.PARKED, Outcome.HELD) else None,
                    trace_id=trace_id_of(delivery.record, self._consumer),
                )
        applied = len(plan.steps) - counts.total()  # an applied step has no code
        if applied:
            counts[Write.APPLY, None] = applied
        for (write, code), count in counts.items():
            self._metrics.record(write.outcome.value, code.value if code else None, count)
