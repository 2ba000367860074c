"""The decision of a round (service/policy/round.py): where each delivery goes, which are written now, and what
each writes. Table-driven over immutable values, against a tiny domain of "things" (no order rules), no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.policy.delivery import FRESH, Delivery, RetryState
from service.policy.handling import DecodeFailure, Rejected
from service.policy.ordering import KeyState, Route
from service.policy.records import SourceRecord
from service.policy.retry import AttemptHistory
from service.policy.round import Facts, Round, RoundPlan, Write, plan_round, ready, survey, to_lock

NOW = datetime(2024, 5, 1, tzinfo=UTC)
TOPIC = "things"


@dataclass(frozen=True)
class Message:
    """A thing's message: `create`, `change` or `refuse` (the rule rejects it)."""

    aggregate_id: str
    action: str = "create"
    sequence: int | None = None
    schema_name: str | None = "thing.v1"


@dataclass(frozen=True)
class Thing:
    aggregate_id: str
    version: int = 1
    sequence: int | None = None


@dataclass(frozen=True)
class Done:
    aggregate: Thing
    effects: tuple[str, ...]
    events: tuple[str, ...]


class Things:
    """The rules of things: a change makes the next version, with one effect and one event."""

    def sequence(self, message: Any) -> int | None:
        sequence: int | None = message.sequence
        return sequence

    def apply(self, message: Any, current: Any | None, looked_up: Mapping[str, Any]) -> Done | Rejected:
        if message.action == "refuse" or (current is None and message.action == "change"):
            return Rejected(ErrorCode.INVALID_FIELD)
        version = current.version + 1 if current is not None else 1
        thing = Thing(message.aggregate_id, version, message.sequence)
        return Done(thing, (f"{thing.aggregate_id}/v{version}",), (f"{message.action}d",))


def delivery(
    offset: int,
    message: Any,
    *,
    key: str | None = "T-1",
    message_id: str | None = None,
    parked_id: int | None = None,
    in_tier: bool = False,
    reprocess: bool = False,
    foreign: bool = False,
) -> Delivery:
    headers = (("message-id", (message_id or f"m{offset}").encode()),)
    record = SourceRecord(TOPIC, 0, offset, 0, key.encode() if key else None, b"{}", headers)
    return Delivery(
        record, message, record.coordinates, 0, parked_id, in_tier=in_tier, reprocess=reprocess, foreign=foreign
    )


def facts(
    *,
    seen: dict[str, str] | None = None,
    steps: dict[str, int] | None = None,
    holding: set[str] | None = None,
    parked_ids: set[str] | None = None,
    aggregates: set[str] | None = None,
    keys: dict[str, KeyState] | None = None,
) -> Facts:
    return Facts(seen or {}, steps or {}, holding or set(), parked_ids or set(), aggregates or set(), keys or {})


@dataclass
class Case:
    """Deliveries (with their retry states) and the facts of one round; what the plan must say."""

    deliveries: list[tuple[Delivery, RetryState]]
    expected: list[tuple[Write, Any]]  # per ready delivery, in lane order: what it writes, with which code
    facts: Facts = field(default_factory=facts)
    mode: str = "key"
    current: dict[str, Thing] = field(default_factory=dict)
    last_resort: bool = False
    book: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # plan fields that must hold these values


HEAD_QUARANTINED = delivery(0, Message("T-1", "change"), in_tier=True)
HANDED_OVER = delivery(0, Message("T-1", "change"), parked_id=7)
REPROCESSED = delivery(0, Message("T-1"), reprocess=True)
SPENT_IN_TIER = RetryState(AttemptHistory(5, NOW, NOW, tier_step=1), verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)

CASES = {
    "another consumer name's copy is a duplicate: committed past, nothing written": Case(
        [(delivery(0, Message("T-1"), foreign=True), FRESH)],
        [(Write.DUPLICATE, None)],
        book={"created": (), "effects": (), "finished": (), "reprocessed": ()},
    ),
    "another consumer name's copy of a message this one retries leaves this one's retry row alone": Case(
        [(delivery(0, Message("T-1"), foreign=True), FRESH)],
        [(Write.DUPLICATE, None)],
        facts(steps={"m0": 1}, holding={"m0"}),
        book={"created": (), "finished": (), "orphans": ()},
    ),
    "another consumer name's copy of a message this one quarantined does not reopen it": Case(
        [(delivery(0, Message("T-1"), foreign=True), FRESH)],
        [(Write.DUPLICATE, None)],
        facts(seen={"m0": "quarantined"}),
        book={"created": (), "reprocessed": ()},
    ),
    "a parked record whose key is held again stays parked and gives up its claim": Case(
        [(delivery(0, Message("T-1"), parked_id=5), FRESH)],
        [(Write.HOLD, None)],
        facts(keys={"T-1": KeyState(blocked=True)}),
        book={"unclaimed": (5,), "unparked": ()},
    ),
    "a message the inbox knows is a duplicate and writes nothing": Case(
        [(delivery(0, Message("T-1")), FRESH)],
        [(Write.DUPLICATE, None)],
        facts(seen={"m0": "processed"}),
        book={"finished": (), "created": ()},
    ),
    "a duplicate of a terminal record whose retry row outlived it removes the row": Case(
        [(delivery(0, Message("T-1")), FRESH)],
        [(Write.DUPLICATE, None)],
        facts(seen={"m0": "processed"}, steps={"m0": 1}),
        book={"finished": ("m0",), "orphans": ("m0",)},
    ),
    "the second copy of a message in one round is a duplicate": Case(
        [
            (delivery(0, Message("T-1"), message_id="same"), FRESH),
            (delivery(1, Message("T-1"), message_id="same"), FRESH),
        ],
        [(Write.APPLY, None), (Write.DUPLICATE, None)],
        book={"effects": ("T-1/v1",)},
    ),
    "a new record behind a key held by a retry head is parked": Case(
        [(delivery(0, Message("T-1")), FRESH)],
        [(Write.PARK, None)],
        facts(keys={"T-1": KeyState(retrying_message_id="earlier")}),
    ),
    "the last resort quarantines with the verdict": Case(
        [(delivery(0, Message("T-1")), RetryState(verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED))],
        [(Write.LAST_RESORT, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)],
        last_resort=True,
    ),
    "the last resort quarantines undecodable input with its code": Case(
        [(delivery(0, DecodeFailure(ErrorCode.MALFORMED_PAYLOAD), key=None), FRESH)],
        [(Write.LAST_RESORT, ErrorCode.MALFORMED_PAYLOAD)],
        last_resort=True,
    ),
    "the last resort of a record without a verdict is an unexpected error": Case(
        [(delivery(0, Message("T-1")), FRESH)],
        [(Write.LAST_RESORT, ErrorCode.UNEXPECTED_ERROR)],
        last_resort=True,
    ),
    "a hand-off decided last round goes to its tier and leaves the parked table": Case(
        [(HANDED_OVER, RetryState(next_tier=timedelta(seconds=30), last_code=ErrorCode.DOWNSTREAM_TIMEOUT))],
        [(Write.TO_TIER, ErrorCode.DOWNSTREAM_TIMEOUT)],
        book={"unparked": (7,), "finished": ()},
    ),
    "a spent budget is quarantined with its verdict; a tier head keeps its key held": Case(
        [(HEAD_QUARANTINED, SPENT_IN_TIER)],
        [(Write.QUARANTINE, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)],
        facts(steps={"m0": 1}, holding={"m0"}),
        book={"blocks": (("T-1", f"{TOPIC}/0/0"),), "finished": ("m0",)},
    ),
    "a tier head whose key an operator released meanwhile does not hold it again": Case(
        [(HEAD_QUARANTINED, SPENT_IN_TIER)],
        [(Write.QUARANTINE, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)],
        facts(steps={"m0": 1}),
        book={"blocks": ()},
    ),
    "input that does not decode is quarantined with its code": Case(
        [(delivery(0, DecodeFailure(ErrorCode.SCHEMA_UNSUPPORTED, "thing.v9")), FRESH)],
        [(Write.QUARANTINE, ErrorCode.SCHEMA_UNSUPPORTED)],
    ),
    "under versioned ordering a message not newer than its aggregate is stale": Case(
        [(delivery(0, Message("T-1", "change", sequence=5)), FRESH)],
        [(Write.STALE, None)],
        mode="versioned",
        current={"T-1": Thing("T-1", 3, sequence=5)},
        book={"changed": (), "effects": ()},
    ),
    "a message the rule rejects is rejected with its code": Case(
        [(delivery(0, Message("T-1", "refuse")), FRESH)],
        [(Write.REJECT, ErrorCode.INVALID_FIELD)],
    ),
    "a message the rule applies changes its aggregate": Case(
        [(delivery(0, Message("T-1", "change")), FRESH)],
        [(Write.APPLY, None)],
        current={"T-1": Thing("T-1", 4)},
        book={"changed": (Thing("T-1", 5),), "created": (), "effects": ("T-1/v5",)},
    ),
    "an aggregate created and changed in one round is inserted once, in its final state": Case(
        [(delivery(0, Message("T-1")), FRESH), (delivery(1, Message("T-1", "change")), FRESH)],
        [(Write.APPLY, None), (Write.APPLY, None)],
        book={"created": (Thing("T-1", 2),), "changed": (), "effects": ("T-1/v1", "T-1/v2")},
    ),
    "a reprocessed record applied moves its quarantined inbox row": Case(
        [(REPROCESSED, FRESH)],
        [(Write.APPLY, None)],
        facts(seen={"m0": "quarantined"}),
        book={"reprocessed": (f"{TOPIC}/0/0",)},
    ),
    "a reprocessed record that fails again goes back to its quarantine row": Case(
        [(REPROCESSED, RetryState(verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED))],
        [(Write.REQUARANTINE, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)],
        facts(seen={"m0": "quarantined"}),
        book={"reprocessed": ()},
    ),
    "a reprocessed record already processed is a no-op": Case(
        [(REPROCESSED, FRESH)],
        [(Write.DUPLICATE, None)],
        facts(seen={"m0": "processed"}),
    ),
}


def plan(case: Case) -> RoundPlan:
    round_ = survey(dict(case.deliveries), case.facts, case.mode)
    return plan_round([d for d, _ in case.deliveries], round_, {}, case.current, Things(), last_resort=case.last_resort)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_delivery_writes_what_its_route_state_and_rule_decide(case: Case) -> None:
    planned = plan(case)

    assert [(step.write, step.code) for step in planned.steps] == case.expected
    assert [step.delivery for step in planned.steps] == [d for d, _ in case.deliveries]
    for name, value in case.book.items():
        assert getattr(planned, name) == value, name


def test_an_applied_step_carries_the_version_its_events_are_published_with() -> None:
    planned = plan(CASES["an aggregate created and changed in one round is inserted once, in its final state"])

    assert [step.applied.aggregate.version for step in planned.steps if step.applied] == [1, 2]


def test_reopen_is_a_value_of_the_step_not_a_change_to_the_delivery() -> None:
    moved = plan(CASES["a reprocessed record applied moves its quarantined inbox row"])
    requarantined = plan(CASES["a reprocessed record that fails again goes back to its quarantine row"])

    assert [step.reopen for step in moved.steps + requarantined.steps] == [True, True]


def test_planning_twice_gives_the_same_plan_and_changes_no_input() -> None:
    case = CASES["an aggregate created and changed in one round is inserted once, in its final state"]
    current_before = dict(case.current)

    assert plan(case) == plan(case)
    assert case.current == current_before


@pytest.mark.parametrize(
    ("state", "steps", "expected"),
    [
        (FRESH, {}, False),
        (FRESH, {"m0": 1}, True),  # a first delivery of a record already handed to a tier
        (RetryState(AttemptHistory(2, NOW, NOW, tier_step=1)), {"m0": 1}, False),  # its current step
        (RetryState(AttemptHistory(2, NOW, NOW, tier_step=1)), {"m0": 2}, True),  # an old step's copy
    ],
    ids=["new", "handed over already", "the current tier step", "an old tier step"],
)
def test_a_tier_copy_is_a_duplicate_unless_it_is_the_records_current_step(
    state: RetryState, steps: dict[str, int], expected: bool
) -> None:
    in_tier = state.history is not None
    copy = delivery(0, Message("T-1"), in_tier=in_tier)

    round_ = survey({copy: state}, facts(steps=steps), "key")

    assert (copy in round_.duplicates) is expected


@pytest.mark.parametrize(
    ("mode", "key_state", "parked", "expected"),
    [
        ("key", KeyState(), False, Route.APPLY),
        ("key", KeyState(has_parked=True), False, Route.PARK),
        ("key", KeyState(blocked=True), True, Route.HOLD),
        ("key", KeyState(), True, Route.APPLY),
        ("unordered", KeyState(blocked=True), False, Route.APPLY),
    ],
)
def test_a_delivery_is_routed_by_what_holds_its_key(
    mode: str, key_state: KeyState, parked: bool, expected: Route
) -> None:
    one = delivery(0, Message("T-1"), parked_id=1 if parked else None)

    assert survey({one: FRESH}, facts(keys={"T-1": key_state}), mode).routes[one] is expected


def test_a_failed_delivery_holds_back_its_key_but_not_other_keys_and_a_hand_off_holds_its_key_under_key_order() -> None:
    failed = delivery(0, Message("A"), key="A")
    behind = delivery(1, Message("A", "change"), key="A")
    other = delivery(2, Message("B"), key="B")
    handed = delivery(3, Message("C"), key="C")
    after_hand_off = delivery(4, Message("C", "change"), key="C")
    due = {failed: FRESH, behind: FRESH, other: FRESH, handed: RetryState(next_tier=timedelta(seconds=30))}
    due[after_hand_off] = FRESH
    round_ = survey(due, facts(), "key")

    assert ready(round_, {failed}, hold_behind_tier=True) == [other, handed]
    assert ready(round_, {failed}, hold_behind_tier=False) == [other, handed, after_hand_off]


def test_the_write_locks_existing_aggregates_and_changes_not_a_new_one_nor_a_duplicates() -> None:
    new = delivery(0, Message("N"), key="N")
    existing = delivery(1, Message("E"), key="E")
    change = delivery(2, Message("C", "change"), key="C")
    duplicate = delivery(3, Message("D", "change"), key="D")
    round_ = survey(
        dict.fromkeys([new, existing, change, duplicate], FRESH),
        facts(seen={"m3": "processed"}, aggregates={"E"}),
        "key",
    )

    locked = to_lock([new, existing, change, duplicate], round_, lambda message: message.action == "create")

    assert locked == ["E", "C"]


@pytest.mark.parametrize(
    ("state", "message", "expected_context", "expected_bound"),
    [
        (FRESH, Message("T-1"), True, False),
        (RetryState(verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED), Message("T-1"), False, True),
        (RetryState(next_tier=timedelta(seconds=30)), Message("T-1"), False, False),
        (FRESH, DecodeFailure(ErrorCode.MALFORMED_PAYLOAD), False, True),
    ],
    ids=["fresh", "spent budget", "hand-off", "undecodable"],
)
def test_only_a_delivery_the_rule_may_apply_wants_its_context_and_only_a_quarantine_gets_the_last_resort(
    state: RetryState, message: Any, expected_context: bool, expected_bound: bool
) -> None:
    one = delivery(0, message)
    round_: Round = survey({one: state}, facts(), "key")

    assert (round_.needs_context(one), round_.quarantine_bound(one)) == (expected_context, expected_bound)


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=8
    ),
    mode=st.sampled_from(["key", "versioned", "unordered"]),
)
def test_a_round_the_database_knows_nothing_about_is_routed_as_the_per_delivery_rules_route_it(
    kinds: list[tuple[bool, bool, bool, bool, bool]], mode: str
) -> None:
    # Given deliveries of every kind (with or without a key, a tier copy, a reprocess, a parked record, one that
    # failed to decode); Hypothesis prints the kinds on failure
    due: dict[Delivery, RetryState] = {}
    for offset, (keyed, in_tier, reprocess, parked, failed) in enumerate(kinds):
        message = DecodeFailure(ErrorCode.MALFORMED_PAYLOAD) if failed else Message(f"T-{offset % 3}")
        one = delivery(
            offset,
            message,
            key=f"T-{offset % 3}" if keyed else None,
            parked_id=offset if parked else None,
            in_tier=in_tier,
            reprocess=reprocess,
        )
        history = AttemptHistory(1, NOW, NOW, tier_step=1) if in_tier else None
        due[one] = RetryState(history) if history else FRESH

    # When the round is surveyed with facts that say nothing (the shortcut), and with facts about other keys and
    # messages only (the rule for each delivery)
    quick = survey(due, facts(), mode)
    ruled = survey(due, facts(seen={"other": "processed"}, keys={"other": KeyState(blocked=True)}), mode)

    # Then both route every delivery alike and find the same duplicates
    assert dict(quick.routes) == dict(ruled.routes)
    assert set(quick.duplicates) == set(ruled.duplicates)


_HEAD_STATES = {
    "fresh": FRESH,
    "spent in its blocking phase": RetryState(
        AttemptHistory(2, NOW, NOW), verdict=ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED
    ),
    "spent waiting for its breaker": RetryState(
        AttemptHistory(0, NOW, NOW), breaker="directory", verdict=ErrorCode.DOWNSTREAM_MISCONFIGURED_EXHAUSTED
    ),
    "handed to a tier": RetryState(next_tier=timedelta(seconds=30), last_code=ErrorCode.DOWNSTREAM_TIMEOUT),
}
_FOLLOWER_MESSAGES = {
    "create": Message("K", "create"),
    "change": Message("K", "change"),
    "refuse": Message("K", "refuse"),
}


@settings(max_examples=300, deadline=None, print_blob=True)
@given(
    head=st.sampled_from(sorted(_HEAD_STATES)),
    head_parked=st.booleans(),
    followers=st.lists(st.sampled_from(sorted(_FOLLOWER_MESSAGES)), min_size=1, max_size=4),
    followers_parked=st.booleans(),
    others=st.integers(min_value=0, max_value=3),
    last_resort=st.booleans(),
    mode=st.sampled_from(["key", "versioned", "unordered"]),
)
def test_a_head_quarantined_after_its_retries_parks_every_later_record_of_its_key_in_its_round(
    head: str,
    head_parked: bool,
    followers: list[str],
    followers_parked: bool,
    others: int,
    last_resort: bool,
    mode: str,
) -> None:
    # Given a round holding a head of key K in some retry state (from its blocking phase, its breaker, a tier, or
    # released from the parked table), later records of K behind it, and records of other keys among them
    state = _HEAD_STATES[head]
    single = last_resort  # the last resort writes one delivery alone
    head_delivery = delivery(0, Message("K", "change"), key="K", parked_id=1 if head_parked else None)
    due = {head_delivery: state}
    if not single:
        for n, name in enumerate(followers, start=1):
            parked = n + 1 if followers_parked and head_parked else None
            due[delivery(n, _FOLLOWER_MESSAGES[name], key="K", parked_id=parked)] = FRESH
        for n in range(others):
            due[delivery(100 + n, Message(f"O-{n}"), key=f"O-{n}")] = FRESH
    current = {"K": Thing("K")}

    # When the pure planner decides the round
    round_ = survey(due, facts(aggregates={"K"}), mode)
    planned = plan_round(list(due), round_, {}, current, Things(), last_resort=last_resort)

    # Then a head quarantined after its retries, under key ordering, holds K from this transaction on: no later
    # record of K in the round is applied, rejected or stale; each is parked (or stays parked), and K is blocked
    writes = {step.delivery: step.write for step in planned.steps}
    quarantined = writes[head_delivery] in (Write.QUARANTINE, Write.LAST_RESORT)
    holds = quarantined and state.verdict is not None and mode == "key"
    later = [d for d in due if d is not head_delivery and d.key == "K"]
    if holds:
        assert planned.blocks == (("K", f"{TOPIC}/0/0"),)
        assert all(writes[d] in (Write.PARK, Write.HOLD) for d in later), [writes[d] for d in later]
        assert all((writes[d] is Write.HOLD) == (d.parked_id is not None) for d in later)
        assert {d.parked_id for d in later if d.parked_id is not None} <= set(planned.unclaimed)
    else:
        assert planned.blocks == ()
    # And records of other keys are never held back by it
    assert all(writes[d] is Write.APPLY for d in due if d.key not in (None, "K"))
