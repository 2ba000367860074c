"""Ordering (ORDERS_ORDERING): which records of a key wait while an earlier one is unfinished, and stale updates."""

from __future__ import annotations

import pytest

from service.policy.ordering import KeyState, Route, is_stale, route

HEAD = "A-1001.1/order.placed"
LATER = "A-1001.2/order.shipped"

STATES = [
    pytest.param(KeyState(), id="free"),
    pytest.param(KeyState(retrying_message_id=HEAD), id="head-retrying"),
    pytest.param(KeyState(blocked=True), id="blocked"),
    pytest.param(KeyState(has_parked=True), id="parked-records"),
    pytest.param(KeyState(retrying_message_id=HEAD, blocked=True, has_parked=True), id="all-at-once"),
]


@pytest.mark.parametrize(
    ("state", "message_id", "expected"),
    [
        pytest.param(KeyState(), LATER, Route.APPLY, id="free-key"),
        pytest.param(KeyState(retrying_message_id=HEAD), LATER, Route.PARK, id="another-record-is-retrying"),
        pytest.param(KeyState(blocked=True), LATER, Route.PARK, id="head-quarantined"),
        pytest.param(KeyState(has_parked=True), LATER, Route.PARK, id="earlier-records-parked"),
        pytest.param(KeyState(retrying_message_id=HEAD, has_parked=True), LATER, Route.PARK, id="retrying-and-parked"),
        pytest.param(KeyState(retrying_message_id=HEAD), HEAD, Route.APPLY, id="the-retrying-head-itself"),
    ],
)
def test_under_key_ordering_a_new_record_is_parked_behind_an_unfinished_earlier_record_of_its_key(
    state: KeyState, message_id: str, expected: Route
) -> None:
    assert route("key", state, message_id=message_id, from_parked=False) is expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(KeyState(has_parked=True), Route.APPLY, id="key-free-again"),
        pytest.param(KeyState(), Route.APPLY, id="last-parked-record"),
        pytest.param(KeyState(retrying_message_id=HEAD, has_parked=True), Route.HOLD, id="another-record-retrying"),
        pytest.param(KeyState(blocked=True, has_parked=True), Route.HOLD, id="head-quarantined"),
    ],
)
def test_under_key_ordering_a_parked_record_is_held_while_its_key_is_held_and_applied_otherwise(
    state: KeyState, expected: Route
) -> None:
    # Its own parked siblings do not hold it back: parked records are released oldest first.
    assert route("key", state, message_id=LATER, from_parked=True) is expected


@pytest.mark.parametrize("mode", ["versioned", "unordered"])
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("from_parked", [False, True])
def test_versioned_and_unordered_modes_never_park_or_hold_a_record(
    mode: str, state: KeyState, from_parked: bool
) -> None:
    assert route(mode, state, message_id=LATER, from_parked=from_parked) is Route.APPLY


@pytest.mark.parametrize(
    ("mode", "sequence", "applied", "stale"),
    [
        pytest.param("versioned", 1, 2, True, id="older"),
        pytest.param("versioned", 2, 2, True, id="same"),
        pytest.param("versioned", 3, 2, False, id="newer"),
        pytest.param("versioned", None, 2, False, id="record-without-sequence"),
        pytest.param("versioned", 1, None, False, id="order-without-sequence"),
        pytest.param("versioned", None, None, False, id="neither"),
        pytest.param("key", 1, 2, False, id="key-mode"),
        pytest.param("unordered", 1, 2, False, id="unordered-mode"),
        pytest.param("unordered", 2, 2, False, id="unordered-same"),
    ],
)
def test_only_versioned_mode_skips_a_record_whose_sequence_is_not_newer_than_the_applied_one(
    mode: str, sequence: int | None, applied: int | None, stale: bool
) -> None:
    assert is_stale(mode, sequence, applied) is stale


def test_a_key_state_by_default_holds_nothing() -> None:
    assert KeyState() == KeyState(retrying_message_id=None, blocked=False, has_parked=False)
