"""The retry schedule (ORDERS_RETRY_TIERS): RocketMQ's delay table, its N+1 delivery rule, and tier lists.

The simulations deliver a record that always fails the way the consumer does: the first delivery and its
blocking retries come from the source topic, every later one from a retry tier, and a fake clock advances by
each decision's delay. No I/O and no sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from service.codes import ErrorCode
from service.durations import parse_duration
from service.policy.classify import Action, Decision, Failure, classify
from service.policy.retry import (
    ORDERLY_INTERVAL,
    ROCKETMQ_DELAYS,
    ROCKETMQ_MAX_RETRIES,
    AttemptHistory,
    Budget,
    RetryPolicy,
    build_policy,
)

NOW = datetime(2026, 7, 31, 9, 10, tzinfo=UTC)
BLOCKING = Budget(3, timedelta(seconds=5))
# RocketMQ's delay levels 3..18, written out here so that the test, not the code, pins the table.
LEVELS = ("10s", "30s", "1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "10m", "20m", "30m", "1h", "2h")
TWO_HOURS = timedelta(hours=2)
TRANSIENT = [
    ErrorCode.RATE_LIMITED,
    ErrorCode.DOWNSTREAM_UNAVAILABLE,
    ErrorCode.DOWNSTREAM_TIMEOUT,
    ErrorCode.DOWNSTREAM_UNREACHABLE,
    ErrorCode.PROCESSING_TIMEOUT,
]
MAX_DELIVERIES = 1001  # the configuration allows at most 1000 attempts


@dataclass(frozen=True)
class Delivery:
    """One delivery of the simulated record and what `classify` decided when it failed."""

    attempt: int
    in_tier: bool
    decision: Decision


def policy(
    tiers: str = "rocketmq",
    ordering: str = "unordered",
    *,
    max_attempts: int | None = None,
    max_elapsed: timedelta | None = None,
) -> RetryPolicy:
    """The policy the service builds from these settings, with the default blocking budget."""
    return build_policy(tiers, ordering, max_attempts=max_attempts, max_elapsed=max_elapsed, blocking=BLOCKING)


def always_failing(plan: RetryPolicy, code: ErrorCode = ErrorCode.DOWNSTREAM_UNAVAILABLE) -> list[Delivery]:
    """Deliver a record that fails with `code` every time until `classify` stops retrying it."""
    rng = random.Random(7)
    now = NOW
    history: AttemptHistory | None = None
    in_tier = False
    deliveries: list[Delivery] = []
    for _ in range(MAX_DELIVERIES):
        history = history.failed_again(now) if history else AttemptHistory.first(now)
        decision = classify(Failure(code), history, plan, now, rng, in_tier=in_tier)
        deliveries.append(Delivery(history.attempts, in_tier, decision))
        if decision.action is Action.RETRY_LATER:
            history = history.sent_to_tier()
            in_tier = True
        elif decision.action is not Action.RETRY:
            return deliveries
        assert decision.delay is not None
        now += decision.delay
    raise AssertionError(f"still retrying after {MAX_DELIVERIES} deliveries")


def retry_delays(deliveries: list[Delivery]) -> list[timedelta | None]:
    """The wait before each retry, in order."""
    return [delivery.decision.delay for delivery in deliveries[:-1]]


def test_the_rocketmq_preset_has_exactly_rocketmqs_sixteen_delay_levels_as_its_tiers() -> None:
    table = tuple(parse_duration(level) for level in LEVELS)

    assert table == ROCKETMQ_DELAYS
    assert len(table) == ROCKETMQ_MAX_RETRIES
    assert policy("rocketmq").tiers == table


@pytest.mark.parametrize(
    ("retry", "delay"),
    [
        *[pytest.param(number, parse_duration(level), id=f"retry-{number}") for number, level in enumerate(LEVELS, 1)],
        pytest.param(17, TWO_HOURS, id="retry-17"),
        pytest.param(18, TWO_HOURS, id="retry-18"),
        pytest.param(30, TWO_HOURS, id="retry-30"),
    ],
)
def test_rocketmq_retry_number_n_waits_the_nth_level_and_every_retry_after_the_sixteenth_waits_two_hours(
    retry: int, delay: timedelta
) -> None:
    assert policy("rocketmq").tier_delay(retry) == delay


@pytest.mark.parametrize("ordering", ["versioned", "unordered"])
def test_rocketmq_by_default_allows_seventeen_attempts_within_twenty_four_hours(ordering: str) -> None:
    plan = policy("rocketmq", ordering)

    assert plan.total == Budget(ROCKETMQ_MAX_RETRIES + 1, timedelta(hours=24))
    assert plan.horizon == timedelta(hours=24)


@pytest.mark.parametrize("code", TRANSIENT)
def test_a_record_that_always_fails_is_delivered_seventeen_times_then_quarantined_as_exhausted(
    code: ErrorCode,
) -> None:
    deliveries = always_failing(policy("rocketmq"), code)

    assert len(deliveries) == ROCKETMQ_MAX_RETRIES + 1
    assert [delivery.attempt for delivery in deliveries] == list(range(1, 18))
    assert [delivery.in_tier for delivery in deliveries] == [False] + [True] * 16
    assert [delivery.decision.action for delivery in deliveries[:-1]] == [Action.RETRY_LATER] * 16
    assert retry_delays(deliveries) == list(ROCKETMQ_DELAYS)
    assert deliveries[-1].decision == Decision(Action.QUARANTINE, code.exhausted())


@pytest.mark.parametrize("retries", [0, 1, 3, 20])
def test_with_max_attempts_n_plus_one_a_failing_record_is_delivered_exactly_n_plus_one_times(retries: int) -> None:
    deliveries = always_failing(policy("rocketmq", max_attempts=retries + 1))

    table = [parse_duration(level) for level in LEVELS]
    assert len(deliveries) == retries + 1
    assert retry_delays(deliveries) == (table + [TWO_HOURS] * retries)[:retries]
    assert deliveries[-1].decision == Decision(Action.QUARANTINE, ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)


def test_under_strict_key_ordering_every_rocketmq_retry_waits_the_orderly_interval() -> None:
    plan = policy("rocketmq", "key")

    deliveries = always_failing(plan)

    assert plan.tiers == (ORDERLY_INTERVAL,) == (timedelta(seconds=1),)
    assert plan.tier_labels == ("1s",)
    assert len(deliveries) == ROCKETMQ_MAX_RETRIES + 1
    assert retry_delays(deliveries) == [ORDERLY_INTERVAL] * ROCKETMQ_MAX_RETRIES
    assert deliveries[-1].decision.action is Action.QUARANTINE


@pytest.mark.parametrize("ordering", ["key", "versioned", "unordered"])
def test_rocketmq_makes_no_blocking_retries_whatever_the_blocking_budget(ordering: str) -> None:
    plan = policy("rocketmq", ordering)

    deliveries = always_failing(plan)

    assert plan.blocking.max_attempts == 1
    assert Action.RETRY not in {delivery.decision.action for delivery in deliveries}


def test_an_explicit_budget_replaces_the_rocketmq_defaults() -> None:
    plan = policy("rocketmq", max_attempts=5, max_elapsed=timedelta(hours=1))

    assert plan.total == Budget(5, timedelta(hours=1))


def test_the_rocketmq_elapsed_budget_can_end_the_schedule_before_its_attempts() -> None:
    # 10s + 30s + 1m + 2m + ... + 10m = 55m40s; the 13th retry's 20m wait would end past a 1h budget.
    deliveries = always_failing(policy("rocketmq", max_elapsed=timedelta(hours=1)))

    assert retry_delays(deliveries) == [parse_duration(level) for level in LEVELS[:12]]
    assert deliveries[-1].decision == Decision(Action.QUARANTINE, ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)


@pytest.mark.parametrize(
    ("tiers", "delays", "attempts", "elapsed"),
    [
        pytest.param("30s,5m", ("30s", "5m"), 5, timedelta(minutes=15), id="default-tiers-elapsed-at-least-15m"),
        pytest.param("10s", ("10s",), 4, timedelta(minutes=15), id="one-short-tier"),
        pytest.param("5m,10m", ("5m", "10m"), 5, timedelta(minutes=30), id="twice-the-sum"),
        pytest.param("1m,10m,1h", ("1m", "10m", "1h"), 6, timedelta(minutes=142), id="three-tiers"),
    ],
)
def test_a_tier_list_by_default_allows_the_blocking_attempts_plus_one_pass_through_each_tier(
    tiers: str, delays: tuple[str, ...], attempts: int, elapsed: timedelta
) -> None:
    plan = policy(tiers)

    assert plan == RetryPolicy(
        total=Budget(attempts, elapsed),
        blocking=BLOCKING,
        tiers=tuple(parse_duration(delay) for delay in delays),
    )
    assert plan.horizon == elapsed


def test_without_tiers_the_blocking_phase_is_the_whole_budget() -> None:
    assert policy("") == RetryPolicy(total=BLOCKING, blocking=BLOCKING, tiers=())
    generous = policy("", max_attempts=6, max_elapsed=timedelta(minutes=1))
    assert generous.total == generous.blocking == Budget(6, timedelta(minutes=1))


def test_an_explicit_budget_replaces_the_tier_list_defaults() -> None:
    plan = policy("30s,5m", max_attempts=9, max_elapsed=timedelta(hours=2))

    assert plan.total == Budget(9, timedelta(hours=2))


def test_a_failing_record_is_retried_in_place_then_once_through_each_tier_then_quarantined() -> None:
    deliveries = always_failing(policy("30s,5m"), ErrorCode.DOWNSTREAM_TIMEOUT)

    # Three blocking attempts (two retries in place), one pass through each tier, five attempts in all.
    assert [delivery.attempt for delivery in deliveries] == [1, 2, 3, 4, 5]
    assert [delivery.in_tier for delivery in deliveries] == [False, False, False, True, True]
    assert [delivery.decision.action for delivery in deliveries] == [
        Action.RETRY,
        Action.RETRY,
        Action.RETRY_LATER,
        Action.RETRY_LATER,
        Action.QUARANTINE,
    ]
    ceilings = [timedelta(milliseconds=200), timedelta(milliseconds=400)]
    for delivery, ceiling in zip(deliveries[:2], ceilings, strict=True):
        assert delivery.decision.delay is not None
        assert ceiling / 2 <= delivery.decision.delay <= ceiling
    assert retry_delays(deliveries)[2:] == [timedelta(seconds=30), timedelta(minutes=5)]
    assert deliveries[-1].decision == Decision(Action.QUARANTINE, ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED)


def test_past_the_last_tier_the_last_delay_repeats_until_the_attempts_run_out() -> None:
    deliveries = always_failing(policy("30s,5m", max_attempts=8, max_elapsed=timedelta(hours=1)))

    assert len(deliveries) == 8
    assert retry_delays(deliveries)[2:] == [timedelta(seconds=30)] + [timedelta(minutes=5)] * 4


def test_the_elapsed_budget_ends_a_tier_list_schedule_before_its_attempts() -> None:
    # 15m by default: 30s + 5m + 5m have passed, and one more 5m wait would end past the budget.
    deliveries = always_failing(policy("30s,5m", max_attempts=8))

    assert len(deliveries) == 6
    assert retry_delays(deliveries)[2:] == [timedelta(seconds=30), timedelta(minutes=5), timedelta(minutes=5)]
    assert deliveries[-1].decision == Decision(Action.QUARANTINE, ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)


@pytest.mark.parametrize(
    ("tiers", "labels"),
    [
        pytest.param("30s,5m", ("30s", "5m"), id="default"),
        pytest.param("rocketmq", LEVELS, id="rocketmq"),
        pytest.param("90s,1h", ("90s", "1h"), id="written-shortest"),
        pytest.param("30s,30s,5m", ("30s", "5m"), id="repeated-delay-one-topic"),
        pytest.param("", (), id="no-tiers"),
    ],
)
def test_each_distinct_tier_delay_names_one_retry_topic(tiers: str, labels: tuple[str, ...]) -> None:
    assert policy(tiers).tier_labels == labels


@pytest.mark.parametrize(
    ("step", "delay"),
    [(1, timedelta(seconds=30)), (2, timedelta(minutes=5)), (3, timedelta(minutes=5)), (50, timedelta(minutes=5))],
)
def test_tier_step_n_of_a_tier_list_waits_its_nth_delay_or_the_last(step: int, delay: timedelta) -> None:
    assert policy("30s,5m").tier_delay(step) == delay
