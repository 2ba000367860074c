"""Reprocess audit and selection: which quarantined records a run takes, and what became of each."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy.edits import RESERVED_HEADERS
from service.policy.headers import from_json, to_json
from service.policy.propagation import replaced
from service.policy.records import id_bytes, pack_key
from service.policy.traces import SPAN_HEADER
from service.store.outbox import OutboxMessage
from service.store.quarantine import RecordKey


@dataclass(frozen=True)
class Candidate:
    """A quarantined record a run may send back, with its status when it was selected."""

    consumer_name: str
    failure_id: str
    message_id: str
    ordering_key: str | None
    error_code: str
    status: str
    payload: bytes | None
    source_headers: list[list[str]]
    envelope: dict[str, Any]
    repeat_failures: int
    erased: str | None = None  # when and by whom its bytes were removed: such a record cannot be sent again
    trace_context: str | None = None  # the span context of the attempt that quarantined it, if it was traced

    @property
    def record(self) -> RecordKey:
        """The quarantine row it is."""
        return RecordKey(self.consumer_name, self.failure_id)


@dataclass(frozen=True)
class ItemState:
    """The business state of one item: what verification compares before and after."""

    inbox_status: str | None
    quarantine_status: str
    repeat_failures: int
    effects: int


# Which quarantined records a run takes: the named failure ids whatever their status, or else the open records;
# each other filter is off when its parameter is NULL (fixed SQL, whatever the filters).
_SELECTED = """
    (CAST(:consumer AS text) IS NULL OR consumer_name = :consumer)
    AND (failure_id = ANY(CAST(:failure_ids AS text[])) OR (CAST(:failure_ids AS text[]) IS NULL AND status = 'open'))
    AND (CAST(:error_code AS text) IS NULL OR error_code = :error_code)
    AND (CAST(:owner AS text) IS NULL OR owner = :owner)
    AND (CAST(:since AS timestamptz) IS NULL OR first_failed_at >= :since)
    AND (CAST(:until AS timestamptz) IS NULL OR first_failed_at < :until)
"""
_OWNERS = text(
    f"SELECT DISTINCT consumer_name, envelope -> 'source' ->> 'topic' AS topic FROM quarantine WHERE {_SELECTED}"
)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


_CANDIDATES = text(
    f"""
    SELECT consumer_name, failure_id, message_id, ordering_key, error_code, status, payload, source_headers, envelope,
           repeat_failures, erased_at, erased_by, trace_context
    FROM quarantine WHERE {_SELECTED}
    ORDER BY first_failed_at, failure_id
    """
)


def _selection(
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    owner: str | None,
) -> dict[str, Any]:
    """The parameters of `_SELECTED` (without the consumer); an empty filter is no filter."""
    return {
        "failure_ids": list(failure_ids) or None,
        "error_code": error_code or None,
        "owner": owner or None,
        "since": since,
        "until": until,
    }


async def owners(
    connection: AsyncConnection,
    *,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    owner: str | None = None,
) -> list[tuple[str, str]]:
    """The (consumer name, source topic) pairs the selected records were quarantined under."""
    params = {**_selection(failure_ids, error_code, since, until, owner), "consumer": None}
    return sorted((name, source) for name, source in await connection.execute(_OWNERS, params))


async def select_candidates(
    connection: AsyncConnection,
    *,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    consumer: str | None = None,
    owner: str | None = None,
) -> list[Candidate]:
    """Named failure ids (whatever their status), or the open records matching the filters, of one consumer when
    it is given; oldest first."""
    params = {**_selection(failure_ids, error_code, since, until, owner), "consumer": consumer}
    return [
        Candidate(
            consumer_name=row.consumer_name,
            failure_id=row.failure_id,
            message_id=row.message_id,
            ordering_key=row.ordering_key,
            error_code=row.error_code,
            status=row.status,
            payload=bytes(row.payload) if row.payload is not None else None,
            source_headers=list(row.source_headers),
            envelope=dict(row.envelope),
            repeat_failures=row.repeat_failures,
            erased=None if row.erased_at is None else f"erased at {_utc(row.erased_at)} by {row.erased_by}",
            trace_context=row.trace_context,
        )
        for row in await connection.execute(_CANDIDATES, params)
    ]


_INBOX_STATUS = text("SELECT status FROM inbox WHERE consumer_name = :consumer AND message_id = :message_id")
_QUARANTINE_STATE = text(
    "SELECT status, repeat_failures FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id"
)
_EFFECTS_OF = text("SELECT count(*) FROM effects WHERE aggregate_id = :aggregate_id")


async def state_of(connection: AsyncConnection, item: Candidate) -> ItemState:
    """Inbox status (the item's consumer's), quarantine status and repeat count, and the number of effects of the
    item's aggregate."""
    consumer = item.consumer_name
    status = (await connection.execute(_INBOX_STATUS, {"consumer": consumer, "message_id": item.message_id})).scalar()
    row = (await connection.execute(_QUARANTINE_STATE, {"consumer": consumer, "failure_id": item.failure_id})).one()
    count = (await connection.execute(_EFFECTS_OF, {"aggregate_id": item.ordering_key})).scalar_one()
    return ItemState(status, row.status, row.repeat_failures, int(count))


_ATTEMPTS = text(
    """
    SELECT count(*) FROM reprocess_items
    WHERE consumer_name = :consumer AND failure_id = :failure_id AND published_at IS NOT NULL
    """
)


async def attempts_so_far(connection: AsyncConnection, record: RecordKey) -> int:
    """How many times runs have sent this record back already (an item a run skipped was not sent)."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    return int((await connection.execute(_ATTEMPTS, params)).scalar_one())


_START_RUN = text(
    """
    INSERT INTO reprocess_runs (id, actor, reason, selection, options, outcome)
    VALUES (:run_id, :actor, :reason, :selection, :options, 'running')
    """
).bindparams(bindparam("selection", type_=JSONB), bindparam("options", type_=JSONB))
_FINISH_RUN = text(
    """
    UPDATE reprocess_runs SET outcome = :outcome, stop_reason = :stop_reason, counts = :counts, finished_at = now()
    WHERE id = :run_id
    """
).bindparams(bindparam("counts", type_=JSONB))


async def start_run(
    connection: AsyncConnection,
    run_id: str,
    *,
    actor: str,
    reason: str,
    selection: dict[str, Any],
    options: dict[str, Any],
) -> None:
    """Open the audit row of a run."""
    await connection.execute(
        _START_RUN,
        {"run_id": run_id, "actor": actor, "reason": reason, "selection": selection, "options": options},
    )


async def finish_run(
    connection: AsyncConnection, run_id: str, outcome: str, stop_reason: str | None, counts: dict[str, Any]
) -> None:
    """Close the audit row of a run."""
    await connection.execute(
        _FINISH_RUN, {"run_id": run_id, "outcome": outcome, "stop_reason": stop_reason, "counts": counts}
    )


# A skipped item is settled as it is written (`verified_at`: when its outcome was decided); it was never sent.
_ADD_ITEM = text(
    """
    INSERT INTO reprocess_items (run_id, consumer_name, failure_id, message_id, stage, attempt, outcome, detail,
                                 published_at, verified_at)
    VALUES (:run_id, :consumer, :failure_id, :message_id, :stage, :attempt, :outcome, :detail, :published_at,
            CASE WHEN CAST(:published_at AS timestamptz) IS NULL THEN now() END)
    """
)
_SETTLE_ITEM = text(
    """
    UPDATE reprocess_items SET outcome = :outcome, detail = :detail, verified_at = now()
    WHERE run_id = :run_id AND failure_id = :failure_id
    """
)


async def add_item(
    connection: AsyncConnection,
    *,
    run_id: str,
    record: RecordKey,
    message_id: str,
    stage: str,
    attempt: int,
    outcome: str,
    published_at: datetime | None,
    detail: str | None = None,
) -> None:
    """Record one item of a run: one sent (`published_at`), or one the run decided not to send (None: its outcome,
    with `detail` saying why, is final)."""
    await connection.execute(
        _ADD_ITEM,
        {
            "run_id": run_id,
            "consumer": record.consumer_name,
            "failure_id": record.failure_id,
            "message_id": message_id,
            "stage": stage,
            "attempt": attempt,
            "outcome": outcome,
            "detail": detail,
            "published_at": published_at,
        },
    )


async def settle_item(connection: AsyncConnection, run_id: str, failure_id: str, outcome: str, detail: str) -> None:
    """Record what verification found for one item."""
    await connection.execute(
        _SETTLE_ITEM, {"run_id": run_id, "failure_id": failure_id, "outcome": outcome, "detail": detail}
    )


_RUN_COLUMNS = "id, actor, reason, selection, options, counts, outcome, stop_reason, started_at, finished_at"
_RUNS = text(
    f"""
    SELECT {_RUN_COLUMNS}, count(*) OVER () AS matching FROM reprocess_runs
    ORDER BY started_at DESC, id LIMIT :limit OFFSET :offset
    """
)
_COUNT_RUNS = text("SELECT count(*) FROM reprocess_runs")
_RUN = text(f"SELECT {_RUN_COLUMNS} FROM reprocess_runs WHERE id = :run_id")
_RUN_ITEMS = text(
    """
    SELECT consumer_name, failure_id, message_id, stage, attempt, outcome, detail, published_at, verified_at
    FROM reprocess_items
    WHERE run_id = :run_id ORDER BY coalesce(published_at, verified_at) NULLS LAST, failure_id
    """
)


async def runs(connection: AsyncConnection, *, limit: int = 50, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Reprocess runs, newest first: one page of them, and how many there are."""
    rows = [dict(row._mapping) for row in await connection.execute(_RUNS, {"limit": limit, "offset": offset})]
    total = int(rows[0]["matching"]) if rows else int((await connection.execute(_COUNT_RUNS)).scalar_one())
    for row in rows:
        del row["matching"]
    return rows, total


async def run_with_items(connection: AsyncConnection, run_id: str) -> dict[str, Any] | None:
    """One run's audit row with its items, in the order they were sent."""
    found = (await connection.execute(_RUN, {"run_id": run_id})).first()
    if found is None:
        return None
    run = dict(found._mapping)
    run["items"] = [dict(item._mapping) for item in await connection.execute(_RUN_ITEMS, {"run_id": run_id})]
    return run


# The headers a copy carries of its own: an original's (or an edit's) of these names are replaced.
_OUR_HEADERS = RESERVED_HEADERS


def copy_of(
    candidate: Candidate,
    topic: str,
    *,
    sender: tuple[str, str],
    attempt: int,
    payload: bytes | None = None,
    headers: Sequence[tuple[str, bytes]] | None = None,
) -> OutboxMessage:
    """A quarantined record's copy for `topic` (its reprocess topic): its original bytes and headers, or an
    operator's corrected ones (`payload`, `headers`: service/editing.py), under its original message id, failure id,
    timestamp and keys, naming its consumer and who sent it (`sender`: the run's or the edit's header). The span
    context of the attempt that quarantined it, if it was traced, goes with the row (the relay's `send` span continues
    it) and in the copy's own `SPAN_HEADER` (the attempt it makes links to it); the producer's headers stay as they
    were, `traceparent` included."""
    original = from_json(candidate.source_headers) if headers is None else tuple(headers)
    kept = [(name, value) for name, value in original if name not in _OUR_HEADERS]
    # The id's own bytes, so that the copy is read back as the same message id.
    identity = id_bytes(candidate.message_id) or candidate.message_id.encode()
    kept += [
        ("message-id", identity),
        ("failure-id", candidate.failure_id.encode()),
        (sender[0], sender[1].encode()),
        ("reprocess-attempt", str(attempt).encode()),
        ("consumer", candidate.consumer_name.encode()),
    ]
    stamp = _epoch_ms(candidate.envelope.get("source", {}).get("timestamp"))
    if stamp is not None:
        kept.append(("origin-timestamp", str(stamp).encode()))
    if candidate.trace_context is not None:
        kept = list(replaced(kept, SPAN_HEADER, candidate.trace_context.encode()))
    body = candidate.payload if payload is None else payload
    return OutboxMessage(
        topic,
        candidate.ordering_key,
        to_json(kept),
        body or b"",
        pack_key(_source_key(candidate.envelope.get("source", {}))),
        trace_context=candidate.trace_context,
    )


def _epoch_ms(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def _source_key(source: dict[str, Any]) -> bytes | None:
    """The record's original Kafka key, as its envelope gives it (`key`, or `keyBase64` for bytes)."""
    if source.get("keyBase64") is not None:
        return base64.b64decode(source["keyBase64"])
    key = source.get("key")
    return key.encode() if isinstance(key, str) else None
