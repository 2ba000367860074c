"""A record's place in a trace (W3C Trace Context), as the service derives and carries it; pure.

Every record has a trace id: its producer's (`traceparent`), or one derived from the consumer's name and the
record's message id, so that every attempt of the same record (a redelivery, a tier copy, a parked release, a
reprocess) joins one trace, and an envelope names it even when tracing is off. The span context of an attempt
travels with what the attempt wrote (the outbox row, the effect, the parked or quarantined record); a copy the
service publishes again keeps its producer's headers byte-exact and carries that context in `SPAN_HEADER`, so that
the next attempt links to the one before it.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple, TypeGuard

# The header of a copy (tier, reprocess, edit) that holds the span context of the attempt that sent it: the
# producer's `traceparent` stays as it was.
SPAN_HEADER = "service-traceparent"

_PARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


class SpanRef(NamedTuple):
    """A span context as `traceparent` carries it (a tuple: made for many records, where a frozen dataclass costs
    several times as much)."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero
    sampled: bool

    @property
    def header(self) -> str:
        """As a `traceparent` value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def trace_id_in(value: bytes) -> str | None:
    """The trace id of a `traceparent` header's bytes, as `parse` reads them, without building its `SpanRef`
    (every source record's header is read so)."""
    try:
        match = _PARENT.match(value.decode("ascii").strip().lower())
    except UnicodeDecodeError:
        return None
    if match is None:
        return None
    version, trace_id, span_id, _ = match.groups()
    if version == "ff" or not trace_id.strip("0") or not span_id.strip("0"):
        return None
    return trace_id


def parse(value: str | bytes | None) -> SpanRef | None:
    """A `traceparent` value's span context; None when it is absent or not well formed (version ff, an all-zero
    trace or span id, or a version 00 value with anything after it)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not value:
        return None
    match = _PARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or not trace_id.strip("0") or not span_id.strip("0"):
        return None
    return SpanRef(trace_id, span_id, bool(int(flags, 16) & 1))


def derived_trace_id(consumer: str, message_id: str) -> str:
    """The trace id of a record whose producer sent none: the first 32 hex digits of sha256(consumer name, LF,
    message id) (migration 0021 derives the same in SQL for envelopes written before)."""
    digest = hashlib.sha256(f"{consumer}\n{message_id}".encode()).hexdigest()[:32]
    return digest if digest.strip("0") else "0" * 31 + "1"


def is_trace_id(value: object) -> TypeGuard[str]:
    """Whether `value` is a trace id as envelopes hold it (32 lowercase hex digits, not all zero)."""
    return isinstance(value, str) and _TRACE_ID.fullmatch(value) is not None and bool(value.strip("0"))
