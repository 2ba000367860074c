"""A delivery on its way to a terminal state, and its retry state: two immutable values.

A `Delivery` is what was fetched (or unparked, or sent back by a reprocess run), with its identities computed
once. Its `RetryState` (attempt history, due time, pending verdict or tier hand-off) changes from round to round,
so it is a value of its own that the consumer's lanes hold per delivery and replace after each failed attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from service.codes import ErrorCode
from service.policy.handling import DecodeFailure
from service.policy.records import Coordinates, SourceRecord
from service.policy.retry import AttemptHistory

PARKED_TOPIC = "(parked)"  # the lane of one key's parked records is `(parked)/<key>`, partition -1


@dataclass(frozen=True, slots=True)
class RetryState:
    """Where a delivery stands in its retries; a failed round replaces it (service/policy/next_step.py)."""

    history: AttemptHistory | None = None
    due: float = 0.0  # loop time before which the delivery must not be attempted
    breaker: str | None = None  # waiting for this downstream's breaker (woken when it closes); or quarantined by it
    verdict: ErrorCode | None = None  # budget spent: quarantine with this code on the next write
    next_tier: timedelta | None = None  # hand over to the retry tier with this delay on the next write
    last_code: ErrorCode | None = None
    refused: int = 0  # how many times its quarantine write failed in a row (service/policy/next_step.py)
    # The process's own downtime (service/worker/downtime.py) when it last failed: what came after is excused.
    downtime_mark: float = 0.0


FRESH = RetryState()  # a delivery that has not failed (yet)


class Delivery:
    """A fetched (or unparked) record on its way to a terminal state.

    Immutable: every attribute is `Final`, so mypy refuses an assignment anywhere but here. It is not a frozen
    dataclass because one is built per record and a frozen one costs several times as much to build
    (docs/performance.md). Equality is identity: two deliveries of one message are two deliveries. The
    identities (message id, aggregate id, ordering key, lane, thread) are computed once: a round asks for them
    many times per record.
    """

    __slots__ = (
        "aggregate_id",
        "arrival",
        "decoded",
        "failed",
        "foreign",
        "in_tier",
        "key",
        "lane",
        "message_id",
        "origin",
        "origin_timestamp_ms",
        "parked_id",
        "record",
        "reprocess",
        "thread",
    )

    def __init__(
        self,
        record: SourceRecord,
        decoded: Any,
        origin: Coordinates,
        origin_timestamp_ms: int,
        parked_id: int | None = None,
        *,
        arrival: RetryState = FRESH,
        in_tier: bool = False,
        reprocess: bool = False,
        foreign: bool = False,
    ) -> None:
        self.record: Final = record
        self.decoded: Final[Any] = decoded  # the domain's message (Handler.decode), or a DecodeFailure
        self.origin: Final = origin  # where it was first read (a tier or reprocess copy: the original's)
        self.origin_timestamp_ms: Final = origin_timestamp_ms
        self.parked_id: Final = parked_id  # came out of the parked table
        self.arrival: Final = arrival  # the retry state it came with (a tier copy: its history and due time)
        self.in_tier: Final = in_tier  # a retry tier's copy: no blocking retries; its lane waits until it is due
        self.reprocess: Final = reprocess  # a quarantined record sent back by `<program> reprocess`
        self.foreign: Final = foreign  # a tier or reprocess copy addressed to another consumer name: not ours
        self.message_id: Final = record.message_id  # the record's idempotency identity
        failed = isinstance(decoded, DecodeFailure)
        self.failed: Final = failed  # the bytes did not decode into a message
        aggregate_id: str | None = None if failed else decoded.aggregate_id
        self.aggregate_id: Final = aggregate_id  # the aggregate the record is about, when it decoded
        key = record.key_text or aggregate_id
        self.key: Final = key  # the ordering key: the record key, else the aggregate id
        # Applied in order: a partition, or the parked records of one key.
        lane = (f"{PARKED_TOPIC}/{key}", -1) if parked_id is not None else (record.topic, record.partition)
        self.lane: Final[tuple[str, int]] = lane
        # What must stay in order: a key within a lane; a record without a key is a thread of its own.
        self.thread: Final[tuple[str, int, str]] = (*lane, key if key is not None else f"#{record.offset}")

    @property
    def schema_name(self) -> str | None:
        """The payload schema, when readable."""
        schema: str | None = self.decoded.schema_name
        return schema

    def __repr__(self) -> str:
        return f"Delivery({self.message_id!r}, lane={self.lane!r}, offset={self.record.offset})"
