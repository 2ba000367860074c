"""Quarantine edits: an operator's corrected payload or headers of one record, with its diff and its state."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.quarantine import RecordKey

_ADD = text(
    """
    INSERT INTO quarantine_edits (consumer_name, failure_id, actor, state, payload_before, payload_after,
                                  headers_before, headers_after, diff, repeat_failures, sent_at)
    VALUES (:consumer, :failure_id, :actor, :state, :payload_before, :payload_after, :headers_before, :headers_after,
            :diff, :repeat_failures, CASE WHEN :state = 'sent' THEN now() END)
    RETURNING id
    """
).bindparams(bindparam("headers_before", type_=JSONB), bindparam("headers_after", type_=JSONB))
_COLUMNS = """
    e.id, e.consumer_name, e.failure_id, e.actor, e.created_at, e.state, e.payload_before, e.payload_after,
    e.headers_before, e.headers_after, e.diff, e.repeat_failures, e.decided_by, e.decided_at, e.sent_at
"""
_OF_RECORD = text(
    f"""
    SELECT {_COLUMNS} FROM quarantine_edits e
    WHERE consumer_name = :consumer AND failure_id = :failure_id ORDER BY id
    """
)
_ONE = text(f"SELECT {_COLUMNS} FROM quarantine_edits e WHERE id = :edit_id")
_LOCK_ONE = text(f"SELECT {_COLUMNS} FROM quarantine_edits e WHERE id = :edit_id FOR UPDATE")
# The edit of a record that is still under way: waiting for approval, or sent while the record has not failed
# again since (its repeat-failure count unchanged); a record has at most one.
_UNDER_WAY = text(
    """
    SELECT e.id, e.state FROM quarantine_edits e
    JOIN quarantine q ON q.consumer_name = e.consumer_name AND q.failure_id = e.failure_id
    WHERE e.consumer_name = :consumer AND e.failure_id = :failure_id
      AND (e.state = 'pending_approval' OR (e.state = 'sent' AND q.repeat_failures = e.repeat_failures))
    ORDER BY e.id DESC LIMIT 1
    """
)
_DECIDE = text(
    """
    UPDATE quarantine_edits SET state = :state, decided_by = :actor, decided_at = now(),
                                sent_at = CASE WHEN :state = 'sent' THEN now() END
    WHERE id = :edit_id
    """
)


async def add(
    connection: AsyncConnection,
    record: RecordKey,
    *,
    actor: str,
    state: str,
    payload_before: bytes | None,
    payload_after: bytes,
    headers_before: list[list[str]],
    headers_after: list[list[str]],
    diff: str,
    repeat_failures: int,
) -> int:
    """Record an edit; its id."""
    found = await connection.execute(
        _ADD,
        {
            "consumer": record.consumer_name,
            "failure_id": record.failure_id,
            "actor": actor,
            "state": state,
            "payload_before": payload_before,
            "payload_after": payload_after,
            "headers_before": headers_before,
            "headers_after": headers_after,
            "diff": diff,
            "repeat_failures": repeat_failures,
        },
    )
    return int(found.scalar_one())


async def of_record(connection: AsyncConnection, record: RecordKey) -> list[dict[str, Any]]:
    """A record's edits, oldest first."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    return [dict(row._mapping) for row in await connection.execute(_OF_RECORD, params)]


async def get(connection: AsyncConnection, edit_id: int, *, lock: bool = False) -> dict[str, Any] | None:
    """One edit (None: no such edit), its row locked until the transaction ends when `lock`."""
    row = (await connection.execute(_LOCK_ONE if lock else _ONE, {"edit_id": edit_id})).first()
    return dict(row._mapping) if row is not None else None


async def under_way(connection: AsyncConnection, record: RecordKey) -> tuple[int, str] | None:
    """The record's edit still under way (its id and state), if any."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    row = (await connection.execute(_UNDER_WAY, params)).first()
    return (int(row.id), str(row.state)) if row is not None else None


async def decide(connection: AsyncConnection, edit_id: int, state: str, actor: str) -> None:
    """A pending edit approved (`sent`) or rejected by `actor`."""
    await connection.execute(_DECIDE, {"edit_id": edit_id, "state": state, "actor": actor})
