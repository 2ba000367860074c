"""The quarantine table: an operational queue of records that could not be processed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy import repairs
from service.store.recordset import Columns

STATUSES = ("open", "resolved", "reprocessing", "reprocessed")  # what a record's `status` may be


class RecordKey(NamedTuple):
    """What names one quarantined record (contract §7): the consumer that quarantined it and its failure id. Two
    consumer names reading one source topic each keep their own record of a failure, under one failure id."""

    consumer_name: str
    failure_id: str


@dataclass(frozen=True)
class QuarantineRow:
    """A record to quarantine, with its envelope and original bytes."""

    failure_id: str
    message_id: str
    error_code: str
    owner: str
    ordering_key: str | None
    envelope: dict[str, Any]
    payload: bytes | None
    source_headers: list[list[str]]
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    trace_context: str | None = None  # the span context of the attempt that quarantined it, while tracing


# Quarantines a round's records, part of its one write statement (service/store/batch.py); a failure id this
# consumer quarantined already keeps its row (a redelivery after a crash).
COLUMNS = Columns(
    ("failure_id", "text"),
    ("message_id", "text"),
    ("error_code", "text"),
    ("owner", "text"),
    ("ordering_key", "text"),
    ("envelope", "jsonb"),
    ("payload", "bytea"),
    ("source_headers", "jsonb"),
    ("attempts", "int"),
    ("first_failed_at", "timestamptz"),
    ("last_failed_at", "timestamptz"),
    ("trace_context", "text"),
)
ADD_ROWS = f"""
    INSERT INTO quarantine (consumer_name, failure_id, message_id, error_code, owner, ordering_key, envelope, payload,
                            source_headers, attempts, first_failed_at, last_failed_at, trace_context)
    SELECT :consumer, * FROM ({COLUMNS.select("quarantine_rows")}) AS v
    ON CONFLICT (consumer_name, failure_id) DO NOTHING"""


_EXISTS = text("SELECT 1 FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id")
_ANNOTATE = text(
    """
    INSERT INTO quarantine_annotations (consumer_name, failure_id, author, note)
    VALUES (:consumer, :failure_id, :author, :note)
    """
)


async def annotate(connection: AsyncConnection, record: RecordKey, author: str, note: str) -> bool:
    """Append a note; False when there is no such record."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    if (await connection.execute(_EXISTS, params)).first() is None:
        return False
    await connection.execute(_ANNOTATE, {**params, "author": author, "note": note})
    return True


_EVENT = text(
    """
    INSERT INTO quarantine_events (consumer_name, failure_id, at, event, actor, detail)
    VALUES (:consumer, :failure_id, now(), :event, :actor, :detail)
    """
)


async def log_event(connection: AsyncConnection, record: RecordKey, event: str, actor: str, detail: str) -> None:
    """Append an event the database cannot see for itself (a payload revealed) to a record's timeline."""
    await connection.execute(
        _EVENT,
        {
            "consumer": record.consumer_name,
            "failure_id": record.failure_id,
            "event": event,
            "actor": actor,
            "detail": detail,
        },
    )


_STATUS = "SELECT status FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id"
_LOCK_STATUS = text(_STATUS + " FOR UPDATE")
_RESOLVE = text(
    """
    UPDATE quarantine SET status = 'resolved', resolution = :reason, resolved_by = :author, resolved_at = now(),
                          updated_at = now()
    WHERE consumer_name = :consumer AND failure_id = :failure_id
    """
)


async def lock_status(connection: AsyncConnection, record: RecordKey) -> str | None:
    """A record's status, its row locked until the transaction ends (None: no such record): whoever changes the
    record on what that status says (a resolve, a reprocess run's send) does so one at a time."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    status = (await connection.execute(_LOCK_STATUS, params)).scalar()
    return str(status) if status is not None else None


_TRACE_CONTEXT = text(
    "SELECT trace_context FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id"
)


async def trace_context_of(connection: AsyncConnection, record: RecordKey) -> str | None:
    """The span context (`traceparent`) of the attempt that quarantined the record, if it was traced: a copy sent
    back carries it (service/store/reprocess.py, `copy_of`)."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    found = (await connection.execute(_TRACE_CONTEXT, params)).scalar()
    return str(found) if found is not None else None


async def statuses(connection: AsyncConnection, records: Sequence[RecordKey]) -> dict[RecordKey, str]:
    """The status of each record as it is now, unlocked (what a dry run reads); one that does not exist is absent."""
    found: dict[RecordKey, str] = {}
    for record in records:
        params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
        status = (await connection.execute(text(_STATUS), params)).scalar()
        if status is not None:
            found[record] = str(status)
    return found


async def resolve(connection: AsyncConnection, record: RecordKey, reason: str, author: str) -> str | None:
    """Close a record without reprocessing it if `repairs.resolves` its status; returns its previous status (None:
    no such record)."""
    current = await lock_status(connection, record)
    if not repairs.resolves(current):
        return current
    await connection.execute(
        _RESOLVE,
        {"consumer": record.consumer_name, "failure_id": record.failure_id, "reason": reason, "author": author},
    )
    return "open"


_MARK_REPROCESSED = text(
    """
    UPDATE quarantine SET status = 'reprocessed', updated_at = now()
    WHERE consumer_name = :consumer AND failure_id = ANY(CAST(:ids AS text[]))
    """
)


async def mark_reprocessed(connection: AsyncConnection, consumer: str, failure_ids: Sequence[str]) -> None:
    """This consumer's records whose reprocessed copy was applied: `reprocessed` (terminal)."""
    if failure_ids:
        await connection.execute(_MARK_REPROCESSED, {"consumer": consumer, "ids": list(failure_ids)})


_REQUARANTINE = text(
    """
    UPDATE quarantine
    SET status = 'open', error_code = :code, repeat_failures = repeat_failures + 1, attempts = attempts + :attempts,
        last_failed_at = :failed_at,
        envelope = envelope || jsonb_build_object('errorCode', CAST(:code AS text),
                                                  'lastFailedAt', CAST(:failed_at_text AS text)),
        updated_at = now()
    WHERE consumer_name = :consumer AND failure_id = :failure_id
    """
)


async def requarantine(
    connection: AsyncConnection, record: RecordKey, code: str, attempts: int, failed_at: datetime
) -> None:
    """A reprocessed record failed again: open again, with its repeat-failure count raised."""
    await connection.execute(
        _REQUARANTINE,
        {
            "consumer": record.consumer_name,
            "failure_id": record.failure_id,
            "code": code,
            "attempts": attempts,
            "failed_at": failed_at,
            "failed_at_text": failed_at.isoformat(),
        },
    )
