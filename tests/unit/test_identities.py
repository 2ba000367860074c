"""Identities and headers from outside are kept byte-exact and fit the store (issue 13: NUL, binary, copies).

Property-based: Hypothesis prints the falsifying example and its seed (`--hypothesis-seed`) on failure.
"""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from typing import Any

from aiokafka import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from service.adapters.kafka import to_source
from service.codes import ErrorCode
from service.policy.headers import from_json, to_json
from service.policy.records import BYTES_PREFIX, SourceRecord, id_bytes, message_id_of, pack_key, unpack_key
from service.policy.redelivery import tier_headers
from service.policy.retry import AttemptHistory
from service.store.reprocess import _source_key

hostile_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"\x00", b"\xffA", b"\xfeA", struct.pack(">q", 12345), struct.pack(">i", 7), b"base64:/w=="]),
    st.text(max_size=40).map(lambda text: text.encode("utf-8", "surrogatepass")),
)
header_names = st.one_of(st.text(max_size=20), st.sampled_from(["message-id", "traceparent", "a\x00b", ""]))
headers = st.lists(st.tuples(header_names, hostile_bytes), max_size=8).map(tuple)


def with_message_id(raw: bytes) -> SourceRecord:
    """A record whose `message-id` header holds these bytes."""
    return SourceRecord("orders", 0, 7, 0, None, None, (("message-id", raw),))


def normal(raw: bytes) -> str | bytes:
    """What a message id keeps of its header: text trimmed, other bytes whole."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    return raw if "\x00" in text else text.strip()


@given(hostile_bytes, hostile_bytes)
def test_two_message_id_headers_give_one_message_id_only_when_they_say_the_same(first: bytes, second: bytes) -> None:
    one, other = message_id_of(first), message_id_of(second)

    if one is not None and one == other:
        assert normal(first) == normal(second)


def test_message_ids_that_differ_in_invalid_bytes_stay_different() -> None:
    assert with_message_id(b"\xffA").message_id != with_message_id(b"\xfeA").message_id


@given(hostile_bytes)
def test_a_message_id_is_text_a_column_holds_and_reads_back_to_its_header_bytes(raw: bytes) -> None:
    message_id = with_message_id(raw).message_id

    assert "\x00" not in message_id
    message_id.encode("utf-8")  # no lone surrogates
    if message_id.startswith(BYTES_PREFIX):
        assert id_bytes(message_id) == raw


@given(hostile_bytes, headers)
def test_a_tier_copy_is_read_back_as_the_same_message_id(raw: bytes, others: tuple[tuple[str, bytes], ...]) -> None:
    record = SourceRecord("orders", 1, 9, 0, b"K", b"{}", (*others, ("message-id", raw)))
    moment = datetime(2026, 12, 1, tzinfo=UTC)
    history = AttemptHistory(attempts=2, first_failed_at=moment, last_failed_at=moment, tier_step=0)

    copied = tier_headers(
        record, record.message_id, record.coordinates, 0, history, moment, ErrorCode.DOWNSTREAM_TIMEOUT, consumer="c"
    )
    copy = SourceRecord("orders.retry.30s", 0, 1, 0, b"K", b"{}", tuple(copied))

    assert copy.message_id == record.message_id


@given(headers)
def test_headers_are_stored_as_json_without_nul_and_read_back_byte_exact(
    original: tuple[tuple[str, bytes], ...],
) -> None:
    stored = to_json(original)

    assert not [part for entry in stored for part in entry if "\x00" in part], "jsonb cannot hold NUL"
    assert from_json(json.loads(json.dumps(stored))) == original


def test_headers_stored_before_as_text_still_read_back() -> None:
    assert from_json([["traceparent", "00-ab"]]) == (("traceparent", b"00-ab"),)
    assert from_json({"event-id": "A/x"}) == (("event-id", b"A/x"),)


@given(hostile_bytes)
def test_a_key_is_text_only_when_a_column_can_hold_it(key: bytes) -> None:
    record = SourceRecord("orders", 0, 1, 0, key, None)

    if record.key_text is not None:
        assert "\x00" not in record.key_text
        assert record.key_text.encode() == key


def test_a_long_serializer_key_is_not_text() -> None:
    assert SourceRecord("orders", 0, 1, 0, struct.pack(">q", 12345), None).key_text is None


def test_a_long_header_that_trims_short_still_gives_no_long_id() -> None:
    raw = b" " * 10_000 + b"base64:x"

    assert with_message_id(raw).message_id == "orders/0/7"


@given(hostile_bytes.map(lambda raw: b" " * 400 + raw))
def test_no_message_id_is_longer_than_an_index_entry_holds(raw: bytes) -> None:
    assert len(with_message_id(raw).message_id.encode()) <= 1000


@given(st.one_of(st.none(), hostile_bytes))
def test_a_packed_key_comes_back_exactly_null_included(key: bytes | None) -> None:
    assert unpack_key(pack_key(key)) == key


def test_a_reprocess_copy_takes_its_key_from_the_envelope_exactly() -> None:
    assert _source_key({"keyBase64": "AAAAAAAAEJI="}) == struct.pack(">q", 4242)
    assert _source_key({"key": "A-1"}) == b"A-1"
    assert _source_key({"key": None}) is None


@given(
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    timestamp=st.none() | st.integers(-(2**63), 2**63 - 1),
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=40),
    headers=st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=3),
)
def test_an_aiokafka_record_becomes_a_source_record_field_by_field(
    partition: int, offset: int, timestamp: int | None, key: bytes | None, value: bytes | None, headers: list[Any]
) -> None:
    # Given a record as aiokafka hands it out (three integer coordinates that must not trade places; no timestamp
    # in the oldest record format)
    record = ConsumerRecord("orders", partition, offset, timestamp, 0, key, value, None, 0, 0, headers)

    # When it is translated
    source = to_source(record)

    # Then each field lands where it belongs, a missing timestamp is Kafka's "none" (-1), and a header without a
    # value has empty bytes
    assert (source.topic, source.partition, source.offset, source.timestamp_ms) == (
        "orders",
        partition,
        offset,
        -1 if timestamp is None else timestamp,
    )
    assert (source.key, source.value) == (key, value)
    assert source.headers == tuple((name, header or b"") for name, header in headers)
