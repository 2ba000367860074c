"""A source record as the state machine sees it, and the identities derived from it (contract §5)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from service.policy import traces

_MAX_MESSAGE_ID = 300
# A message id whose header bytes are not text a column can hold (invalid UTF-8, or NUL) is this prefix and the
# bytes in base64; a text id that starts with the prefix is encoded the same way, so an encoded id never equals
# a text id. (Text ids are trimmed, as they always were: ` A` and `A` are one id.)
BYTES_PREFIX = "base64:"  # (7 characters: message_id_of compares a slice, cheaper than startswith)
# A longer key is not taken as text: keys are indexed (parked records, held keys, the outbox), and a b-tree
# entry holds at most about 2,700 bytes. Order ids are at most 200 characters.
_MAX_KEY_TEXT = 512
# What a datetime holds, in milliseconds since the epoch: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z. A
# record's timestamp is producer input, any int64 (Kafka 4 refuses one more than an hour ahead by default; older
# brokers, and topics configured so, take it): outside this range it stands for the nearest instant inside.
EARLIEST_MS, LATEST_MS = -62_135_596_800_000, 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Coordinates(NamedTuple):
    """Where a record was first read: the failure id of anything that goes wrong with it."""

    topic: str
    partition: int
    offset: int

    @property
    def failure_id(self) -> str:
        """`<topic>/<partition>/<offset>`, e.g. `orders/12/884193`."""
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(slots=True)  # not frozen: a frozen dataclass costs four times as much to build, once per record
class SourceRecord:
    """One Kafka record, independent of the client library that fetched it; treat it as immutable.

    Its identities (`message_id`, `key_text`, `trace_id`) are computed once, when it is made.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    # The key as text (the order id); None when missing, not UTF-8, holding NUL (no text column can store it) or
    # longer than 512 bytes.
    key_text: str | None = field(init=False)
    # The producer's `message-id` header, else the coordinates: two records with one id have one effect.
    message_id: str = field(init=False)
    # The W3C trace id from `traceparent`, only when well formed (it ends up in envelopes and logs); a consumer
    # derives one for a record without it (service/policy/traces.py), so that every attempt joins one trace.
    trace_id: str | None = field(init=False)
    # This attempt's span context as `traceparent` text, while tracing (service/tracing.py); None otherwise.
    span: str | None = field(default=None, init=False)
    # The span context of the attempt before this one, when it is not in the record's headers (a parked record's).
    link: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.key_text = text_of(self.key) if self.key is not None and len(self.key) <= _MAX_KEY_TEXT else None
        # Both headers in one pass, the last value of each (as `raw_header`): it runs once per record.
        given = parent = None
        for name, value in self.headers:
            if name == "message-id":
                given = value
            elif name == "traceparent":
                parent = value
        self.message_id = message_id_of(given) or f"{self.topic}/{self.partition}/{self.offset}"
        self.trace_id = traces.trace_id_in(parent) if parent is not None else None

    @property
    def coordinates(self) -> Coordinates:
        """Where this record sits now."""
        return Coordinates(self.topic, self.partition, self.offset)

    def header(self, name: str) -> str | None:
        """The last value of a header as text, or None when absent, not UTF-8 or holding NUL."""
        return text_of(self.raw_header(name))

    def raw_header(self, name: str) -> bytes | None:
        """The last value of a header, as its bytes."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return None

    @property
    def timestamp(self) -> datetime:
        """The broker or producer timestamp."""
        return time_of(self.timestamp_ms)


def time_of(ms: int) -> datetime:
    """A timestamp in milliseconds since the epoch as a datetime, exactly, within what a datetime holds."""
    return _EPOCH + timedelta(milliseconds=min(max(ms, EARLIEST_MS), LATEST_MS))


def message_id_of(raw: bytes | None) -> str | None:
    """The message id a `message-id` header's bytes give; None when they give none (empty, blank, too long).

    Text is kept as it is (trimmed); other bytes become `base64:<bytes>`, so that they are stored, compared and
    shown exactly (contract §8: `messageIdBase64`).
    """
    if raw is None:
        return None
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        text = text.strip()
        if not text or len(text) > _MAX_MESSAGE_ID:
            return None
        if text[:7] != BYTES_PREFIX:
            return text
    elif not raw.strip():
        return None
    # Encoded whole (untrimmed): bound the bytes, so the id (indexed in the inbox and retries) stays short.
    if len(raw) > _MAX_MESSAGE_ID:
        return None
    return BYTES_PREFIX + base64.b64encode(raw).decode("ascii")


def pack_key(key: bytes | None) -> bytes:
    """A Kafka key, null included, as one `bytea` value: 0x00 for no key, 0x01 and its bytes otherwise. Copies
    (tier, parked, reprocess) store their original key so, and publish it byte-exact."""
    return b"\x00" if key is None else b"\x01" + key


def unpack_key(packed: bytes) -> bytes | None:
    """The key `pack_key` stored."""
    return None if packed[:1] != b"\x01" else bytes(packed[1:])


def id_bytes(message_id: str) -> bytes | None:
    """The header bytes behind a `base64:` message id; None for a text id."""
    if not message_id.startswith(BYTES_PREFIX):
        return None
    try:
        return base64.b64decode(message_id[len(BYTES_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None


def text_of(value: bytes | None) -> str | None:
    """The bytes as text a column can hold: UTF-8 without NUL; None otherwise."""
    if value is None:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def trace_id_of(record: SourceRecord, consumer: str) -> str:
    """The record's trace id: its producer's, else the one derived from `consumer` and its message id (computed
    where it is needed, not for every record: an envelope, a failure's log line, a span)."""
    return record.trace_id or traces.derived_trace_id(consumer, record.message_id)
