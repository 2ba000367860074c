"""`classify` (the failure state machine): quarantine, reject, retry now or retry later, as data, without I/O."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from service.codes import ErrorCode, FailureKind
from service.orders.codes import OrderCode
from service.policy.classify import Action, Decision, Failure, classify
from service.policy.retry import AttemptHistory, Budget, RetryPolicy

NOW = datetime(2026, 7, 31, 9, 10, tzinfo=UTC)
# Three blocking attempts within 5 s (the defaults), five in all within 30 s, no retry tiers.
POLICY = RetryPolicy(total=Budget(max_attempts=5, max_elapsed=timedelta(seconds=30)))
# Every attempt of the budget may be a blocking one.
BLOCKING_ONLY = RetryPolicy(total=POLICY.total, blocking=POLICY.total)
GENEROUS = RetryPolicy(total=Budget(1000, timedelta(days=7)), blocking=Budget(1000, timedelta(days=7)))
TIERED = RetryPolicy(
    total=Budget(6, timedelta(minutes=15)),
    blocking=Budget(3, timedelta(seconds=5)),
    tiers=(timedelta(seconds=30), timedelta(minutes=5)),
)

INVALID = [ErrorCode.MALFORMED_PAYLOAD, ErrorCode.SCHEMA_UNSUPPORTED, ErrorCode.INVALID_FIELD]
REJECTED = [
    OrderCode.UNKNOWN_TENANT,
    OrderCode.ORDER_NOT_FOUND,
    OrderCode.ORDER_EXISTS,
    OrderCode.INVALID_TRANSITION,
    OrderCode.UNKNOWN_CUSTOMER,
    OrderCode.CUSTOMER_BLOCKED,
]
TRANSIENT = [
    ErrorCode.RATE_LIMITED,
    ErrorCode.DOWNSTREAM_UNAVAILABLE,
    ErrorCode.DOWNSTREAM_TIMEOUT,
    ErrorCode.DOWNSTREAM_UNREACHABLE,
    ErrorCode.PROCESSING_TIMEOUT,
    ErrorCode.DOWNSTREAM_MISCONFIGURED,
]
RETRYABLE = [code for code in ErrorCode if code.kind in {FailureKind.TRANSIENT, FailureKind.UNKNOWN}]


def history(attempts: int, started: timedelta = timedelta(0), tier_step: int = 0) -> AttemptHistory:
    """A record whose attempt number `attempts` just failed, the first failure `started` ago."""
    return AttemptHistory(attempts=attempts, first_failed_at=NOW - started, last_failed_at=NOW, tier_step=tier_step)


def decide(
    code: ErrorCode,
    attempts: int = 1,
    *,
    started: timedelta = timedelta(0),
    retry_after: timedelta | None = None,
    policy: RetryPolicy = POLICY,
    tier_step: int = 0,
    in_tier: bool = False,
    seed: int = 7,
) -> Decision:
    """Classify one failure with a seeded generator."""
    return classify(
        Failure(code, retry_after),
        history(attempts, started, tier_step),
        policy,
        NOW,
        random.Random(seed),
        in_tier=in_tier,
    )


@pytest.mark.parametrize("code", [*INVALID, ErrorCode.RATE_LIMITED_EXHAUSTED, ErrorCode.UNEXPECTED_ERROR_EXHAUSTED])
@pytest.mark.parametrize("attempts", [1, 3])
@pytest.mark.parametrize("policy", [POLICY, TIERED], ids=["no-tiers", "tiers"])
def test_invalid_input_is_quarantined_at_once_with_its_own_code(
    code: ErrorCode, attempts: int, policy: RetryPolicy
) -> None:
    assert decide(code, attempts, policy=policy) == Decision(Action.QUARANTINE, code, None)


@pytest.mark.parametrize("code", REJECTED)
@pytest.mark.parametrize("in_tier", [False, True])
def test_a_business_rejection_is_rejected_and_never_retried(code: ErrorCode, in_tier: bool) -> None:
    assert decide(code, policy=TIERED, in_tier=in_tier) == Decision(Action.REJECT, code, None)


@pytest.mark.parametrize("code", TRANSIENT)
@pytest.mark.parametrize(
    ("attempts", "ceiling"),
    [
        (1, timedelta(milliseconds=200)),
        (2, timedelta(milliseconds=400)),
        (3, timedelta(milliseconds=800)),
        (4, timedelta(milliseconds=1600)),
    ],
)
def test_a_transient_failure_within_the_blocking_budget_is_retried_after_half_to_all_of_the_doubling_ceiling(
    code: ErrorCode, attempts: int, ceiling: timedelta
) -> None:
    for seed in range(50):
        decision = decide(code, attempts, policy=BLOCKING_ONLY, seed=seed)

        assert decision.action is Action.RETRY
        assert decision.code is code
        assert decision.delay is not None
        assert ceiling / 2 <= decision.delay <= ceiling


@pytest.mark.parametrize("attempts", [6, 7, 10, 20])
def test_the_backoff_ceiling_is_capped_at_five_seconds(attempts: int) -> None:
    for seed in range(50):
        decision = decide(ErrorCode.DOWNSTREAM_UNAVAILABLE, attempts, policy=GENEROUS, seed=seed)

        assert decision.action is Action.RETRY
        assert decision.delay is not None
        assert timedelta(seconds=2.5) <= decision.delay <= timedelta(seconds=5)


@pytest.mark.parametrize("attempts", [33, 34, 49, 50, 64, 999])
def test_the_backoff_stays_capped_however_many_attempts_a_generous_budget_allows(attempts: int) -> None:
    # ORDERS_MAX_ATTEMPTS accepts up to 1000, and with delays of at most 5 s such attempt numbers are reachable.
    decision = decide(ErrorCode.DOWNSTREAM_UNAVAILABLE, attempts, policy=GENEROUS)

    assert decision.action is Action.RETRY
    assert decision.delay is not None
    assert timedelta(seconds=2.5) <= decision.delay <= timedelta(seconds=5)


@pytest.mark.parametrize(
    ("attempts", "retry_after", "expected"),
    [
        pytest.param(1, timedelta(seconds=3), timedelta(seconds=3), id="longer-than-backoff"),
        pytest.param(4, timedelta(seconds=10), timedelta(seconds=10), id="longer-than-the-cap"),
    ],
)
def test_a_retry_after_longer_than_the_backoff_sets_the_delay(
    attempts: int, retry_after: timedelta, expected: timedelta
) -> None:
    decision = decide(ErrorCode.RATE_LIMITED, attempts, retry_after=retry_after, policy=BLOCKING_ONLY)

    assert decision == Decision(Action.RETRY, ErrorCode.RATE_LIMITED, expected)


def test_a_retry_after_shorter_than_the_backoff_does_not_shorten_it() -> None:
    decision = decide(ErrorCode.RATE_LIMITED, 3, retry_after=timedelta(milliseconds=1), policy=BLOCKING_ONLY)

    assert decision.action is Action.RETRY
    assert decision.delay is not None
    assert timedelta(milliseconds=400) <= decision.delay <= timedelta(milliseconds=800)


@pytest.mark.parametrize("code", TRANSIENT)
@pytest.mark.parametrize(
    ("policy", "attempts", "in_tier"),
    [
        pytest.param(BLOCKING_ONLY, 5, False, id="blocking-only-last-attempt"),
        pytest.param(BLOCKING_ONLY, 6, False, id="blocking-only-past-the-budget"),
        pytest.param(TIERED, 6, True, id="tiers-last-attempt"),
        pytest.param(TIERED, 7, True, id="tiers-past-the-budget"),
    ],
)
def test_a_transient_failure_out_of_attempts_is_quarantined_as_exhausted(
    code: ErrorCode, policy: RetryPolicy, attempts: int, in_tier: bool
) -> None:
    decision = decide(code, attempts, policy=policy, tier_step=attempts - 3 if in_tier else 0, in_tier=in_tier)

    assert decision == Decision(Action.QUARANTINE, code.exhausted(), None)


def test_the_last_attempt_within_the_budget_is_still_retried() -> None:
    assert decide(ErrorCode.DOWNSTREAM_TIMEOUT, 4, policy=BLOCKING_ONLY).action is Action.RETRY


@pytest.mark.parametrize(
    ("started", "attempts", "retry_after", "action"),
    [
        pytest.param(timedelta(seconds=29), 1, None, Action.RETRY, id="delay-ends-inside-the-budget"),
        pytest.param(timedelta(seconds=29.9), 2, None, Action.QUARANTINE, id="delay-ends-past-the-budget"),
        pytest.param(timedelta(seconds=31), 1, None, Action.QUARANTINE, id="budget-already-spent"),
        pytest.param(timedelta(0), 1, timedelta(seconds=31), Action.QUARANTINE, id="retry-after-past-the-budget"),
        pytest.param(timedelta(0), 1, timedelta(seconds=29), Action.RETRY, id="retry-after-inside-the-budget"),
    ],
)
def test_a_retry_that_would_end_beyond_the_elapsed_budget_is_quarantined_as_exhausted_now(
    started: timedelta, attempts: int, retry_after: timedelta | None, action: Action
) -> None:
    decision = decide(ErrorCode.RATE_LIMITED, attempts, started=started, retry_after=retry_after, policy=BLOCKING_ONLY)

    assert decision.action is action
    if action is Action.QUARANTINE:
        assert decision == Decision(Action.QUARANTINE, ErrorCode.RATE_LIMITED_EXHAUSTED, None)


@pytest.mark.parametrize("code", TRANSIENT)
@pytest.mark.parametrize(
    ("attempts", "action"),
    [(1, Action.RETRY), (2, Action.RETRY), (3, Action.QUARANTINE), (4, Action.QUARANTINE)],
)
def test_without_tiers_a_transient_failure_is_quarantined_as_exhausted_once_the_blocking_budget_is_spent(
    code: ErrorCode, attempts: int, action: Action
) -> None:
    # The total budget allows five attempts, but with no tier to go to only the three blocking ones happen.
    decision = decide(code, attempts)

    assert decision.action is action
    if action is Action.QUARANTINE:
        assert decision == Decision(Action.QUARANTINE, code.exhausted(), None)


@pytest.mark.parametrize(
    ("started", "retry_after"),
    [
        pytest.param(timedelta(seconds=4.95), None, id="backoff-past-the-blocking-time"),
        pytest.param(timedelta(0), timedelta(seconds=6), id="retry-after-past-the-blocking-time"),
    ],
)
def test_a_blocking_retry_that_would_end_past_the_blocking_time_goes_to_the_first_tier_instead(
    started: timedelta, retry_after: timedelta | None
) -> None:
    decision = decide(ErrorCode.RATE_LIMITED, 1, started=started, retry_after=retry_after, policy=TIERED)

    assert decision == Decision(Action.RETRY_LATER, ErrorCode.RATE_LIMITED, timedelta(seconds=30))


@pytest.mark.parametrize("code", TRANSIENT)
@pytest.mark.parametrize(
    ("attempts", "tier_step", "in_tier", "expected"),
    [
        pytest.param(3, 0, False, timedelta(seconds=30), id="blocking-spent-first-tier"),
        pytest.param(4, 1, True, timedelta(minutes=5), id="from-first-tier-to-second"),
        pytest.param(5, 2, True, timedelta(minutes=5), id="past-the-last-tier-it-repeats"),
    ],
)
def test_a_transient_failure_past_the_blocking_phase_is_sent_to_its_next_tier(
    code: ErrorCode, attempts: int, tier_step: int, in_tier: bool, expected: timedelta
) -> None:
    decision = decide(code, attempts, policy=TIERED, tier_step=tier_step, in_tier=in_tier)

    assert decision == Decision(Action.RETRY_LATER, code, expected)


@pytest.mark.parametrize("code", TRANSIENT)
@pytest.mark.parametrize("attempts", [1, 2])
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(TIERED, Action.RETRY_LATER, id="tiers"),
        pytest.param(BLOCKING_ONLY, Action.QUARANTINE, id="no-tiers"),
    ],
)
def test_a_delivery_from_a_retry_tier_is_never_retried_in_place(
    code: ErrorCode, attempts: int, policy: RetryPolicy, expected: Action
) -> None:
    # A blocking retry there would hold up the tier's partition for the records behind it.
    decision = decide(code, attempts, policy=policy, tier_step=1, in_tier=True)

    assert decision.action is expected


@pytest.mark.parametrize(
    ("started", "tier_step", "action"),
    [
        pytest.param(timedelta(minutes=9), 1, Action.RETRY_LATER, id="tier-wait-ends-inside-the-budget"),
        pytest.param(timedelta(minutes=10, seconds=1), 1, Action.QUARANTINE, id="tier-wait-ends-past-the-budget"),
        pytest.param(timedelta(minutes=14, seconds=31), 0, Action.QUARANTINE, id="even-the-first-tier-overruns"),
    ],
)
def test_a_tier_wait_that_would_end_beyond_the_elapsed_budget_is_quarantined_as_exhausted_now(
    started: timedelta, tier_step: int, action: Action
) -> None:
    # Attempt 3 ends the blocking phase; each later attempt is one delivery from a tier.
    attempts, in_tier = 3 + tier_step, tier_step > 0
    decision = decide(
        ErrorCode.DOWNSTREAM_UNAVAILABLE, attempts, started=started, policy=TIERED, tier_step=tier_step, in_tier=in_tier
    )

    assert decision.action is action
    if action is Action.QUARANTINE:
        assert decision == Decision(Action.QUARANTINE, ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED, None)


@pytest.mark.parametrize(
    ("total", "unknown"),
    [
        (Budget(5, timedelta(seconds=30)), Budget(2, timedelta(seconds=7.5))),
        (Budget(10, timedelta(minutes=4)), Budget(2, timedelta(minutes=1))),
        (Budget(1, timedelta(seconds=40)), Budget(1, timedelta(seconds=10))),
    ],
)
def test_unknown_failures_get_at_most_two_attempts_a_quarter_of_the_elapsed_budget_and_no_tiers(
    total: Budget, unknown: Budget
) -> None:
    policy = RetryPolicy(total=total, tiers=TIERED.tiers)

    # The blocking phase stays inside the configured blocking budget (3 attempts, 5 s by default).
    blocking = Budget(min(2, policy.blocking.max_attempts), min(policy.blocking.max_elapsed, unknown.max_elapsed))
    assert policy.unknown == RetryPolicy(total=unknown, blocking=blocking, tiers=())
    assert policy.for_kind(FailureKind.UNKNOWN) == policy.unknown
    assert policy.for_kind(FailureKind.TRANSIENT) is policy


@pytest.mark.parametrize(
    ("attempts", "started", "unexpected", "transient"),
    [
        pytest.param(1, timedelta(0), Action.RETRY, Action.RETRY, id="first-attempt"),
        pytest.param(2, timedelta(0), Action.QUARANTINE, Action.RETRY, id="second-attempt"),
        pytest.param(1, timedelta(seconds=7.45), Action.QUARANTINE, Action.RETRY, id="past-a-quarter-of-the-time"),
    ],
)
def test_an_unexpected_error_is_retried_on_the_smaller_budget_where_a_transient_one_still_is(
    attempts: int, started: timedelta, unexpected: Action, transient: Action
) -> None:
    assert decide(ErrorCode.UNEXPECTED_ERROR, attempts, started=started, policy=BLOCKING_ONLY).action is unexpected
    assert decide(ErrorCode.DOWNSTREAM_UNAVAILABLE, attempts, started=started, policy=BLOCKING_ONLY).action is transient


@pytest.mark.parametrize("policy", [POLICY, TIERED], ids=["no-tiers", "tiers"])
def test_an_unexpected_error_out_of_budget_is_quarantined_as_unexpected_error_exhausted_never_sent_to_a_tier(
    policy: RetryPolicy,
) -> None:
    assert decide(ErrorCode.UNEXPECTED_ERROR, 2, policy=policy) == Decision(
        Action.QUARANTINE, ErrorCode.UNEXPECTED_ERROR_EXHAUSTED, None
    )


def test_the_same_seed_gives_the_same_decision() -> None:
    first = [decide(ErrorCode.DOWNSTREAM_TIMEOUT, attempts, policy=BLOCKING_ONLY, seed=42) for attempts in range(1, 5)]
    again = [decide(ErrorCode.DOWNSTREAM_TIMEOUT, attempts, policy=BLOCKING_ONLY, seed=42) for attempts in range(1, 5)]

    assert first == again


def test_different_seeds_spread_the_delays_so_retries_do_not_bunch() -> None:
    delays = {decide(ErrorCode.DOWNSTREAM_TIMEOUT, 2, seed=seed).delay for seed in range(20)}

    assert len(delays) > 10


@pytest.mark.parametrize("code", RETRYABLE)
def test_every_retryable_code_has_an_exhausted_code_that_is_terminal(code: ErrorCode) -> None:
    exhausted = code.exhausted()

    assert exhausted.value == f"{code.value}_EXHAUSTED"
    assert exhausted.kind not in {FailureKind.TRANSIENT, FailureKind.UNKNOWN}
    assert decide(exhausted, policy=TIERED) == Decision(Action.QUARANTINE, exhausted, None)


def test_the_retryable_codes_are_the_six_transient_ones_and_unexpected_error() -> None:
    assert set(RETRYABLE) == {*TRANSIENT, ErrorCode.UNEXPECTED_ERROR}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_has_a_kind(code: ErrorCode) -> None:
    assert isinstance(code.kind, FailureKind)


def test_a_history_counts_failed_attempts_and_keeps_when_the_first_one_failed() -> None:
    later = NOW + timedelta(seconds=3)

    first = AttemptHistory.first(NOW)
    second = first.failed_again(later)

    assert first == AttemptHistory(attempts=1, first_failed_at=NOW, last_failed_at=NOW, tier_step=0)
    assert second == AttemptHistory(attempts=2, first_failed_at=NOW, last_failed_at=later, tier_step=0)


def test_a_copy_sent_to_a_tier_counts_one_more_tier_step_and_no_extra_attempt() -> None:
    later = NOW + timedelta(seconds=3)

    sent = AttemptHistory.first(NOW).failed_again(later).sent_to_tier()
    again = sent.failed_again(later).sent_to_tier()

    assert sent == AttemptHistory(attempts=2, first_failed_at=NOW, last_failed_at=later, tier_step=1)
    assert again == AttemptHistory(attempts=3, first_failed_at=NOW, last_failed_at=later, tier_step=2)
