"""A ramped reprocess's schedule and stop decision (service/policy/ramp.py), and the time range every bulk
selection takes (service/durations.py): pure, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.bounds import moment_or_ago
from service.durations import time_range
from service.policy.ramp import SCHEDULE, Batch, Done, Settled, Stop, next_step, plan

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("total", "sizes"),
    [
        (0, []),
        (1, [1]),
        (2, [1, 1]),
        (8, [1, 2, 5]),
        (30, [1, 2, 5, 20, 2]),
        (178, [1, 2, 5, 20, 50, 100]),
        (1000, [1, 2, 5, 20, 50, 100, 822]),
    ],
)
def test_a_selection_is_cut_into_the_schedule_then_the_rest(total: int, sizes: list[int]) -> None:
    assert [batch.size for batch in plan(total)] == sizes


def test_only_the_rest_after_the_whole_schedule_goes_at_the_run_rate_as_the_main_stage() -> None:
    batches = plan(200)
    assert [batch.stage for batch in batches] == ["ramp 1", "ramp 2", "ramp 3", "ramp 4", "ramp 5", "ramp 6", "main"]
    assert [batch.start for batch in batches] == [0, 1, 3, 8, 28, 78, 178]


def test_the_next_batch_starts_only_once_the_one_before_settled_well() -> None:
    batches = plan(30)
    assert next_step(batches, []) == batches[0]
    assert next_step(batches, [[Settled("a", "reprocessed")]]) == batches[1]
    passed = [[Settled("a", "reprocessed")], [Settled("b", "noop"), Settled("c", "skipped")]]
    assert next_step(batches, passed) == batches[2]


def test_a_failure_in_a_batch_stops_the_ramp_naming_the_batch_and_the_record() -> None:
    batches = plan(30)
    settled = [
        [Settled("a", "reprocessed")],
        [Settled("b", "reprocessed"), Settled("c", "reprocessed")],
        [Settled("d", "reprocessed"), Settled("e", "failed_again", "quarantined again (repeat 1)")],
    ]
    assert next_step(batches, settled) == Stop(
        "ramp batch 3 of 5 (5 records): e failed again (quarantined again (repeat 1))"
    )


@pytest.mark.parametrize("outcome", ["unverified", "unexpected_duplicate", "failed_again"])
def test_any_outcome_but_applied_or_skipped_stops_a_ramped_batch(outcome: str) -> None:
    assert isinstance(next_step(plan(5), [[Settled("a", outcome)]]), Stop)


def test_the_run_thresholds_stop_a_batch_with_no_failed_item() -> None:
    step = next_step(plan(5), [[Settled("a", "reprocessed")]], "consumer lag 12 is over the threshold 10")
    assert step == Stop("ramp batch 1 of 3 (1 record): consumer lag 12 is over the threshold 10")


def test_a_failure_in_the_rest_is_judged_by_the_run_thresholds_not_the_ramp() -> None:
    batches = plan(200)
    settled = [[Settled("x", "reprocessed")] * size for size in SCHEDULE] + [[Settled("y", "failed_again")]]
    assert next_step(batches, settled) == Done()


@st.composite
def ramps(draw: st.DrawFn) -> tuple[int, list[bool]]:
    total = draw(st.integers(min_value=0, max_value=400))
    return total, draw(st.lists(st.booleans(), min_size=len(plan(total)), max_size=len(plan(total))))


@given(ramps())
def test_a_ramp_sends_the_selection_in_order_within_the_schedule_and_nothing_after_a_failed_batch(
    case: tuple[int, list[bool]],
) -> None:
    total, fails = case
    batches = plan(total)
    sent: list[Batch] = []
    settled: list[list[Settled]] = []
    while isinstance(step := next_step(batches, settled), Batch):
        sent.append(step)
        failing = fails[len(sent) - 1]
        settled.append(
            [
                Settled(f"r{step.start + k}", "failed_again" if failing and k == 0 else "reprocessed")
                for k in range(step.size)
            ]
        )
    # The batches follow each other through the selection, each within the schedule (the rest only after it)
    assert [batch.start for batch in sent] == [sum(b.size for b in sent[:k]) for k in range(len(sent))]
    assert all(batch.size <= SCHEDULE[k] for k, batch in enumerate(sent) if batch.ramped)
    assert all(batch.size > 0 for batch in sent)
    first_failed = next((k for k, batch in enumerate(sent) if fails[k] and batch.ramped), None)
    if first_failed is None:
        # Nothing failed in the ramp: every record was sent, once
        assert sum(batch.size for batch in sent) == total
        assert isinstance(step, Done)
    else:
        # A failed batch is the last one sent
        assert len(sent) == first_failed + 1
        assert isinstance(step, Stop)
        assert f"batch {first_failed + 1} of" in step.reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - timedelta(hours=2)),
        ("30m", NOW - timedelta(minutes=30)),
        ("2026-12-01T08:00:00Z", datetime(2026, 12, 1, 8, tzinfo=UTC)),
        ("2026-12-01T09:00:00+01:00", datetime(2026, 12, 1, 8, tzinfo=UTC)),
    ],
)
def test_a_point_in_time_is_rfc3339_or_a_duration_ago(text: str, expected: datetime) -> None:
    assert moment_or_ago(text, NOW, zone_required=True) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-12-01T08:00:00", "2h ago", "", "-2h"])
def test_anything_else_is_refused_naming_both_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"RFC 3339|time zone"):
        moment_or_ago(text, NOW, zone_required=True)


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    assert time_range(NOW, NOW) == (NOW, NOW)
    assert time_range(None, NOW) == (None, NOW)
    with pytest.raises(ValueError, match="is before since"):
        time_range(NOW, NOW - timedelta(seconds=1))
