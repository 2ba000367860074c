"""Backpressure: a downstream that asks us to slow down, or keeps failing, pauses the partition instead."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.domain.codes import ErrorCode, FailureKind
from service.policy.backpressure import BackpressurePolicy, pause_for, run_after_round
from service.policy.classify import Failure

POLICY = BackpressurePolicy()
TRANSIENT = [code for code in ErrorCode if code.kind is FailureKind.TRANSIENT]
NEVER_PAUSING = [code for code in ErrorCode if code.kind is not FailureKind.TRANSIENT]


def test_by_default_five_consecutive_failures_pause_for_two_seconds_and_never_more_than_a_minute() -> None:
    expected = BackpressurePolicy(after_failures=5, pause=timedelta(seconds=2), max_pause=timedelta(minutes=1))

    assert expected == POLICY


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [
        (timedelta(milliseconds=500), timedelta(milliseconds=500)),
        (timedelta(seconds=3), timedelta(seconds=3)),
        (timedelta(minutes=1), timedelta(minutes=1)),
        (timedelta(minutes=2), timedelta(minutes=1)),
        (timedelta(days=365), timedelta(minutes=1)),
    ],
)
@pytest.mark.parametrize("consecutive", [0, 1, 5, 10])
def test_a_rate_limit_with_retry_after_pauses_for_that_long_up_to_the_maximum(
    retry_after: timedelta, expected: timedelta, consecutive: int
) -> None:
    failure = Failure(ErrorCode.RATE_LIMITED, retry_after=retry_after, downstream="customers")

    assert pause_for(failure, consecutive, POLICY) == expected


@pytest.mark.parametrize(
    ("consecutive", "expected"),
    [
        (0, None),
        (1, None),
        (4, None),
        (5, timedelta(seconds=2)),
        (6, timedelta(seconds=4)),
        (7, timedelta(seconds=8)),
        (9, timedelta(seconds=32)),
        (10, timedelta(minutes=1)),
        (100, timedelta(minutes=1)),
        (1_000_000, timedelta(minutes=1)),
    ],
)
@pytest.mark.parametrize("code", TRANSIENT)
def test_a_run_of_transient_failures_pauses_from_the_threshold_on_doubling_up_to_the_maximum(
    code: ErrorCode, consecutive: int, expected: timedelta | None
) -> None:
    assert pause_for(Failure(code, downstream="customers"), consecutive, POLICY) == expected


@pytest.mark.parametrize("code", NEVER_PAUSING)
@pytest.mark.parametrize("consecutive", [0, 5, 100])
def test_a_failure_that_is_not_transient_never_pauses(code: ErrorCode, consecutive: int) -> None:
    assert pause_for(Failure(code, downstream="customers"), consecutive, POLICY) is None


@pytest.mark.parametrize(
    ("consecutive", "expected"),
    [
        (0, None),
        (1, timedelta(milliseconds=100)),
        (2, timedelta(milliseconds=200)),
        (4, timedelta(milliseconds=800)),
        (5, timedelta(seconds=1)),
    ],
)
def test_the_threshold_pause_and_maximum_are_configurable(consecutive: int, expected: timedelta | None) -> None:
    policy = BackpressurePolicy(after_failures=1, pause=timedelta(milliseconds=100), max_pause=timedelta(seconds=1))

    assert pause_for(Failure(ErrorCode.DOWNSTREAM_UNAVAILABLE), consecutive, policy) == expected


def test_a_retry_after_wins_over_the_pause_of_a_long_run_of_failures() -> None:
    failure = Failure(ErrorCode.RATE_LIMITED, retry_after=timedelta(seconds=3))

    assert pause_for(failure, 9, POLICY) == timedelta(seconds=3)


@pytest.mark.parametrize(("consecutive", "expected"), [(4, None), (5, timedelta(seconds=2))])
def test_a_rate_limit_without_retry_after_counts_like_any_transient_failure(
    consecutive: int, expected: timedelta | None
) -> None:
    assert pause_for(Failure(ErrorCode.RATE_LIMITED), consecutive, POLICY) == expected


@pytest.mark.parametrize(
    ("before", "failed_now", "after"),
    [
        (0, 0, 0),  # nothing failed on it: the run is what it was
        (0, 1, 1),
        (0, 3, 3),
        (0, 50, 5),  # one round of many failures opens the breaker at once ...
        (5, 50, 6),  # ... and past the threshold the run grows by one per round, whatever the round's size
        (9, 1, 10),
        (2, 2, 4),
    ],
)
def test_a_round_of_many_failures_reaches_the_threshold_at_once_and_then_counts_once_per_round(
    before: int, failed_now: int, after: int
) -> None:
    assert run_after_round(before, failed_now, POLICY) == after
