"""A source record as the state machine sees it, and the identities derived from it (contract §5)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_MAX_MESSAGE_ID = 300


@dataclass(frozen=True)
class Coordinates:
    """Where a record was first read: the failure id of anything that goes wrong with it."""

    topic: str
    partition: int
    offset: int

    @property
    def failure_id(self) -> str:
        """`<topic>/<partition>/<offset>`, e.g. `orders/12/884193`."""
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(frozen=True)
class SourceRecord:
    """One Kafka record, independent of the client library that fetched it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def coordinates(self) -> Coordinates:
        """Where this record sits now."""
        return Coordinates(self.topic, self.partition, self.offset)

    def header(self, name: str) -> str | None:
        """The last value of a header as text, or None when absent or not UTF-8."""
        for key, value in reversed(self.headers):
            if key == name:
                try:
                    return value.decode("utf-8")
                except UnicodeDecodeError:
                    return None
        return None

    @cached_property
    def key_text(self) -> str | None:
        """The key as text (the order id), None when missing or not UTF-8."""
        if self.key is None:
            return None
        try:
            return self.key.decode("utf-8")
        except UnicodeDecodeError:
            return None

    @cached_property
    def message_id(self) -> str:
        """The producer's `message-id` header, else the coordinates: two records with one id have one effect."""
        given = self.header("message-id")
        if given and given.strip() and len(given) <= _MAX_MESSAGE_ID:
            return given.strip()
        return self.coordinates.failure_id

    @cached_property
    def trace_id(self) -> str | None:
        """The W3C trace id from `traceparent`, only when well formed (it ends up in envelopes and logs)."""
        parent = self.header("traceparent")
        match = _TRACEPARENT.match(parent.strip().lower()) if parent else None
        # W3C: version ff and an all-zero trace id are invalid.
        if match is None or parent is None or parent.strip().startswith("ff") or set(match.group(1)) == {"0"}:
            return None
        return match.group(1)

    @property
    def timestamp(self) -> datetime:
        """The broker or producer timestamp."""
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
