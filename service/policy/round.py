"""The decision of a round: where each due delivery goes, which of them are written now, and what each writes.

Pure: the processor (service/worker/processor.py) reads the facts (one look-up), asks the domain's downstream
for the context its messages need and locks the current aggregates; `survey`, `ready` and `plan_round` decide
over those immutable values; the processor's shell turns the plan into rows (service/worker/writes.py) and the
round's one transaction. A plan holds, per delivery and in lane order, one `Step`, and for the whole round the
aggregates it creates and changes (an aggregate created and changed in one round is inserted once, in its
final state), the effects, and the book-keeping of the parked, retry and key-block tables.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from service.codes import Code, ErrorCode
from service.policy import ordering
from service.policy.delivery import Delivery, RetryState
from service.policy.handling import Aggregate, Applied, Rejected

_FREE_KEY = ordering.KeyState()  # a key with no retry head, block or parked records
_APPLY, _PARK, _HOLD = ordering.Route.APPLY, ordering.Route.PARK, ordering.Route.HOLD


class Outcome(StrEnum):
    """How a delivery left the round; all but HELD let its offset be committed."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    QUARANTINED = "quarantined"
    PARKED = "parked"
    STALE = "stale"
    RETRY_SCHEDULED = "retry_scheduled"
    HELD = "held"


class Write(StrEnum):
    """What the round writes for one delivery."""

    HOLD = "hold"  # a parked record whose key is held again: it stays parked, its claim given up
    DUPLICATE = "duplicate"  # terminal (or handed over, or parked) already: book-keeping only
    PARK = "park"  # a new record behind a held key: into the parked table
    TO_TIER = "to_tier"  # a copy to its next retry tier (via the outbox) and its retry row
    QUARANTINE = "quarantine"  # an envelope, a quarantine row and its inbox row
    REQUARANTINE = "requarantine"  # a reprocessed record that failed again: back to its quarantine row
    LAST_RESORT = "last_resort"  # quarantined with nothing taken from the record but its bytes
    STALE = "stale"  # `versioned` ordering: not newer than its aggregate; a terminal no-op
    REJECT = "reject"  # the rule rejected it: a rejection event and its inbox row
    APPLY = "apply"  # the rule applied it: its aggregate, effects, events and inbox row

    @property
    def outcome(self) -> Outcome:
        """The outcome a delivery written so has."""
        return _OUTCOMES[self]


_OUTCOMES = {
    Write.HOLD: Outcome.HELD,
    Write.DUPLICATE: Outcome.DUPLICATE,
    Write.PARK: Outcome.PARKED,
    Write.TO_TIER: Outcome.RETRY_SCHEDULED,
    Write.QUARANTINE: Outcome.QUARANTINED,
    Write.REQUARANTINE: Outcome.QUARANTINED,
    Write.LAST_RESORT: Outcome.QUARANTINED,
    Write.STALE: Outcome.STALE,
    Write.REJECT: Outcome.REJECTED,
    Write.APPLY: Outcome.PROCESSED,
}


class Step(NamedTuple):
    """One delivery's part of the plan (a named tuple: one is built per record, and cheaply)."""

    delivery: Delivery
    write: Write
    code: Code | None = None  # the rejection or quarantine code; a hand-off's last failure
    applied: Applied | None = None  # APPLY: the rule's result (the new aggregate, its effects and events)
    reopen: bool = False  # a reprocessed record whose inbox row says `quarantined`: that row moves, none is added


@dataclass(frozen=True, slots=True)
class Facts:
    """What the database says about a round's deliveries (one look-up), and the ordering state of their keys."""

    seen: Mapping[str, str]  # message id -> inbox status
    steps: Mapping[str, int]  # message id -> its step in the retry tiers (it has a retry row)
    holding: Collection[str]  # message ids of records in a retry tier that hold their key
    parked_ids: Collection[str]  # message ids parked already
    aggregates: Collection[str]  # the aggregates that exist
    keys: Mapping[str, ordering.KeyState]  # under key ordering: what holds each of the round's keys


@dataclass(frozen=True, slots=True)
class Round:
    """A round before it writes: its due deliveries with their retry states (in lane order), the facts, and
    where each delivery goes (its route, and whether it is a duplicate; decided once per delivery and round)."""

    due: Mapping[Delivery, RetryState]
    facts: Facts
    routes: Mapping[Delivery, ordering.Route]
    duplicates: Collection[Delivery]
    ordering: str  # ORDERS_ORDERING

    def needs_context(self, delivery: Delivery) -> bool:
        """Whether the domain's rule may be applied to it this round, so its outside context is wanted."""
        if self.routes[delivery] is not ordering.Route.APPLY or delivery in self.duplicates or delivery.failed:
            return False
        state = self.due[delivery]
        return state.verdict is None and state.next_tier is None

    def quarantine_bound(self, delivery: Delivery) -> bool:
        """Whether its write is its quarantine (a spent budget or input that does not decode), which the last
        resort takes over when that write fails on its own."""
        state = self.due[delivery]
        if delivery.reprocess or state.next_tier is not None or self.routes[delivery] is not ordering.Route.APPLY:
            return False
        if delivery in self.duplicates:
            return False
        return state.verdict is not None or delivery.failed


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """Everything one round writes, in one transaction, as values."""

    steps: tuple[Step, ...]  # per delivery, in lane order
    created: tuple[Any, ...]  # the domain's new aggregates, each in its final state of the round
    changed: tuple[Any, ...]
    effects: tuple[Any, ...]  # the domain's effects (idempotency_key, kind, payload)
    finished: tuple[str, ...]  # message ids whose retry row goes: terminal now (or a duplicate's orphan)
    orphans: tuple[str, ...]  # of those, the rows a revoked member's late hand-off left behind
    unparked: tuple[int, ...]  # parked rows that leave the parked table
    unclaimed: tuple[int, ...]  # parked rows left parked (their key is held again): their claim is given up
    blocks: tuple[tuple[str, str], ...]  # (key, failure id): a quarantined retry head keeps its key held
    reprocessed: tuple[str, ...]  # failure ids of reprocessed records that reached a terminal state


class Rules(Protocol):
    """The domain's pure part of a round (service/ports.py, `Handler`)."""

    def sequence(self, message: Any) -> int | None:
        """The message's per-aggregate sequence, for `versioned` ordering."""

    def apply(self, message: Any, current: Any | None, looked_up: Mapping[str, Any]) -> Applied | Rejected:
        """The domain's rule: an applied result or a rejection."""


def survey(due: Mapping[Delivery, RetryState], facts: Facts, mode: str) -> Round:
    """Route every due delivery (`mode`: ORDERS_ORDERING) and find the duplicates among them."""
    # The common round asks nothing of the database it does not know: no key is held, nothing was seen. Then every
    # route is APPLY, and only a tier copy (not a reprocess) or another consumer's copy is a duplicate: the rules
    # below, without a call per delivery.
    routes = {delivery: _route(delivery, facts, mode) for delivery in due} if facts.keys else dict.fromkeys(due, _APPLY)
    if facts.seen or facts.steps or facts.parked_ids:
        duplicates = {delivery for delivery, state in due.items() if _is_duplicate(delivery, state, facts)}
    else:
        duplicates = {delivery for delivery in due if (delivery.in_tier and not delivery.reprocess) or delivery.foreign}
    return Round(due, facts, routes, duplicates, mode)


def _route(delivery: Delivery, facts: Facts, mode: str) -> ordering.Route:
    # A tier copy or a reprocessed record is the head of its key: it never waits behind its own key.
    if delivery.key is None or delivery.in_tier or delivery.reprocess:
        return ordering.Route.APPLY
    state = facts.keys.get(delivery.key, _FREE_KEY)
    return ordering.route(mode, state, message_id=delivery.message_id, from_parked=delivery.parked_id is not None)


def _is_duplicate(delivery: Delivery, state: RetryState, facts: Facts) -> bool:
    """Already terminal, or already handed to a retry tier by an earlier copy (a crash between the hand-off commit
    and the offset commit), or an old step of a record that moved on; or another consumer name's copy, which only
    that consumer applies."""
    if delivery.foreign:
        return True
    status = facts.seen.get(delivery.message_id)
    if delivery.reprocess:
        # A quarantined message may become processed once; one already processed stays a no-op.
        return status in ("processed", "rejected")
    if status is not None:
        return True
    if delivery.parked_id is None and delivery.message_id in facts.parked_ids:
        return True  # parked already: delivered again (its offset had not been committed yet)
    step = facts.steps.get(delivery.message_id)
    if step is None:
        return delivery.in_tier  # a tier copy of a record that is terminal already
    return not delivery.in_tier or state.history is None or state.history.tier_step != step


def ready(round_: Round, failed: Collection[Delivery], *, hold_behind_tier: bool) -> list[Delivery]:
    """The deliveries that can be written now: all but a failed one and the deliveries of its key behind it.

    With `hold_behind_tier` (key ordering), the deliveries behind one that is handed to a retry tier in this
    round wait for the next round too, where they find the key held and are parked.
    """
    blocked: set[tuple[str, int, str]] = set()
    found = []
    for delivery, state in round_.due.items():
        if delivery.thread in blocked:
            continue
        if delivery in failed:
            blocked.add(delivery.thread)
            continue
        found.append(delivery)
        if hold_behind_tier and state.next_tier is not None:
            blocked.add(delivery.thread)
    return found


def to_lock(ready: Iterable[Delivery], round_: Round, creates: Callable[[Any], bool]) -> list[str]:
    """The aggregates the write must read and lock. Not a duplicate's, and not a new aggregate the look-up found
    absent: if a concurrent consumer creates it meanwhile, the round's insert fails on its key and the round is
    redone, now with the aggregate locked."""
    exists = round_.facts.aggregates
    return [
        delivery.aggregate_id
        for delivery in ready
        if delivery.aggregate_id is not None
        and round_.routes[delivery] is _APPLY
        and delivery not in round_.duplicates
        and (delivery.aggregate_id in exists or not creates(delivery.decoded))
    ]


def plan_round(
    ready: Sequence[Delivery],
    round_: Round,
    looked_up: Mapping[str, Any],
    current: Mapping[str, Aggregate],
    rules: Rules,
    *,
    last_resort: bool = False,
) -> RoundPlan:
    """Decide, in lane order, what each ready delivery writes (`current`: the locked aggregates; `last_resort`:
    quarantine the one delivery with an envelope of nothing but its identities)."""
    planner = _Planner(round_)
    steps, held = planner.steps, planner.held
    aggregates: dict[str, Any] = dict(current)
    touched: dict[str, None] = {}  # insertion-ordered set of the aggregates the round changes
    effects: list[Any] = []
    seen_now: set[str] = set()
    routes, duplicates, due, mode = round_.routes, round_.duplicates, round_.due, round_.ordering
    seen, stepped = round_.facts.seen, round_.facts.steps
    for delivery in ready:
        route = routes[delivery]
        if route is _HOLD:
            planner.hold(delivery)
            continue
        message_id = delivery.message_id
        if delivery in duplicates or message_id in seen_now:
            planner.duplicate(delivery)
            continue
        seen_now.add(message_id)
        if held and route is _APPLY and delivery.key in held and not (delivery.in_tier or delivery.reprocess):
            # Behind a head this round quarantined: its key is held from this very transaction on.
            route = _HOLD if delivery.parked_id is not None else _PARK
            if route is _HOLD:
                planner.hold(delivery)
                continue
        if route is _PARK:
            steps.append(Step(delivery, Write.PARK))
            continue
        state = due[delivery]
        message = delivery.decoded
        reopen = delivery.reprocess and seen.get(message_id) == "quarantined"
        # Its budget is spent (or its breaker outlasted it): it holds its key. (Invalid input whose quarantine write
        # failed has a verdict too, its own code: never retried, it holds nothing.)
        retried = state.verdict is not None and not delivery.failed
        if last_resort:
            code = state.verdict or (message.code if delivery.failed else None)
            planner.quarantine(delivery, code or ErrorCode.UNEXPECTED_ERROR, reopen, retried, last_resort=True)
        elif state.next_tier is not None:
            planner.to_tier(delivery, state)
        elif state.verdict is not None:
            planner.quarantine(delivery, state.verdict, reopen, retried)
        elif delivery.failed:
            planner.quarantine(delivery, message.code, reopen, retried=False)
        else:
            aggregate_id = delivery.aggregate_id  # the message's (it decoded), read once when the delivery was made
            assert aggregate_id is not None
            before = aggregates.get(aggregate_id)
            if before is not None and ordering.is_stale(mode, rules.sequence(message), before.sequence):
                planner.terminal(Step(delivery, Write.STALE, reopen=reopen))
                continue
            result = rules.apply(message, before, looked_up)
            if isinstance(result, Rejected):
                planner.terminal(Step(delivery, Write.REJECT, result.code, reopen=reopen))
                continue
            aggregates[aggregate_id] = result.aggregate
            touched[aggregate_id] = None
            effects.extend(result.effects)
            step = Step(delivery, Write.APPLY, None, result, reopen)
            if delivery.reprocess or delivery.parked_id is not None or delivery.in_tier or message_id in stepped:
                planner.terminal(step)
            else:
                steps.append(step)  # the common case: nothing to book but the step
    if current:
        created = tuple(aggregates[key] for key in touched if key not in current)
        changed = tuple(aggregates[key] for key in touched if key in current)
    else:  # the common round only creates: every aggregate in `aggregates` was touched, in the same order
        created, changed = tuple(aggregates.values()), ()
    return RoundPlan(
        steps=tuple(planner.steps),
        created=created,
        changed=changed,
        effects=tuple(effects),
        finished=tuple(planner.finished),
        orphans=tuple(planner.orphans),
        unparked=tuple(planner.unparked),
        unclaimed=tuple(planner.unclaimed),
        blocks=tuple(planner.blocks),
        reprocessed=tuple(planner.reprocessed),
    )


class _Planner:
    """The plan of one round while it is made (the lists `plan_round` hands out as tuples)."""

    def __init__(self, round_: Round) -> None:
        self._stepped = round_.facts.steps
        self._seen = round_.facts.seen
        self._holding = round_.facts.holding
        self._key_ordering = round_.ordering == "key"
        self.steps: list[Step] = []
        self.finished: list[str] = []
        self.orphans: list[str] = []
        self.unparked: list[int] = []
        self.unclaimed: list[int] = []
        self.blocks: list[tuple[str, str]] = []
        self.held: set[str] = set()  # keys whose head this round quarantined and which it holds (key ordering)
        self.reprocessed: list[str] = []

    def hold(self, delivery: Delivery) -> None:
        """A parked record whose key is held again: it stays parked, and this member gives up its claim."""
        if delivery.parked_id is not None:
            self.unclaimed.append(delivery.parked_id)
        self.steps.append(Step(delivery, Write.HOLD))

    def duplicate(self, delivery: Delivery) -> None:
        """A duplicate keeps its retry row (a tier copy of an old step must not end the record's current step)
        unless the record is terminal already: then the row is an orphan that a revoked member's late hand-off
        left behind."""
        message_id = delivery.message_id
        orphan = message_id in self._stepped and self._seen.get(message_id) is not None
        if orphan:
            self.orphans.append(message_id)
            self.finished.append(message_id)
        if delivery.parked_id is not None:
            self.unparked.append(delivery.parked_id)
        self.steps.append(Step(delivery, Write.DUPLICATE))

    def terminal(self, step: Step) -> None:
        """A record that reached its terminal state takes its retry row with it in the same transaction."""
        delivery = step.delivery
        if delivery.reprocess:
            self.reprocessed.append(delivery.origin.failure_id)
        self._leave(delivery)
        self.steps.append(step)

    def quarantine(
        self, delivery: Delivery, code: ErrorCode, reopen: bool, retried: bool, *, last_resort: bool = False
    ) -> None:
        """Into quarantine; a reprocessed record that failed again goes back to its quarantine row. Under key
        ordering a head whose retries are spent (`retried`: from its blocking phase, a tier, its breaker or the last
        resort) keeps its key held, and the later records of its key in this round are parked behind it; one
        quarantined from a tier does so unless an operator released the key while it waited (its retry row no
        longer holds the key). Invalid input, never retried, holds nothing."""
        if delivery.reprocess:
            self.steps.append(Step(delivery, Write.REQUARANTINE, code, reopen=reopen))
        else:
            self.steps.append(Step(delivery, Write.LAST_RESORT if last_resort else Write.QUARANTINE, code))
            key = delivery.key
            released = delivery.in_tier and delivery.message_id not in self._holding
            if retried and key is not None and self._key_ordering and not released:
                self.blocks.append((key, delivery.origin.failure_id))
                self.held.add(key)
        self._leave(delivery)

    def to_tier(self, delivery: Delivery, state: RetryState) -> None:
        """Hand over to the next retry tier: its retry row is written (upserted), not finished."""
        if delivery.parked_id is not None:
            self.unparked.append(delivery.parked_id)
        self.steps.append(Step(delivery, Write.TO_TIER, state.last_code))

    def _leave(self, delivery: Delivery) -> None:
        if delivery.parked_id is not None:
            self.unparked.append(delivery.parked_id)
        if delivery.in_tier or delivery.message_id in self._stepped:
            self.finished.append(delivery.message_id)
