"""Tier headers: a copy on a retry tier carries its record's original identity and attempt history, and back."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.policy.records import Coordinates, SourceRecord
from service.policy.redelivery import Redelivery, addressed_elsewhere, origin_of, parse, tier_headers
from service.policy.retry import AttemptHistory

TIMESTAMP_MS = 1_785_488_400_123  # 2026-07-31T09:00:00.123Z
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FIRST_FAILED = datetime(2026, 7, 31, 9, 10, 0, 250_000, tzinfo=UTC)
LAST_FAILED = datetime(2026, 7, 31, 9, 10, 1, 125_000, tzinfo=UTC)
DUE = LAST_FAILED + timedelta(seconds=30)
HISTORY = AttemptHistory(attempts=3, first_failed_at=FIRST_FAILED, last_failed_at=LAST_FAILED, tier_step=1)
ORIGIN = Coordinates("orders", 12, 884193)
CONSUMER = "order-service"  # the consumer name that writes the copies
OURS = [
    "message-id",
    "failure-id",
    "origin-timestamp",
    "retry-attempt",
    "retry-step",
    "first-failed-at",
    "last-failed-at",
    "retry-due-at",
    "retry-excused-ms",
    "error-code",
    "consumer",
]


def source(headers: tuple[tuple[str, bytes], ...] = (("traceparent", TRACEPARENT),)) -> SourceRecord:
    """The original record, at `orders/12/884193`."""
    return SourceRecord("orders", 12, 884193, TIMESTAMP_MS, b"A-1001", b'{"schema": "order.shipped.v1"}', headers)


def on_tier(headers: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...], offset: int = 7) -> SourceRecord:
    """A copy as the consumer reads it back from `orders.retry.30s`."""
    return SourceRecord("orders.retry.30s", 0, offset, TIMESTAMP_MS + 1, b"A-1001", b"{}", tuple(headers))


def copy_of(record: SourceRecord, history: AttemptHistory = HISTORY, due_at: datetime = DUE) -> list[tuple[str, bytes]]:
    """The headers of the tier copy of `record`, first read at ORIGIN."""
    return tier_headers(
        record,
        record.message_id,
        ORIGIN,
        TIMESTAMP_MS,
        history,
        due_at,
        ErrorCode.DOWNSTREAM_TIMEOUT,
        consumer=CONSUMER,
    )


def epoch_ms(moment: datetime) -> bytes:
    """A moment as the headers write it."""
    return str(int(moment.timestamp() * 1000)).encode()


def test_a_tier_copy_reads_back_as_its_original_coordinates_history_and_due_time() -> None:
    copy = on_tier(copy_of(source()))

    assert parse(copy) == Redelivery(origin=ORIGIN, origin_timestamp_ms=TIMESTAMP_MS, history=HISTORY, due_at=DUE)


def test_the_tier_headers_name_the_original_coordinates_the_history_and_the_due_time_in_epoch_milliseconds() -> None:
    headers = dict(copy_of(source()))

    assert headers["failure-id"] == b"orders/12/884193"
    assert headers["message-id"] == b"orders/12/884193"
    assert headers["origin-timestamp"] == str(TIMESTAMP_MS).encode()
    assert headers["retry-attempt"] == b"3"
    assert headers["retry-step"] == b"1"
    assert headers["first-failed-at"] == epoch_ms(FIRST_FAILED) == b"1785489000250"
    assert headers["last-failed-at"] == epoch_ms(LAST_FAILED)
    assert headers["retry-due-at"] == epoch_ms(DUE) == b"1785489031125"
    assert headers["retry-excused-ms"] == b"0"
    assert headers["error-code"] == b"DOWNSTREAM_TIMEOUT"
    assert headers["consumer"] == CONSUMER.encode()


def test_the_time_a_history_excuses_travels_with_the_copy() -> None:
    # Given a record that sat through 42.5 s of our own outages between its first failure and its last, a minute later
    excused = replace(HISTORY, last_failed_at=FIRST_FAILED + timedelta(minutes=1), excused=timedelta(seconds=42.5))

    # When its tier copy is read back, Then the excused time comes with it
    copy = on_tier(copy_of(source(), excused))
    assert dict(copy.headers)["retry-excused-ms"] == b"42500"
    assert parse(copy) == Redelivery(ORIGIN, TIMESTAMP_MS, excused, DUE)


def test_a_copy_never_excuses_more_than_the_time_between_its_first_and_last_failure() -> None:
    # Given a copy whose header claims more excused time than has passed between its failures (garbled, or hostile)
    headers = [(name, b"99999999999" if name == "retry-excused-ms" else value) for name, value in copy_of(source())]

    # When it is read, Then its elapsed budget can still end: it excuses at most that time
    redelivered = parse(on_tier(headers))
    assert redelivered is not None
    assert redelivered.history.excused == LAST_FAILED - FIRST_FAILED


def test_a_copy_written_before_the_excused_header_existed_excuses_nothing() -> None:
    headers = [(name, value) for name, value in copy_of(source()) if name != "retry-excused-ms"]

    redelivered = parse(on_tier(headers))

    assert redelivered is not None
    assert redelivered.history == HISTORY


@pytest.mark.parametrize(
    ("headers", "message_id"),
    [
        pytest.param((("traceparent", TRACEPARENT),), "orders/12/884193", id="id-from-original-coordinates"),
        pytest.param(
            (("message-id", b"A-1001.2/order.shipped"), ("traceparent", TRACEPARENT)),
            "A-1001.2/order.shipped",
            id="producer-message-id",
        ),
    ],
)
def test_a_tier_copy_keeps_the_message_id_and_trace_id_of_its_original(
    headers: tuple[tuple[str, bytes], ...], message_id: str
) -> None:
    original = source(headers)

    copy = on_tier(copy_of(original))

    assert copy.message_id == original.message_id == message_id
    assert copy.trace_id == original.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_the_original_headers_are_kept_first_and_in_order() -> None:
    original = source((("traceparent", TRACEPARENT), ("content-type", b"application/json"), ("x-tenant", b"acme")))

    headers = copy_of(original)

    assert headers[:3] == list(original.headers)
    assert [name for name, _ in headers[3:]] == OURS


def test_a_copy_sent_on_to_the_next_tier_carries_each_of_our_headers_once_with_the_new_history() -> None:
    first = on_tier(copy_of(source((("message-id", b"A-1001.2/order.shipped"), ("traceparent", TRACEPARENT)))))
    later = LAST_FAILED + timedelta(seconds=31)
    history = HISTORY.failed_again(later).sent_to_tier()
    due = later + timedelta(minutes=5)

    second = on_tier(copy_of(first, history, due), offset=8)

    counts = Counter(name for name, _ in second.headers)
    assert all(counts[name] == 1 for name in [*OURS, "traceparent"])
    assert parse(second) == Redelivery(ORIGIN, TIMESTAMP_MS, history, due)
    assert second.message_id == "A-1001.2/order.shipped"


def test_headers_a_producer_set_under_our_names_are_replaced_not_duplicated() -> None:
    original = source((("retry-attempt", b"99"), ("failure-id", b"elsewhere/0/0"), ("traceparent", TRACEPARENT)))

    copy = on_tier(copy_of(original))

    assert Counter(name for name, _ in copy.headers)["retry-attempt"] == 1
    assert parse(copy) == Redelivery(ORIGIN, TIMESTAMP_MS, HISTORY, DUE)


@given(stamp=st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_a_tier_copy_reads_back_with_any_original_timestamp(stamp: int) -> None:
    # Given a record whose timestamp is any int64 (producer input; Kafka's "none" is -1; Hypothesis prints it)
    record = replace(source(), timestamp_ms=stamp)

    # When its tier copy is read back
    headers = tier_headers(
        record, record.message_id, ORIGIN, stamp, HISTORY, DUE, ErrorCode.DOWNSTREAM_TIMEOUT, consumer=CONSUMER
    )
    copy = on_tier(headers)

    # Then it is a redelivery of the original, with that timestamp (not a fresh record of the tier topic)
    assert parse(copy) == Redelivery(origin=ORIGIN, origin_timestamp_ms=stamp, history=HISTORY, due_at=DUE)
    assert origin_of(copy) == (ORIGIN, stamp)


@pytest.mark.parametrize("stamp", [b"", b"-", b"--1", b"+1", b"1.5", b"9223372036854775808", b"-9223372036854775809"])
def test_an_origin_timestamp_that_is_not_an_int64_reads_as_no_redelivery(stamp: bytes) -> None:
    headers = [(name, stamp if name == "origin-timestamp" else value) for name, value in copy_of(source())]

    assert parse(on_tier(headers)) is None


def test_a_record_without_tier_headers_is_not_a_redelivery() -> None:
    assert parse(source()) is None


def without(name: str) -> list[tuple[str, bytes]]:
    """A valid copy's headers without one of them."""
    return [(key, value) for key, value in copy_of(source()) if key != name]


def replaced(name: str, value: bytes) -> list[tuple[str, bytes]]:
    """A valid copy's headers with one value garbled."""
    return [(key, value if key == name else old) for key, old in copy_of(source())]


@pytest.mark.parametrize(
    "headers",
    [
        *[
            pytest.param(without(name), id=f"missing-{name}")
            for name in OURS
            if name not in {"message-id", "error-code", "retry-excused-ms", "consumer"}
        ],
        pytest.param(replaced("retry-excused-ms", b"-5"), id="excused-negative"),
        pytest.param(replaced("retry-excused-ms", b"9" * 18), id="excused-overflows"),
        pytest.param(replaced("failure-id", b"orders/12"), id="failure-id-two-parts"),
        pytest.param(replaced("failure-id", b"orders/twelve/884193"), id="failure-id-partition-not-a-number"),
        pytest.param(replaced("failure-id", b"orders/12/"), id="failure-id-no-offset"),
        pytest.param(replaced("failure-id", b"\xff\xfe"), id="failure-id-not-utf8"),
        pytest.param(replaced("retry-attempt", b"three"), id="attempt-not-a-number"),
        pytest.param(replaced("retry-attempt", b""), id="attempt-empty"),
        pytest.param(replaced("retry-step", b"1.5"), id="step-not-an-integer"),
        pytest.param(replaced("origin-timestamp", b"yesterday"), id="origin-timestamp-not-a-number"),
        pytest.param(replaced("first-failed-at", b"2026-07-31T09:10:00Z"), id="first-failed-at-iso-not-epoch"),
        pytest.param(replaced("last-failed-at", b"\xff"), id="last-failed-at-not-utf8"),
        pytest.param(replaced("retry-due-at", b"soon"), id="due-at-not-a-number"),
        pytest.param(replaced("retry-due-at", b"9" * 20), id="due-at-out-of-range"),
        pytest.param(replaced("first-failed-at", b"9" * 40), id="first-failed-at-overflows"),
    ],
)
def test_missing_or_garbled_tier_headers_read_as_no_redelivery(headers: list[tuple[str, bytes]]) -> None:
    assert parse(on_tier(headers)) is None


@pytest.mark.parametrize(
    ("headers", "elsewhere"),
    [
        pytest.param((("consumer", b"billing"),), True, id="another-consumer"),
        pytest.param((("consumer", CONSUMER.encode()),), False, id="this-consumer"),
        pytest.param((), False, id="sent-before-copies-named-their-consumer"),
        pytest.param((("consumer", b"billing"), ("consumer", CONSUMER.encode())), False, id="the-last-header-counts"),
        pytest.param((("consumer", CONSUMER.encode() + b" "),), True, id="compared-byte-exact"),
    ],
)
def test_a_copy_is_another_consumers_only_when_its_consumer_header_names_another_consumer(
    headers: tuple[tuple[str, bytes], ...], elsewhere: bool
) -> None:
    # Given a copy read back from a tier (or the reprocess topic), When it is asked whose it is
    copy = on_tier(headers)

    # Then it is another consumer's exactly when its header names one
    assert addressed_elsewhere(copy, CONSUMER) is elsewhere


def test_a_record_that_came_with_a_consumer_header_of_its_own_is_copied_under_the_copying_consumers() -> None:
    # Given a record whose producer set a header named `consumer`
    record = source((("consumer", b"a producer's value"),))

    # When it is copied to a tier, Then the copy names the consumer that copied it, once
    copy = on_tier(copy_of(record))
    assert [value for name, value in copy.headers if name == "consumer"] == [CONSUMER.encode()]
    assert not addressed_elsewhere(copy, CONSUMER)
