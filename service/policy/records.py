"""A source record as the state machine sees it, and the identities derived from it (contract §5)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_MAX_MESSAGE_ID = 300


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
    key_text: str | None = field(init=False)  # the key as text (the order id), None when missing or not UTF-8
    # The producer's `message-id` header, else the coordinates: two records with one id have one effect.
    message_id: str = field(init=False)
    # The W3C trace id from `traceparent`, only when well formed (it ends up in envelopes and logs).
    trace_id: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.key_text = _text(self.key)
        given = self.header("message-id") if self.headers else None
        if given and given.strip() and len(given) <= _MAX_MESSAGE_ID:
            self.message_id = given.strip()
        else:
            self.message_id = f"{self.topic}/{self.partition}/{self.offset}"
        self.trace_id = _trace_id(self.header("traceparent")) if self.headers else None

    @property
    def coordinates(self) -> Coordinates:
        """Where this record sits now."""
        return Coordinates(self.topic, self.partition, self.offset)

    def header(self, name: str) -> str | None:
        """The last value of a header as text, or None when absent or not UTF-8."""
        for key, value in reversed(self.headers):
            if key == name:
                return _text(value)
        return None

    @property
    def timestamp(self) -> datetime:
        """The broker or producer timestamp."""
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _trace_id(parent: str | None) -> str | None:
    match = _TRACEPARENT.match(parent.strip().lower()) if parent else None
    # W3C: version ff and an all-zero trace id are invalid.
    if match is None or parent is None or parent.strip().startswith("ff") or set(match.group(1)) == {"0"}:
        return None
    return match.group(1)
