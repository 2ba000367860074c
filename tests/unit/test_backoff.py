"""The one backoff rule (service/policy/backoff.py): a first wait, doubled after each failure, up to a longest one."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.policy.backoff import (
    OUTAGE_FIRST_SECONDS,
    OUTAGE_LONGEST_SECONDS,
    equal_jitter,
    exponential,
    outage_wait,
)

seconds = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
attempts = st.integers(min_value=-10, max_value=10**9)
waits = st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=10_000))


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 30.0), (7, 30.0), (10**9, 30.0)],
)
def test_a_process_waits_a_second_then_twice_as_long_after_each_failure_up_to_half_a_minute(
    attempt: int, expected: float
) -> None:
    assert outage_wait(attempt) == expected


def test_the_outage_waits_are_the_documented_ones() -> None:
    assert (OUTAGE_FIRST_SECONDS, OUTAGE_LONGEST_SECONDS) == (1.0, 30.0)


@given(first=seconds, longest=seconds, attempt=attempts)
def test_a_wait_is_never_shorter_than_the_first_nor_longer_than_the_longest(
    first: float, longest: float, attempt: int
) -> None:
    wait = exponential(first, attempt, longest)

    assert min(first, longest) <= wait <= longest


@given(first=seconds, longest=seconds, attempt=attempts)
def test_a_wait_never_shrinks_while_the_failures_go_on(first: float, longest: float, attempt: int) -> None:
    assert exponential(first, attempt, longest) <= exponential(first, attempt + 1, longest)


@given(first=seconds, longest=seconds, attempt=st.integers(min_value=1, max_value=60))
def test_below_the_longest_each_failure_doubles_the_wait(first: float, longest: float, attempt: int) -> None:
    assert exponential(first, attempt, longest) == min(first * 2 ** (attempt - 1), longest)


@given(first=waits, longest=waits, attempt=attempts)
def test_a_timedelta_backs_off_the_same_way_and_never_overflows(
    first: timedelta, longest: timedelta, attempt: int
) -> None:
    wait = exponential(first, attempt, longest)

    assert min(first, longest) <= wait <= longest
    if 1 <= attempt <= 60:
        doubled = first.total_seconds() * 2 ** (attempt - 1)  # a float: the timedelta itself could overflow
        assert wait == (first * 2 ** (attempt - 1) if doubled < longest.total_seconds() else longest)


def test_a_zero_first_wait_stays_zero_however_many_failures() -> None:
    assert exponential(0.0, 10**9, 30.0) == 0.0
    assert exponential(timedelta(0), 10**9, timedelta(seconds=30)) == timedelta(0)


@given(ceiling=waits, seed=st.integers())
def test_an_equal_jitter_wait_lies_between_half_the_ceiling_and_the_ceiling(ceiling: timedelta, seed: int) -> None:
    wait = equal_jitter(ceiling, random.Random(seed))

    assert ceiling / 2 <= wait <= ceiling


def test_equal_jitter_spreads_the_waits_that_failed_together() -> None:
    rng = random.Random(7)

    spread = {equal_jitter(10.0, rng) for _ in range(100)}

    assert len(spread) == 100
    assert min(spread) < 6.0
    assert max(spread) > 9.0
