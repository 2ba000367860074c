"""The effect worker: executes pending external effects, of the kinds a domain registered, with stable idempotency keys.

Per batch: claim (lease) in one short transaction, call the providers outside any transaction, then record every
outcome — with what its kind writes (events, aggregate changes) — in one transaction. A call whose provider is not
idempotent is only made again after a look-up found nothing. A batch is what the calls can make in about 200 ms at
the provider's recent pace (`claim_size`): the two commits are paid per batch, not per effect.

Each kind of effect has lanes of its own (two, so that one claims and records while the other's calls are out) and at
most `ORDERS_EFFECT_CONCURRENCY` calls in flight: a provider that is slow, rate limits or fails holds back only its
own effects, never another provider's. While a provider's circuit breaker is open its kinds' lanes claim nothing
(their effects stay pending, spending nothing), and when its probe may go they claim one effect. A kind's lanes take
turns to claim: after a claim that was not full, the next starts at least 20 ms later (service/worker/spacing.py).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.adapters.breakers import Breakers
from service.codes import ErrorCode
from service.config import Topics
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.explain import Names
from service.metrics import Metrics
from service.policy import backoff
from service.policy.backoff import outage_wait
from service.policy.breaker import State
from service.policy.effects import (
    CallOutcome,
    EffectDecision,
    EffectPolicy,
    Found,
    LookupFailed,
    NotSent,
    Refused,
    Sent,
    Unknown,
    after_call,
    claim_size,
)
from service.ports import EffectRegistry, Settled
from service.stopping import sleep_unless_stopped, wait_unless_stopped
from service.store import effects, wakeups
from service.store.effects import EffectRow, Settlement
from service.store.uow import UnitOfWork, one_statement
from service.tracing import Tracing, header
from service.worker.spacing import Spacing

log = structlog.get_logger("effects")

_IDLE_POLL_SECONDS = 0.2
_LANES_PER_KIND = 2
_RECORD_TRIES = 5
# The outcomes of calls already made wait for the database briefly and often: their lease is running out.
_RECORD_FIRST_WAIT_SECONDS, _RECORD_LONGEST_WAIT_SECONDS = 0.1, 2.0
_PACE_WEIGHT = 0.05  # of each call in the moving average of a kind's call durations
_HANDED_BACK = EffectDecision("pending", retry_in=timedelta(0), unmade=True)
# A call's outcome as its span's `outcome` says it.
_CALL_OUTCOMES: dict[type, str] = {Sent: "sent", Refused: "refused", NotSent: "not_sent", Unknown: "unknown"}


def call_budget(http_timeout: timedelta) -> float:
    """The longest one provider exchange may take, in seconds: a look-up and a call, each within the HTTP timeout."""
    return 2 * http_timeout.total_seconds()


async def record_outcomes(
    connection: AsyncConnection,
    topics: Topics,
    kinds: EffectRegistry,
    outcomes: Sequence[Settled],
    *,
    from_state: str,
    owner: str | None = None,
) -> set[str]:
    """Write effects' next states and what their kinds say follows (events, aggregate changes), in the caller's
    transaction; return the idempotency keys written. An effect that moved meanwhile (another process owns it
    now) is left out, and so is what would have followed from it."""
    await effects.join_by_key(connection)
    kept = await effects.settle_all(
        connection,
        [
            Settlement.of(
                effect.idempotency_key, decision, from_state=from_state, owner=owner, attempts=effect.attempts
            )
            for effect, decision in outcomes
        ],
    )
    by_kind: dict[str, list[Settled]] = {}
    # In aggregate order: each kind locks its aggregates in the order the consumer's round locks them.
    for effect, decision in sorted(outcomes, key=lambda outcome: outcome[0].aggregate_id):
        if effect.idempotency_key in kept:
            by_kind.setdefault(effect.kind, []).append((effect, decision))
    for kind, settled in by_kind.items():
        await kinds[kind].on_outcomes(connection, topics, settled)
    # An effect that waits for one resolved here is due now, with no insert to wake its lanes: this transaction does.
    resolved = [
        (effect.kind, effect.aggregate_id)
        for effect, decision in outcomes
        if effect.idempotency_key in kept and decision.state in effects.RESOLVED
    ]
    first_kinds = {kind for kind, _ in resolved}
    if waiting := {kind for kind, first in kinds.dependencies() if first in first_kinds}:
        await effects.wake_waiting(connection, wakeups.EFFECTS, {aggregate for _, aggregate in resolved}, waiting)
    return kept


class EffectWorker:
    """Claims pending effects with FOR UPDATE SKIP LOCKED and a lease; several workers may run at once."""

    def __init__(
        self,
        engine: AsyncEngine,
        kinds: EffectRegistry,
        policy: EffectPolicy,
        metrics: Metrics,
        rng: random.Random,
        breakers: Breakers | None = None,
        *,
        topics: Topics,
        lease: timedelta,
        concurrency: int,
        budget: float,
        names: Names,
        tracing: Tracing | None = None,
    ) -> None:
        self._topics = topics
        # The provider calls' spans, while tracing (service/tracing.py): off, one check per effect.
        self._tracing = tracing if tracing is not None and tracing.enabled else None
        self._lease = lease  # how long a claim holds its effects (<PREFIX>EFFECT_LEASE)
        self._names = names  # the settings' class: the variable an unconfigured provider is told by
        self._engine = engine
        self._kinds = kinds
        self._policy = policy
        self._metrics = metrics
        self._rng = rng
        self._owner = f"effects-{uuid.uuid4().hex[:12]}"
        # An unset provider URL disables its calls: those effects stay pending (visible in `effects list`).
        self._enabled = kinds.enabled()
        self._waits = kinds.dependencies()
        self._concurrency = concurrency
        self._limits = {kind: asyncio.Semaphore(self._concurrency) for kind in self._enabled}
        # Each kind's provider's breaker, shared with everything else in the process that calls that provider.
        self._guards = {kind: breakers[kinds[kind].spec.downstream] for kind in self._enabled} if breakers else {}
        # Per kind, how long its recent calls took (a moving average): what a lane claims at once follows it.
        self._pace: dict[str, float] = {}
        # The longest one call may take (a look-up and the call, each within the HTTP timeout), and how many rounds
        # of such calls fit in a lease with room left to write their outcomes: never claim more than can be called.
        self._call_budget = budget  # `call_budget`
        seconds = lease.total_seconds()
        # Kept at the lease's end for writing the outcomes: a call's budget, or half of what a short lease leaves
        # once one call fits (the settings only promise a lease longer than one call).
        self._record_margin = min(self._call_budget, (seconds - self._call_budget) / 2)
        self._rounds_in_lease = max(1, int((seconds - self._record_margin) // self._call_budget))

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, each enabled kind in lanes of its own; a database outage is waited out."""
        log.info("effects_started", owner=self._owner, kinds=self._enabled, concurrency=self._concurrency)
        for spec in self._kinds.disabled():
            variable = self._names.variable(spec.provider_setting)
            log.warning("provider_not_configured", kinds=spec.name, variable=variable, effects="stay pending")
        if not self._enabled:
            await stop.wait()
            return
        # New effects wake the lanes of their kind that found none (one notification per kind and inserting
        # transaction), and so do the outcomes that resolve what pending effects wait for (`record_outcomes`); the
        # poll is for effects that become due otherwise (a retry's time) and for a notification that never came.
        async with wakeups.Wakeups(self._engine, wakeups.EFFECTS) as woken, asyncio.TaskGroup() as lanes:
            for kind in self._enabled:
                spacing = Spacing()  # the kind's lanes take turns to claim
                for _ in range(_LANES_PER_KIND):
                    lanes.create_task(self._lane(kind, stop, woken.waiter(kind), spacing))

    async def _lane(self, kind: str, stop: asyncio.Event, waiter: wakeups.Waiter, spacing: Spacing) -> None:
        """Claim, call and record effects of one kind until `stop` is set."""
        failures = 0  # claims in a row that found the database away
        guard = self._guards.get(kind)
        while not stop.is_set():
            if guard is not None and (closed_in := guard.wait()) > 0:
                # Its provider's breaker is open or its probe is out: claim nothing (the effects stay pending and
                # spend nothing) until it moves or its probe may go.
                await wait_unless_stopped(stop, guard.moving, closed_in)
                continue
            await spacing.turn(stop)
            if stop.is_set():
                break
            try:
                done = await self.work_once(kind, spacing)
                failures = 0
            except InfrastructureUnavailable:
                failures += 1
                delay = outage_wait(failures)
                log.warning("database_unavailable", retry_in_seconds=delay)
                await sleep_unless_stopped(stop, delay)
                continue
            except ConcurrentWrite:
                continue  # a deadlock rolled the claim back, or the outcomes after their last try
            if done == 0:
                await waiter.wait(stop, _IDLE_POLL_SECONDS)

    async def work_once(self, kind: str, spacing: Spacing | None = None) -> int:
        """Claim one batch of one kind, execute it, record the outcomes; return how many effects were attempted.
        A full claim tells the kind's `spacing`, so that the other lane claims the next batch during these calls."""
        pace = self._pace.get(kind)
        guard = self._guards.get(kind)
        # A breaker that is not closed lets one call through, its probe: claim that one effect.
        probing = guard is not None and guard.breaker.state is not State.CLOSED
        size = 1 if probing else claim_size(self._concurrency, pace, self._rounds_in_lease)
        # The lease is only as good as the clock, and it started when the claim's transaction did: no call may
        # start unless it can end, and its outcome be written, before the lease ends.
        lease_ends = time.monotonic() + self._lease.total_seconds() - self._record_margin
        async with one_statement(self._engine) as connection:
            claimed = await effects.claim(
                connection,
                self._owner,
                self._lease,
                size,
                kind,
                self._waits,
            )
        if not claimed:
            return 0
        if spacing is not None and len(claimed) == size:
            spacing.full()
        outcomes = await self._execute_all(claimed, lease_ends)
        decisions = [
            # None: not attempted, its lease would have run out mid-call; handed back untouched.
            _HANDED_BACK
            if outcome is None
            else after_call(
                outcome,
                effect.attempts,
                self._policy,
                self._rng,
                quiet=self._kinds.quiet_time(effect.kind, self._lease),
            )
            for effect, outcome in zip(claimed, outcomes, strict=True)
        ]
        settled = list(zip(claimed, decisions, strict=True))
        kept = await self._record(settled, lease_ends)
        self._report(settled, kept)
        return len(claimed)

    async def _record(self, settled: list[Settled], lease_ends: float) -> set[str]:
        """The batch's outcomes in one transaction. The calls were made: their outcomes must not wait for the
        lease to end and a look-up, so a write a deadlock rolled back is redone at once, and one the database
        refused is tried again until the lease would end (then the reconciler takes over, as for a crash)."""
        deadlocks, unavailable = 0, 0
        while True:
            try:
                async with UnitOfWork(self._engine) as uow:
                    kept = await record_outcomes(
                        uow.connection,
                        self._topics,
                        self._kinds,
                        settled,
                        from_state="in_flight",
                        owner=self._owner,
                    )
                    await uow.commit()
                return kept
            except ConcurrentWrite:
                deadlocks += 1
                if deadlocks == _RECORD_TRIES:
                    raise
                log.info("effect_outcomes_redone", attempt=deadlocks, effects=len(settled))
            except InfrastructureUnavailable:
                unavailable += 1
                delay = backoff.exponential(_RECORD_FIRST_WAIT_SECONDS, unavailable, _RECORD_LONGEST_WAIT_SECONDS)
                if time.monotonic() + delay > lease_ends + self._record_margin:
                    raise
                log.warning("effect_outcomes_waiting", reason="database_unavailable", retry_in_seconds=delay)
                await asyncio.sleep(delay)

    async def _execute_all(self, claimed: list[EffectRow], lease_ends: float) -> list[CallOutcome | None]:
        """Every claimed effect's outcome, in claim order, by at most the concurrency's number of tasks, each taking
        the next effect as it finishes one: a batch is several rounds of calls, and a task per effect would wait
        at the kind's limit for most of them. While tracing, an effect called in a span is replaced in `claimed` by
        itself carrying that span's context, which what its outcome writes (its events) continues."""
        outcomes: list[CallOutcome | None] = [None] * len(claimed)
        upcoming = iter(enumerate(claimed))
        spanned: dict[str, str] | None = {} if self._tracing is not None else None

        async def calls() -> None:
            for index, effect in upcoming:
                outcomes[index] = await self._execute(effect, lease_ends, spanned)

        await asyncio.gather(*(calls() for _ in range(min(self._concurrency, len(claimed)))))
        if spanned:
            for index, effect in enumerate(claimed):
                if effect.idempotency_key in spanned:
                    claimed[index] = replace(effect, trace_context=spanned[effect.idempotency_key])
        return outcomes

    async def _execute(
        self, effect: EffectRow, lease_ends: float, spanned: dict[str, str] | None = None
    ) -> CallOutcome | None:
        """The effect's call, unless its lease could run out before its outcome is written (None: handed back).
        `spanned` (while tracing): where a call made in a span puts that span's context, by idempotency key."""
        async with self._limits[effect.kind]:
            started = time.monotonic()
            if started + self._call_budget > lease_ends:
                return None
            try:
                if spanned is None or self._tracing is None or effect.trace_context is None:
                    return await self._attempt(effect)
                return await self._traced(self._tracing, effect, spanned)
            finally:
                took = time.monotonic() - started
                pace = self._pace.get(effect.kind)
                self._pace[effect.kind] = took if pace is None else pace + (took - pace) * _PACE_WEIGHT

    async def _traced(self, tracing: Tracing, effect: EffectRow, spanned: dict[str, str]) -> CallOutcome:
        """`_attempt` in a span named by the effect's kind, the child of the attempt that wrote the effect, current
        around the provider call (its HTTP requests' CLIENT spans are its children).

        INTERNAL, not CLIENT: the call is a logical operation of one or more HTTP requests (a look-up before a
        repeat, a look-up of the effect it waits for), each its own CLIENT span; the conventions keep CLIENT for the
        one span per outgoing request, and a CLIENT span whose children are CLIENT spans reads as two calls.
        """
        attributes: dict[str, str | int] = {"effect.kind": effect.kind, "effect.attempt": effect.attempts}
        with tracing.continuing(effect.kind, effect.trace_context, attributes) as span:
            outcome = await self._attempt(effect)
            if span is not None:
                code = getattr(outcome, "code", None)
                tracing.outcome(span, _CALL_OUTCOMES[type(outcome)], code.value if code is not None else None)
                spanned[effect.idempotency_key] = header(span)
        return outcome

    async def _attempt(self, effect: EffectRow) -> CallOutcome:
        """The provider exchange, bounded as a whole; whatever goes wrong is an outcome, never an exception."""
        try:
            # The client's timeout applies per phase; this bounds the whole exchange (look-up and send).
            async with asyncio.timeout(self._call_budget):
                return await self._call(effect)
        except TimeoutError:
            return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
        except Exception as error:
            # A kind's call that fails in a way nobody foresaw may have reached its provider; whatever it was,
            # it must not take the outcomes of the batch's other calls with it.
            log.warning("effect_call_failed", effect=effect.idempotency_key, error=type(error).__name__)
            return Unknown(ErrorCode.UNEXPECTED_ERROR)

    async def _call(self, effect: EffectRow) -> CallOutcome:
        kind = self._kinds[effect.kind]
        if not kind.enabled:
            return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if not kind.spec.idempotent and (effect.attempts > 1 or effect.reconcile_count > 0):
            # An earlier attempt may have acted, and this provider cannot tell a repeat: never make it twice.
            found = await kind.look_up(effect)
            if isinstance(found, Found):
                return Sent(found.reference)
            if isinstance(found, LookupFailed):
                return NotSent(
                    found.code, charged=found.charged
                )  # cannot tell whether it happened: ask later, never repeat
        return await kind.call(effect)

    def _report(self, settled: list[Settled], kept: set[str]) -> None:
        """Count the batch's outcomes; one line per effect at debug, and at info what needs a look."""
        counts = Counter(
            (decision.state, decision.code.value if decision.code else None)
            for effect, decision in settled
            if effect.idempotency_key in kept
        )
        for (state, code), count in counts.items():
            self._metrics.effect(state, code, count)
        for effect, decision in settled:
            kept_it = effect.idempotency_key in kept
            said = log.info if not kept_it or decision.state in {"failed", "uncertain"} else log.debug
            said(
                "effect_" + (decision.state if kept_it else "lease_lost"),
                effect=effect.idempotency_key,
                kind=effect.kind,
                attempt=effect.attempts,
                error_code=decision.code.value if decision.code else None,
                retry_in_seconds=decision.retry_in.total_seconds() if decision.retry_in else None,
            )
