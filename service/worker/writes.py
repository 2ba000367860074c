"""The rows of a round: a plan's steps (service/policy/round.py) as the values the store writes (the `RowBuilder`
that service/policy/decide.py takes; pure).

No decision is made here: each step says what its delivery writes, and this module only builds the rows for
it (inbox rows, outbox messages with their headers and documents, quarantine rows with their envelopes,
parked records, retry rows), in lane order.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from service.codes import Code, ErrorCode
from service.config import Topics
from service.durations import format_duration
from service.policy import redelivery
from service.policy.delivery import Delivery, RetryState
from service.policy.envelope import event_headers, failure_envelope
from service.policy.headers import to_json
from service.policy.owners import Owners, owner_for
from service.policy.records import pack_key
from service.policy.retry import AttemptHistory
from service.policy.round import RoundPlan, Write
from service.ports import Handler
from service.store.effects import NewEffect
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.parking import ParkedRecord
from service.store.quarantine import QuarantineRow
from service.store.retries import RetryRow
from service.store.round_write import Rows


class RowMaker:
    """Builds the rows of a plan for one consumer (its topics, name, quarantine owners and domain handler)."""

    def __init__(
        self,
        topics: Topics,
        consumer: str,
        owners: Owners,
        overrides: Mapping[str, str],
        handler: Handler[Any, Any, Any],
    ) -> None:
        self._topics = topics
        self._consumer = consumer
        self._owners = owners
        self._overrides = overrides
        self._handler = handler

    def rows(self, plan: RoundPlan, due: Mapping[Delivery, RetryState], now: datetime) -> Rows:
        """The rows of `plan`, whose deliveries had the retry states `due`, written at `now`."""
        rows = Rows()
        message, inbox_row = rows.messages.append, rows.inbox_rows.append
        for delivery, write, code, applied, reopen in plan.steps:
            if write is Write.APPLY:
                assert applied is not None
                version = applied.aggregate.version
                for event in applied.events:
                    message(self._event(delivery, event, version))
                span = delivery.record.span
                for effect in applied.effects:
                    rows.effects.append(
                        NewEffect(effect.idempotency_key, effect.aggregate_id, effect.kind, effect.payload, span)
                    )
                if reopen:
                    rows.reopened.append(_inbox_row(delivery, "processed", None))
                else:
                    inbox_row(_inbox_row(delivery, "processed", None))
            elif write is Write.STALE:
                self._terminal(rows, delivery, "processed", None, reopen)
            elif write is Write.REJECT:
                assert code is not None
                self._reject(rows, delivery, code, reopen, now)
            elif write is Write.QUARANTINE or write is Write.LAST_RESORT:
                assert isinstance(code, ErrorCode)
                state = due[delivery]
                history = state.history or AttemptHistory.first(now)
                last_resort = write is Write.LAST_RESORT
                self._quarantine(rows, delivery, code, history, last_resort=last_resort, breaker=state.breaker)
            elif write is Write.REQUARANTINE:
                assert isinstance(code, ErrorCode)
                rows.requarantined.append((delivery, code, due[delivery].history or AttemptHistory.first(now)))
                if not reopen:
                    rows.inbox_rows.append(_inbox_row(delivery, "quarantined", code))
            elif write is Write.PARK:
                rows.parked.append(_parked(delivery))
            elif write is Write.TO_TIER:
                self._to_tier(rows, delivery, due[delivery], now)
        return rows

    def _terminal(self, rows: Rows, delivery: Delivery, status: str, code: Code | None, reopen: bool) -> None:
        (rows.reopened if reopen else rows.inbox_rows).append(_inbox_row(delivery, status, code))

    def _event(self, delivery: Delivery, event: object, version: int) -> OutboxMessage:
        event_type, aggregate_id, document = self._handler.event(event, version, delivery.message_id)
        headers = event_headers(delivery.message_id, event_type, delivery.record.trace_id)
        return OutboxMessage.json(self._topics.events, aggregate_id, headers, document, delivery.record.span)

    def _reject(self, rows: Rows, delivery: Delivery, code: Code, reopen: bool, now: datetime) -> None:
        event_type, document = self._handler.rejection(
            delivery.message_id, delivery.aggregate_id, code, delivery.schema_name, delivery.origin, now
        )
        headers = {**event_headers(delivery.message_id, event_type, delivery.record.trace_id), "error-code": code}
        rows.messages.append(
            OutboxMessage.json(self._topics.rejected, delivery.aggregate_id, headers, document, delivery.record.span)
        )
        self._terminal(rows, delivery, "rejected", code, reopen)

    def _quarantine(
        self,
        rows: Rows,
        delivery: Delivery,
        code: ErrorCode,
        history: AttemptHistory,
        *,
        last_resort: bool,
        breaker: str | None = None,
    ) -> None:
        record = delivery.record
        envelope = failure_envelope(
            record,
            delivery.origin,
            consumer=self._consumer,
            history=history,
            code=code,
            payload_schema=None if last_resort else delivery.schema_name,
            timestamp_ms=delivery.origin_timestamp_ms,
        )
        if last_resort:
            envelope.document["lastResort"] = True
        if breaker is not None:
            # Its budget ran out while it waited for this downstream's breaker: no failed attempt of its own.
            envelope.document["breaker"] = breaker
        stored_key = (
            None if last_resort else delivery.key
        )  # the last resort stores nothing taken from the record as text
        rows.messages.append(
            OutboxMessage.json(self._topics.quarantine, stored_key, envelope.headers(), envelope.document, record.span)
        )
        rows.quarantined.append(
            QuarantineRow(
                failure_id=envelope.failure_id,
                message_id=delivery.message_id,
                error_code=code.value,
                owner=owner_for(code, self._owners, self._overrides),
                ordering_key=stored_key,
                envelope=envelope.document,
                payload=record.value,
                source_headers=to_json(record.headers),  # every name and value as base64 when not text
                attempts=history.attempts,
                first_failed_at=history.first_failed_at,
                last_failed_at=history.last_failed_at,
                trace_context=record.span,
            )
        )
        rows.inbox_rows.append(_inbox_row(delivery, "quarantined", code))

    def _to_tier(self, rows: Rows, delivery: Delivery, state: RetryState, now: datetime) -> None:
        """A copy on `<source>.retry.<delay>` via the outbox, and the retry row that says where the record is."""
        assert state.history is not None
        assert state.next_tier is not None
        assert state.last_code is not None
        record = delivery.record
        history = state.history.sent_to_tier()
        due_at = now + state.next_tier
        headers = redelivery.tier_headers(
            record,
            delivery.message_id,
            delivery.origin,
            delivery.origin_timestamp_ms,
            history,
            due_at,
            state.last_code,
            consumer=self._consumer,
            span=record.span,
        )
        topic = self._topics.retry(format_duration(state.next_tier))
        rows.messages.append(
            OutboxMessage(
                topic, delivery.key, to_json(headers), record.value or b"", pack_key(record.key), None, record.span
            )
        )
        rows.retrying.append(
            RetryRow(
                message_id=delivery.message_id,
                ordering_key=delivery.key,
                failure_id=delivery.origin.failure_id,
                attempts=history.attempts,
                tier_step=history.tier_step,
                first_failed_at=history.first_failed_at,
                last_failed_at=history.last_failed_at,
                due_at=due_at,
                error_code=state.last_code.value,
            )
        )


def _inbox_row(delivery: Delivery, status: str, code: Code | None) -> InboxRow:
    # By position (message id, status, source topic, partition and offset, aggregate, error code, received),
    # as it runs once per record.
    topic, partition, offset = delivery.origin
    return InboxRow(
        delivery.message_id,
        status,
        topic,
        partition,
        offset,
        delivery.aggregate_id,
        code.value if code else None,
        delivery.record.timestamp_ms,
    )


def _parked(delivery: Delivery) -> ParkedRecord:
    assert delivery.key is not None
    record = delivery.record
    return ParkedRecord(
        ordering_key=delivery.key,
        message_id=delivery.message_id,
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        timestamp_ms=record.timestamp_ms,
        value=record.value,
        headers=to_json(record.headers),
        source_key=pack_key(record.key),
        trace_context=record.span,
    )
