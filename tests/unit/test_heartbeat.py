"""A process's heartbeat document, and how a reader tells live, gone and stopped processes apart: pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from service.policy.heartbeat import (
    BreakerView,
    Counters,
    PartitionView,
    Snapshot,
    facts,
    lag_by_topic,
    oldest_unprocessed_seconds,
    open_breakers,
    rates,
    status,
)


def test_the_first_heartbeat_has_zero_rates_and_the_next_the_counters_per_second() -> None:
    first = Snapshot(at=100.0, counters=Counters(rounds=10, records=1000, published=5, effects=2))
    second = Snapshot(at=105.0, counters=Counters(rounds=20, records=1500, published=15, effects=2))

    assert rates(None, first) == {
        "rounds_per_second": 0.0,
        "records_per_second": 0.0,
        "published_per_second": 0.0,
        "effects_per_second": 0.0,
    }
    assert rates(first, second) == {
        "rounds_per_second": 2.0,
        "records_per_second": 100.0,
        "published_per_second": 2.0,
        "effects_per_second": 0.0,
    }


def test_the_document_lists_partitions_in_order_with_lag_pauses_breakers_and_errors() -> None:
    snapshot = Snapshot(
        at=1.0,
        partitions=(
            PartitionView("t", 1, lag=3, paused="backpressure: its lane is full", oldest_ms=5000),
            PartitionView("t", 0, lag=None),
        ),
        breakers=(BreakerView("customers", "open", "DOWNSTREAM_UNAVAILABLE", False, 12.34),),
        config_errors=("topics missing",),
    )

    document = facts(None, snapshot)

    assert [(p["topic"], p["partition"], p["lag"], p["paused"]) for p in document["partitions"]] == [
        ("t", 0, None, None),
        ("t", 1, 3, "backpressure: its lane is full"),
    ]
    assert document["breakers"] == [
        {
            "downstream": "customers",
            "state": "open",
            "code": "DOWNSTREAM_UNAVAILABLE",
            "misconfigured": False,
            "open_seconds": 12.3,
        }
    ]
    assert document["config_errors"] == ["topics missing"]


@pytest.mark.parametrize(
    ("last_seen", "stopped", "expected"),
    [(100.0, False, "live"), (85.0, False, "live"), (84.9, False, "gone"), (100.0, True, "stopped")],
)
def test_a_process_silent_for_more_than_three_intervals_is_gone(last_seen: float, stopped: bool, expected: str) -> None:
    assert status(last_seen, interval=5.0, stopped=stopped, now=100.0) == expected


def _process(
    status: str, seen: float, partitions: list[dict[str, Any]], breakers: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "process_id": f"h:{seen}",
        "role": "consume",
        "host": "h",
        "status": status,
        "last_seen_epoch": seen,
        "facts": {"partitions": partitions, "breakers": breakers},
    }


def test_lag_per_topic_counts_a_partition_once_by_the_latest_heartbeat_and_ignores_gone_processes() -> None:
    processes = [
        _process(
            "live", 10.0, [{"topic": "a", "partition": 0, "lag": 5}, {"topic": "b", "partition": 0, "lag": 1}], []
        ),
        _process(
            "live", 12.0, [{"topic": "a", "partition": 0, "lag": 2}, {"topic": "a", "partition": 1, "lag": 4}], []
        ),
        _process("gone", 20.0, [{"topic": "a", "partition": 2, "lag": 100}], []),
    ]

    assert lag_by_topic(processes) == {"a": 6, "b": 1}


def test_the_oldest_unprocessed_age_is_that_of_the_oldest_held_record_of_a_live_process() -> None:
    processes = [
        _process("live", 1.0, [{"topic": "a", "partition": 0, "oldest_ms": 90_000}], []),
        _process("live", 1.0, [{"topic": "a", "partition": 1, "oldest_ms": None}], []),
        _process("gone", 1.0, [{"topic": "a", "partition": 2, "oldest_ms": 1_000}], []),
    ]

    assert oldest_unprocessed_seconds(processes, now=100.0) == 10.0
    assert oldest_unprocessed_seconds(processes[1:], now=100.0) is None


def test_open_breakers_name_their_process_and_leave_closed_ones_out() -> None:
    open_one = {"downstream": "customers", "state": "open"}
    processes = [_process("live", 1.0, [], [open_one, {"downstream": "stock", "state": "closed"}])]

    assert open_breakers(processes) == [{"process_id": "h:1.0", "role": "consume", "host": "h", **open_one}]
