"""Record identities (contract §5) and failure envelopes (contract §8): identifiers and codes only, nothing else."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.policy.envelope import event_headers, failure_envelope, iso
from service.policy.records import EARLIEST_MS, LATEST_MS, Coordinates, SourceRecord, time_of
from service.policy.retry import AttemptHistory
from service.policy.traces import derived_trace_id, is_trace_id

TIMESTAMP_MS = 1_785_488_400_123  # 2026-07-31T09:00:00.123Z
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FIRST_FAILED = datetime(2026, 7, 31, 9, 10, tzinfo=UTC)
LAST_FAILED = datetime(2026, 7, 31, 9, 16, 42, tzinfo=UTC)
CARD_NUMBER = "4111111111111111"
EMAIL = "jane.doe@example.com"
SENSITIVE_VALUE = json.dumps(
    {
        "schema": "order.placed.v1",
        "order_id": "A-1001",
        "tenant": "acme",
        "customer_id": "C-7",
        "currency": "EUR",
        "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": -5}],
        "payment": {"card_number": CARD_NUMBER, "card_spaced": "4111 1111 1111 1111", "cvc": "737"},
        "contact": EMAIL,
    }
).encode()


def record(
    *,
    headers: tuple[tuple[str, bytes], ...] = (),
    key: bytes | None = b"A-1001",
    value: bytes | None = b"{}",
    topic: str = "orders",
    partition: int = 12,
    offset: int = 884193,
) -> SourceRecord:
    """A source record at `orders/12/884193` unless told otherwise."""
    return SourceRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=TIMESTAMP_MS,
        key=key,
        value=value,
        headers=headers,
    )


def history(attempts: int = 4) -> AttemptHistory:
    """Four failed attempts between 09:10:00 and 09:16:42, as in the contract's example."""
    return AttemptHistory(attempts=attempts, first_failed_at=FIRST_FAILED, last_failed_at=LAST_FAILED)


def parse_z(text: str) -> datetime:
    """Read back an envelope timestamp, insisting on the `Z` form."""
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text)


def test_the_message_id_is_the_producers_message_id_header() -> None:
    source = record(headers=(("message-id", b"A-1001.2/order.shipped"),))

    assert source.message_id == "A-1001.2/order.shipped"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param((), id="no-header"),
        pytest.param((("message-id", b""),), id="empty"),
        pytest.param((("message-id", b"   "),), id="blank"),
        pytest.param((("message-id", b"m" * 10_000),), id="too-long"),
        pytest.param((("message-id", b"\xff" * 301),), id="too-long-bytes"),
        pytest.param((("Message-Id-Other", b"A-1001.2/order.shipped"),), id="other-header"),
    ],
)
def test_without_a_usable_message_id_header_the_message_id_is_topic_partition_offset(
    headers: tuple[tuple[str, bytes], ...],
) -> None:
    assert record(headers=headers).message_id == "orders/12/884193"


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"A\x00B", b"base64:QQ=="])
def test_a_message_id_header_that_is_not_plain_text_is_its_bytes_in_base64(raw: bytes) -> None:
    assert record(headers=(("message-id", raw),)).message_id == "base64:" + base64.b64encode(raw).decode()


def test_two_records_with_the_same_message_id_header_share_one_message_id_whatever_their_offsets() -> None:
    headers = (("message-id", b"A-1001.2/order.shipped"),)

    assert record(headers=headers, offset=1).message_id == record(headers=headers, offset=2).message_id


def test_the_coordinates_of_a_record_are_its_failure_id() -> None:
    assert record().coordinates.failure_id == "orders/12/884193"


def test_the_trace_id_is_taken_from_a_well_formed_traceparent() -> None:
    source = record(headers=(("traceparent", TRACEPARENT.encode()),))

    assert source.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    "traceparent",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"garbage", id="garbage"),
        pytest.param(EMAIL.encode(), id="email-address"),
        pytest.param(b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", id="short-trace-id"),
        pytest.param(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01", id="short-parent-id"),
        pytest.param(b"00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", id="not-hex"),
        pytest.param(b"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", id="wrong-separator"),
        pytest.param(TRACEPARENT.encode() + b"\nx-injected: 1", id="header-injection"),
        pytest.param(b"\xff" + TRACEPARENT.encode(), id="not-utf8"),
        pytest.param(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", id="all-zero-trace-id"),
        pytest.param(b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", id="forbidden-version-ff"),
    ],
)
def test_a_malformed_traceparent_gives_no_trace_id(traceparent: bytes) -> None:
    assert record(headers=(("traceparent", traceparent),)).trace_id is None


def test_a_record_without_a_traceparent_has_no_trace_id() -> None:
    assert record().trace_id is None


def test_the_envelope_has_exactly_the_contract_keys_with_the_values_of_the_failure() -> None:
    # Given a record that came back through a retry tier, first read at orders/12/884193
    source = record(
        topic="orders.retry.30s",
        partition=0,
        offset=7,
        headers=(("message-id", b"A-1001.2/order.shipped"), ("traceparent", TRACEPARENT.encode())),
    )
    origin = Coordinates("orders", 12, 884193)

    # When its envelope is built
    envelope = failure_envelope(
        source,
        origin,
        consumer="order-service",
        history=history(),
        code=ErrorCode.RATE_LIMITED_EXHAUSTED,
        payload_schema="order.placed.v1",
    )

    # Then it carries the original coordinates and nothing but identifiers and codes
    document = envelope.document
    assert set(document) == {
        "failureId",
        "messageId",
        "source",
        "consumer",
        "attempt",
        "firstFailedAt",
        "lastFailedAt",
        "errorCode",
        "payloadSchema",
        "traceId",
    }
    assert set(document["source"]) == {"topic", "partition", "offset", "timestamp", "key"}
    assert document["failureId"] == "orders/12/884193"
    assert document["messageId"] == "A-1001.2/order.shipped"
    assert document["source"]["topic"] == "orders"
    assert document["source"]["partition"] == 12
    assert document["source"]["offset"] == 884193
    assert document["source"]["key"] == "A-1001"
    assert document["consumer"] == "order-service"
    assert document["attempt"] == 4
    assert document["errorCode"] == "RATE_LIMITED_EXHAUSTED"
    assert document["payloadSchema"] == "order.placed.v1"
    assert document["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert (envelope.failure_id, envelope.message_id, envelope.error_code) == (
        "orders/12/884193",
        "A-1001.2/order.shipped",
        ErrorCode.RATE_LIMITED_EXHAUSTED,
    )


@given(message_id=st.text(min_size=1, max_size=60).filter(str.strip), consumer=st.text(min_size=1, max_size=30))
def test_an_envelope_without_a_producers_trace_names_the_one_derived_from_consumer_and_message_id(
    message_id: str, consumer: str
) -> None:
    # Given a record whose producer sent no traceparent (or a malformed one)
    source = record(headers=(("message-id", message_id.encode()), ("traceparent", b"00-bad")))

    # When it is quarantined
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer=consumer,
        history=history(),
        code=ErrorCode.INVALID_FIELD,
        payload_schema=None,
    )

    # Then its traceId is never null: the one every attempt of the record derives
    assert envelope.document["traceId"] == derived_trace_id(consumer, source.message_id)
    assert is_trace_id(envelope.document["traceId"])


def test_the_envelope_timestamps_are_utc_with_a_z() -> None:
    envelope = failure_envelope(
        record(),
        record().coordinates,
        consumer="order-service",
        history=history(),
        code=ErrorCode.INVALID_FIELD,
        payload_schema=None,
    )

    assert parse_z(envelope.document["firstFailedAt"]) == FIRST_FAILED
    assert parse_z(envelope.document["lastFailedAt"]) == LAST_FAILED
    assert parse_z(envelope.document["source"]["timestamp"]) == datetime(2026, 7, 31, 9, 0, 0, 123000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stamp", "moment"),
    [
        (-(2**63), datetime(1, 1, 1, tzinfo=UTC)),
        (EARLIEST_MS - 1, datetime(1, 1, 1, tzinfo=UTC)),
        (EARLIEST_MS, datetime(1, 1, 1, tzinfo=UTC)),
        (-1, datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)),  # Kafka's "no timestamp"
        (0, datetime(1970, 1, 1, tzinfo=UTC)),
        (1_785_488_400_123, datetime(2026, 7, 31, 9, 0, 0, 123_000, tzinfo=UTC)),
        (LATEST_MS, datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)),
        (LATEST_MS + 1, datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)),
        (2**63 - 1, datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)),
    ],
)
def test_a_record_timestamp_is_its_moment_or_the_nearest_a_datetime_holds(stamp: int, moment: datetime) -> None:
    assert time_of(stamp) == moment


@given(stamp=st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_any_record_timestamp_is_a_moment_in_its_envelope(stamp: int) -> None:
    # Given a record whose timestamp is any int64 (producer input; Hypothesis prints it on failure)
    source = replace(record(), timestamp_ms=stamp)

    # When its envelope is built
    envelope = failure_envelope(
        source, source.coordinates, consumer="c", history=history(), code=ErrorCode.INVALID_FIELD, payload_schema=None
    )

    # Then its time is the timestamp to the millisecond, or the nearest moment a datetime holds
    written = parse_z(envelope.document["source"]["timestamp"])
    assert written == time_of(stamp)
    if EARLIEST_MS <= stamp <= LATEST_MS:
        assert written == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=stamp)
    else:
        assert written in (time_of(EARLIEST_MS), time_of(LATEST_MS))


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param(datetime(2026, 7, 31, 9, 10, tzinfo=UTC), id="utc"),
        pytest.param(datetime(2026, 7, 31, 11, 10, tzinfo=timezone(timedelta(hours=2))), id="east-of-utc"),
        pytest.param(datetime(2026, 7, 31, 4, 10, tzinfo=timezone(timedelta(hours=-5))), id="west-of-utc"),
    ],
)
def test_a_moment_in_any_zone_is_written_in_utc_with_a_z(moment: datetime) -> None:
    written = iso(moment)

    assert written.startswith("2026-07-31T09:10:00")
    assert parse_z(written) == moment


def test_a_record_without_a_key_has_a_null_source_key() -> None:
    source = record(key=None)
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(1),
        code=ErrorCode.MALFORMED_PAYLOAD,
        payload_schema=None,
    )

    assert envelope.document["source"]["key"] is None
    assert "keyBase64" not in envelope.document["source"]
    assert envelope.document["payloadSchema"] is None


@pytest.mark.parametrize("key", [b"\xff\xfe", b"\x00\x00\x00\x00\x00\x0009", b"A-1\x00"])
def test_a_key_that_is_not_text_without_nul_travels_as_base64_and_never_as_source_key(key: bytes) -> None:
    source = record(key=key)
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(1),
        code=ErrorCode.MALFORMED_PAYLOAD,
        payload_schema=None,
    )

    assert "key" not in envelope.document["source"]
    assert base64.b64decode(envelope.document["source"]["keyBase64"]) == key


def test_a_message_id_of_bytes_travels_as_message_id_base64() -> None:
    source = record(headers=(("message-id", b"\xffA\x00"),))
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(1),
        code=ErrorCode.MALFORMED_PAYLOAD,
        payload_schema=None,
    )

    assert "messageId" not in envelope.document
    assert base64.b64decode(envelope.document["messageIdBase64"]) == b"\xffA\x00"
    assert envelope.headers()["message-id"] == source.message_id
    assert "\x00" not in json.dumps(envelope.document)


def test_the_envelope_headers_are_exactly_failure_id_message_id_and_error_code() -> None:
    source = record(headers=(("message-id", b"A-1001.2/order.shipped"),))
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(),
        code=ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED,
        payload_schema="order.shipped.v1",
    )

    assert envelope.headers() == {
        "failure-id": "orders/12/884193",
        "message-id": "A-1001.2/order.shipped",
        "error-code": "DOWNSTREAM_TIMEOUT_EXHAUSTED",
    }


def test_an_envelope_never_contains_the_card_number_or_email_address_of_the_record_value() -> None:
    # Given a record whose value carries a card number and an email address, and a traceparent that is an email
    source = record(value=SENSITIVE_VALUE, headers=(("traceparent", EMAIL.encode()),))

    # When it is quarantined
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(),
        code=ErrorCode.INVALID_FIELD,
        payload_schema="order.placed.v1",
    )

    # Then neither the document nor the headers contain them, in any spelling
    published = json.dumps({"value": envelope.document, "headers": envelope.headers()})
    for secret in (CARD_NUMBER, "4111 1111 1111 1111", EMAIL, "@", "example.com", "card", "contact"):
        assert secret not in published


def test_the_envelope_is_a_plain_json_document() -> None:
    source = record(value=SENSITIVE_VALUE)
    envelope = failure_envelope(
        source,
        source.coordinates,
        consumer="order-service",
        history=history(),
        code=ErrorCode.INVALID_FIELD,
        payload_schema="order.placed.v1",
    )

    assert json.loads(json.dumps(envelope.document)) == envelope.document


def test_event_headers_carry_a_deterministic_event_id_of_message_id_and_event_type() -> None:
    headers = event_headers("A-1001.2/order.shipped", "order.shipped", TRACEPARENT.split("-")[1])

    assert headers == {
        "event-id": "A-1001.2/order.shipped/order.shipped",
        "message-id": "A-1001.2/order.shipped",
        "event-type": "order.shipped",
        "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }
    assert event_headers("A-1001.2/order.shipped", "order.shipped", None)["event-id"] == headers["event-id"]


def test_event_headers_without_a_trace_id_have_no_trace_header() -> None:
    assert "trace-id" not in event_headers("orders/12/884193", "order.rejected", None)


def test_two_event_types_from_one_message_get_different_event_ids() -> None:
    accepted = event_headers("orders/12/884193", "order.accepted", None)["event-id"]
    rejected = event_headers("orders/12/884193", "order.rejected", None)["event-id"]

    assert accepted != rejected
