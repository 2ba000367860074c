"""The next step after a failed attempt (service/policy/next_step.py): retry in place within the budget, hand
over to a tier, quarantine when the budget is spent or the input is invalid, and wait for the downstream's circuit
breaker, without spending an attempt, when the breaker did not charge the failure. Table-driven, no I/O, no
sleeping."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.policy.classify import Failure
from service.policy.delivery import FRESH, Delivery, RetryState
from service.policy.handling import DecodeFailure
from service.policy.next_step import Budgets, NextStep, Quarantine, RetryInPlace, ToTier, Wait, charged_once, next_step
from service.policy.records import SourceRecord
from service.policy.retry import AttemptHistory, Budget, RetryPolicy

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LOOP_NOW = 1_000.0
POLICY = RetryPolicy(
    total=Budget(5, timedelta(minutes=15)),
    blocking=Budget(3, timedelta(seconds=5)),
    tiers=(timedelta(seconds=30), timedelta(minutes=5)),
)
BUDGETS = Budgets.of(POLICY)
TIMEOUT = Failure(ErrorCode.DOWNSTREAM_TIMEOUT, downstream="directory")


@dataclass(frozen=True)
class _Message:
    aggregate_id: str = "A-1"
    schema_name: str | None = "thing.v1"


def delivery(*, in_tier: bool = False, reprocess: bool = False) -> Delivery:
    record = SourceRecord("things", 0, 7, 0, b"A-1", b"{}")
    return Delivery(record, _Message(), record.coordinates, 0, in_tier=in_tier, reprocess=reprocess)


def failed(attempts: int, first_failed_ago: timedelta = timedelta(0), tier_step: int = 0) -> RetryState:
    """The retry state of a delivery that failed `attempts` times, the first time `first_failed_ago`."""
    return RetryState(AttemptHistory(attempts, NOW - first_failed_ago, NOW, tier_step))


def step(
    state: RetryState = FRESH,
    failure: Failure = TIMEOUT,
    *,
    in_tier: bool = False,
    reprocess: bool = False,
    downtime: float = 0.0,
) -> NextStep:
    return next_step(
        delivery(in_tier=in_tier, reprocess=reprocess),
        state,
        failure,
        budgets=BUDGETS,
        now=NOW,
        loop_now=LOOP_NOW,
        rng=random.Random(7),
        downtime=downtime,
    )


@pytest.mark.parametrize(
    ("state", "attempt", "lowest", "highest"),
    [
        (FRESH, 1, timedelta(milliseconds=100), timedelta(milliseconds=200)),
        (failed(1), 2, timedelta(milliseconds=200), timedelta(milliseconds=400)),
    ],
    ids=["first failure", "second failure"],
)
def test_a_transient_failure_within_the_blocking_budget_is_retried_in_place_after_a_growing_backoff(
    state: RetryState, attempt: int, lowest: timedelta, highest: timedelta
) -> None:
    decided = step(state)

    assert isinstance(decided, RetryInPlace)
    assert lowest <= decided.delay <= highest
    assert decided.state.history is not None
    assert decided.state.history.attempts == attempt
    assert decided.state.due == LOOP_NOW + decided.delay.total_seconds()
    assert (decided.state.last_code, decided.state.breaker, decided.state.verdict) == (
        ErrorCode.DOWNSTREAM_TIMEOUT,
        None,
        None,
    )


def test_the_same_seed_gives_the_same_jitter() -> None:
    assert step() == step()


@pytest.mark.parametrize(
    ("state", "in_tier", "expected_delay", "why"),
    [
        (failed(2), False, timedelta(seconds=30), "the blocking attempts are spent"),
        (failed(1, timedelta(seconds=5)), False, timedelta(seconds=30), "the blocking elapsed budget is spent"),
        (failed(3, timedelta(seconds=40), tier_step=1), True, timedelta(minutes=5), "in a tier: the next tier"),
        (failed(1), True, timedelta(seconds=30), "in a tier: no blocking retries there"),
    ],
)
def test_a_failure_past_the_blocking_phase_is_handed_over_to_the_next_tier(
    state: RetryState, in_tier: bool, expected_delay: timedelta, why: str
) -> None:
    decided = step(state, in_tier=in_tier)

    assert decided == ToTier(
        RetryState(decided.state.history, LOOP_NOW, None, None, expected_delay, ErrorCode.DOWNSTREAM_TIMEOUT),
        expected_delay,
    ), why


@pytest.mark.parametrize(
    ("state", "failure", "in_tier", "reprocess", "expected_code"),
    [
        (failed(4, timedelta(minutes=6), 2), TIMEOUT, True, False, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED),
        (failed(3, timedelta(minutes=14, seconds=45), 1), TIMEOUT, True, False, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED),
        (failed(1), Failure(ErrorCode.UNEXPECTED_ERROR), False, False, ErrorCode.UNEXPECTED_ERROR_EXHAUSTED),
        (failed(2), TIMEOUT, False, True, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED),
        (FRESH, Failure(ErrorCode.MALFORMED_PAYLOAD), False, False, ErrorCode.MALFORMED_PAYLOAD),
        (FRESH, Failure(ErrorCode.INVALID_FIELD), True, False, ErrorCode.INVALID_FIELD),
    ],
    ids=[
        "attempts spent",
        "elapsed budget spent: the next tier would end past it",
        "unknown failures: two attempts, no tiers",
        "reprocessed: the blocking retries only",
        "invalid input: at once",
        "invalid input in a tier: at once",
    ],
)
def test_a_spent_budget_or_invalid_input_is_quarantined_on_the_next_write(
    state: RetryState, failure: Failure, in_tier: bool, reprocess: bool, expected_code: ErrorCode
) -> None:
    decided = step(state, failure, in_tier=in_tier, reprocess=reprocess)

    assert isinstance(decided, Quarantine)
    assert decided.code is expected_code
    assert (decided.state.verdict, decided.state.next_tier, decided.state.last_code) == (
        expected_code,
        None,
        failure.code,
    )
    assert decided.state.due == LOOP_NOW
    attempts = state.history.attempts if state.history else 0
    assert decided.state.history is not None
    assert decided.state.history.attempts == attempts + 1


HELD = Failure(ErrorCode.DOWNSTREAM_UNAVAILABLE, timedelta(seconds=8), "directory", charged=False)


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (HELD, timedelta(seconds=8)),
        (Failure(ErrorCode.RATE_LIMITED, timedelta(seconds=3), "directory", charged=False), timedelta(seconds=3)),
        (Failure(ErrorCode.DOWNSTREAM_MISCONFIGURED, None, "directory", charged=False), timedelta(seconds=1)),
    ],
    ids=["open: until its probe", "rate limited: the time the server asked for", "no time given: a second"],
)
def test_a_failure_the_breaker_did_not_charge_waits_for_it_without_spending_an_attempt(
    failure: Failure, expected: timedelta
) -> None:
    before = failed(2, timedelta(seconds=1))

    decided = step(before, failure)

    assert decided == Wait(
        RetryState(before.history, LOOP_NOW + expected.total_seconds(), "directory", last_code=failure.code), expected
    )


def test_a_record_the_breaker_refused_before_its_first_call_starts_its_elapsed_budget_with_no_attempt_spent() -> None:
    decided = step(FRESH, HELD)

    assert decided == Wait(
        RetryState(AttemptHistory(0, NOW, NOW), LOOP_NOW + 8.0, "directory", last_code=HELD.code),
        timedelta(seconds=8),
    )


def test_a_wait_for_the_breaker_never_outlasts_the_elapsed_budget() -> None:
    decided = step(failed(2, timedelta(minutes=14, seconds=57)), HELD)

    assert isinstance(decided, Wait)
    assert decided.duration == timedelta(seconds=3)


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (HELD, ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED),
        (replace(HELD, code=ErrorCode.DOWNSTREAM_MISCONFIGURED), ErrorCode.DOWNSTREAM_MISCONFIGURED_EXHAUSTED),
        (replace(HELD, code=ErrorCode.RATE_LIMITED), ErrorCode.RATE_LIMITED_EXHAUSTED),
    ],
)
def test_a_record_whose_budget_ends_while_its_breaker_is_open_is_quarantined_with_the_breaker_named(
    failure: Failure, code: ErrorCode
) -> None:
    before = failed(2, timedelta(minutes=15), tier_step=1)

    decided = step(before, failure, in_tier=True)

    # So a downstream that never comes back still ends the record in quarantine, with no attempt spent on it.
    assert decided == Quarantine(
        RetryState(before.history, LOOP_NOW, "directory", verdict=code, last_code=failure.code), code
    )


def test_own_downtime_since_the_last_failure_does_not_count_against_the_elapsed_budget() -> None:
    # Given a record whose first failure was 10.5 min ago, whose next tier (5 min) would end past its 15-min budget
    before = failed(1, timedelta(minutes=10, seconds=30), tier_step=1)
    assert isinstance(step(before, TIMEOUT, in_tier=True), Quarantine)

    # When it fails again after our own database was unreachable for a minute since its last failure
    decided = step(replace(before, downtime_mark=100.0), TIMEOUT, in_tier=True, downtime=160.0)

    # Then that minute is excused: it goes to the next tier, and its history remembers what was excused
    assert isinstance(decided, ToTier)
    assert decided.state.history is not None
    assert (decided.state.history.excused, decided.state.downtime_mark) == (timedelta(minutes=1), 160.0)


def test_a_retry_in_place_keeps_a_hand_off_decided_before_so_the_next_write_makes_it() -> None:
    # A tier hand-off whose write failed unexpectedly is retried in place, still to be handed over.
    before = RetryState(
        AttemptHistory(1, NOW, NOW), next_tier=timedelta(seconds=30), last_code=ErrorCode.DOWNSTREAM_TIMEOUT
    )

    decided = step(before, Failure(ErrorCode.UNEXPECTED_ERROR))

    # The unknown kind's budget is two attempts: this second one is the last, so the record is quarantined.
    assert isinstance(decided, Quarantine)
    assert decided.state.next_tier is None

    retried = step(RetryState(next_tier=timedelta(seconds=30)), Failure(ErrorCode.UNEXPECTED_ERROR))
    assert isinstance(retried, RetryInPlace)
    assert retried.state.next_tier == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("refused_before", "wait"),
    [
        (0, timedelta(seconds=1)),
        (1, timedelta(seconds=2)),
        (3, timedelta(seconds=8)),
        (8, timedelta(seconds=256)),
        (9, timedelta(minutes=5)),
        (10_000, timedelta(minutes=5)),
    ],
    ids=["first refusal", "second", "fourth", "ninth", "tenth", "ten thousand and first"],
)
def test_a_refused_quarantine_write_is_tried_again_after_a_wait_that_doubles_with_each_refusal(
    refused_before: int, wait: timedelta
) -> None:
    # Given a delivery whose budget is spent (its next write is its quarantine), refused `refused_before` times
    spent = RetryState(
        AttemptHistory(5, NOW - timedelta(minutes=6), NOW),
        LOOP_NOW,
        verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED,
        refused=refused_before,
    )

    # When that quarantine write fails again (the database refused it, as it refused its last resort)
    decided = step(spent, Failure(ErrorCode.UNEXPECTED_ERROR))

    # Then it is still bound for quarantine with the same code, and waits 1 s doubled with each refusal, at most
    # 5 min, however long ago its first failure was
    assert decided == Quarantine(
        RetryState(
            AttemptHistory(6, NOW - timedelta(minutes=6), NOW),
            LOOP_NOW + wait.total_seconds(),
            verdict=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED,
            last_code=ErrorCode.UNEXPECTED_ERROR,
            refused=refused_before + 1,
        ),
        ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED,
        wait,
    )


def test_invalid_input_whose_quarantine_write_fails_waits_and_keeps_its_own_code() -> None:
    # Given a record whose bytes do not decode (its first write is its quarantine)
    record = SourceRecord("things", 0, 7, 0, b"A-1", b"{not json")
    invalid = Delivery(record, DecodeFailure(ErrorCode.MALFORMED_PAYLOAD), record.coordinates, 0)

    # When that quarantine write fails
    decided = next_step(
        invalid,
        FRESH,
        Failure(ErrorCode.UNEXPECTED_ERROR),
        budgets=BUDGETS,
        now=NOW,
        loop_now=LOOP_NOW,
        rng=random.Random(7),
    )

    # Then it is tried again in 1 s, still as MALFORMED_PAYLOAD (not as an exhausted budget's UNEXPECTED_ERROR)
    assert isinstance(decided, Quarantine)
    assert (decided.code, decided.delay, decided.state.due) == (
        ErrorCode.MALFORMED_PAYLOAD,
        timedelta(seconds=1),
        LOOP_NOW + 1,
    )


def _record(offset: int) -> Delivery:
    record = SourceRecord("things", 0, offset, 0, f"A-{offset}".encode(), b"{}")
    return Delivery(record, _Message(f"A-{offset}"), record.coordinates, 0)


@given(attempts=st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_one_failed_call_that_many_records_needed_is_charged_to_one_of_them(attempts: list[int]) -> None:
    # Given a look-up many records waited on (the orders of one customer), each with some attempts spent
    waiting = [_record(offset) for offset in range(len(attempts))]
    due = {record: failed(spent) if spent else FRESH for record, spent in zip(waiting, attempts, strict=True)}

    # When the one call fails
    charged = charged_once(TIMEOUT, waiting, due)

    # Then exactly one record pays for it, the first of those with the fewest attempts spent; the others wait uncharged
    payer = waiting[attempts.index(min(attempts))]
    assert [record for record, failure in charged.items() if failure.charged] == [payer]
    assert set(charged) == set(waiting)
    assert all(failure.code is TIMEOUT.code for failure in charged.values())
    assert all(isinstance(step(due[record], charged[record]), Wait) for record in waiting if record is not payer)


@pytest.mark.parametrize(
    "failure",
    [Failure(ErrorCode.UNEXPECTED_ERROR, downstream="directory"), replace(TIMEOUT, charged=False)],
    ids=["a bug's failure is each record's", "a failure the breaker charged to nobody"],
)
def test_a_shared_call_charges_everyone_or_nobody_as_before_when_its_failure_is_not_a_transient_charge(
    failure: Failure,
) -> None:
    waiting = [_record(1), _record(2)]
    assert charged_once(failure, waiting, dict.fromkeys(waiting, FRESH)) == dict.fromkeys(waiting, failure)
