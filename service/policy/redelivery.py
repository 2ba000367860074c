"""The headers a record carries through the retry tiers: its original identity and its attempt history.

A tier copy keeps the original key, value and headers, and adds:
`message-id` (the original message id), `failure-id` (the original coordinates, `topic/partition/offset`),
`origin-timestamp`, `retry-attempt`, `retry-step`, `first-failed-at`, `last-failed-at`, `retry-due-at`
(epoch milliseconds), `retry-excused-ms` (how much of the time since its first failure does not count against its
elapsed budget: our own outages, and waits past a due time), `error-code` and `consumer` (the consumer name that
sent it: the consumers of one source topic share its tier and reprocess topics, and each applies only its own
copies; a reprocess copy names its consumer the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from service.codes import ErrorCode
from service.policy import traces
from service.policy.records import Coordinates, SourceRecord, id_bytes, time_of
from service.policy.retry import AttemptHistory

_OURS = frozenset(
    {
        traces.SPAN_HEADER,
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
    }
)


@dataclass(frozen=True)
class Redelivery:
    """What a tier copy says about the record it stands for."""

    origin: Coordinates
    origin_timestamp_ms: int
    history: AttemptHistory
    due_at: datetime


def _ms(moment: datetime) -> bytes:
    return str(round(moment.timestamp() * 1000)).encode()


def _count(value: str | None) -> int:
    """A non-negative decimal integer header; anything else is garbled."""
    if value is None or not value.isdigit() or len(value) > 18:
        raise ValueError("not a count")
    return int(value)


def _stamp(value: str | None) -> int:
    """A record timestamp header (milliseconds since the epoch): any int64, as the record had it."""
    if value is None:
        raise ValueError("no timestamp")
    digits = value.removeprefix("-")
    if not digits.isdigit() or len(digits) > 19 or not -(2**63) <= (stamp := int(value)) < 2**63:
        raise ValueError("not a timestamp")
    return stamp


def _excused(value: str | None) -> int:
    """The milliseconds a copy's history excuses; a copy written before the header existed excuses none."""
    return 0 if value is None else _count(value)


def _moment(value: str | None) -> datetime:
    return time_of(_count(value))


def tier_headers(
    record: SourceRecord,
    message_id: str,
    origin: Coordinates,
    origin_timestamp_ms: int,
    history: AttemptHistory,
    due_at: datetime,
    code: ErrorCode,
    *,
    consumer: str,
    span: str | None = None,
) -> list[tuple[str, bytes]]:
    """Headers of the copy `consumer` sends to a retry tier; the record's own headers are kept (traceparent), and
    `span`, the context of the attempt that sent it while tracing, goes in a header of the service's own."""
    kept = [(name, value) for name, value in record.headers if name not in _OURS]
    ours = [(traces.SPAN_HEADER, span.encode())] if span is not None else []
    # The id's own bytes, so that the copy is read back as the same message id.
    return [
        *kept,
        *ours,
        ("message-id", id_bytes(message_id) or message_id.encode()),
        ("failure-id", origin.failure_id.encode()),
        ("origin-timestamp", str(origin_timestamp_ms).encode()),
        ("retry-attempt", str(history.attempts).encode()),
        ("retry-step", str(history.tier_step).encode()),
        ("first-failed-at", _ms(history.first_failed_at)),
        ("last-failed-at", _ms(history.last_failed_at)),
        ("retry-due-at", _ms(due_at)),
        ("retry-excused-ms", str(round(history.excused.total_seconds() * 1000)).encode()),
        ("error-code", code.value.encode()),
        ("consumer", consumer.encode()),
    ]


def parse(record: SourceRecord) -> Redelivery | None:
    """Read the tier headers of a record; None when they are missing or malformed."""
    try:
        topic, partition, offset = (record.header("failure-id") or "").rsplit("/", 2)
        history = AttemptHistory(
            attempts=_count(record.header("retry-attempt")),
            first_failed_at=_moment(record.header("first-failed-at")),
            last_failed_at=_moment(record.header("last-failed-at")),
            tier_step=_count(record.header("retry-step")),
            excused=timedelta(milliseconds=_excused(record.header("retry-excused-ms"))),
        )
        # What a copy excuses cannot be more than the time between its first and its last failure (a garbled or
        # hostile header must not make its elapsed budget endless).
        between = max(timedelta(0), history.last_failed_at - history.first_failed_at)
        history = replace(history, excused=min(history.excused, between))
        return Redelivery(
            origin=Coordinates(topic, _count(partition), _count(offset)),
            origin_timestamp_ms=_stamp(record.header("origin-timestamp")),
            history=history,
            due_at=_moment(record.header("retry-due-at")),
        )
    except (ValueError, OverflowError, OSError):
        return None


def origin_of(record: SourceRecord) -> tuple[Coordinates, int] | None:
    """The original coordinates and timestamp of a reprocessed record (`failure-id`, `origin-timestamp`)."""
    try:
        topic, partition, offset = (record.header("failure-id") or "").rsplit("/", 2)
        stamp = record.header("origin-timestamp")
        return Coordinates(topic, _count(partition), _count(offset)), _stamp(stamp) if stamp else record.timestamp_ms
    except (ValueError, OverflowError, OSError):
        return None


def addressed_elsewhere(record: SourceRecord, consumer: str) -> bool:
    """Whether a tier or reprocess copy names another consumer name than `consumer` in its `consumer` header; a copy
    without one was sent before copies named their consumer, and is taken as ours."""
    addressee = record.raw_header("consumer")
    return addressee is not None and addressee != consumer.encode()
