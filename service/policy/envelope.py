"""Failure envelopes (contract §8) and the headers of everything the service publishes.

Only identifiers and codes go in: never exception text, payload fields or anything a downstream said.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.codes import ErrorCode
from service.policy.records import BYTES_PREFIX, Coordinates, SourceRecord, time_of, trace_id_of
from service.policy.retry import AttemptHistory


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as in the contract's examples."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Envelope:
    """A failure envelope: the value on the quarantine topic and the `envelope` column of `quarantine`."""

    failure_id: str
    message_id: str
    error_code: ErrorCode
    document: dict[str, Any]

    def headers(self) -> dict[str, str]:
        """Headers that let readers deduplicate and route without parsing the value."""
        return {
            "failure-id": self.failure_id,
            "message-id": self.message_id,
            "error-code": self.error_code.value,
        }


def failure_envelope(
    record: SourceRecord,
    origin: Coordinates,
    *,
    consumer: str,
    history: AttemptHistory,
    code: ErrorCode,
    payload_schema: str | None,
    timestamp_ms: int | None = None,
) -> Envelope:
    """Build the envelope of a record that failed; `origin` is where it was first read, at `timestamp_ms`."""
    when = record.timestamp if timestamp_ms is None else time_of(timestamp_ms)
    source: dict[str, Any] = {
        "topic": origin.topic,
        "partition": origin.partition,
        "offset": origin.offset,
        "timestamp": iso(when),
    }
    # Keys and ids that are not text a reader can take as it is travel as their bytes in base64 (contract §8).
    if record.key is not None and record.key_text is None:
        source["keyBase64"] = base64.b64encode(record.key).decode("ascii")
    else:
        source["key"] = record.key_text
    # A `base64:` id is always one of ours (a text id with that prefix is encoded too): its rest is the base64.
    identity = (
        {"messageIdBase64": record.message_id.removeprefix(BYTES_PREFIX)}
        if record.message_id.startswith(BYTES_PREFIX)
        else {"messageId": record.message_id}
    )
    document = {
        "failureId": origin.failure_id,
        **identity,
        "source": source,
        "consumer": consumer,
        "attempt": history.attempts,
        "firstFailedAt": iso(history.first_failed_at),
        "lastFailedAt": iso(history.last_failed_at),
        "errorCode": code.value,
        "payloadSchema": payload_schema,
        "traceId": trace_id_of(record, consumer),
    }
    return Envelope(origin.failure_id, record.message_id, code, document)


def event_headers(message_id: str, event_type: str, trace_id: str | None) -> dict[str, str]:
    """Headers of a domain or rejection event; `event-id` is deterministic so readers can deduplicate."""
    headers = {"event-id": f"{message_id}/{event_type}", "message-id": message_id, "event-type": event_type}
    if trace_id:
        headers["trace-id"] = trace_id
    return headers
