"""The inbox: one row per message id that reached a terminal state (processed, rejected, quarantined)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy.records import EARLIEST_MS, LATEST_MS
from service.store.recordset import Columns


@dataclass(slots=True)  # not frozen (slower to build): one is built per record
class InboxRow:
    """A terminal record, ready to insert."""

    message_id: str
    status: str
    source_topic: str
    source_partition: int
    source_offset: int
    aggregate_id: str | None
    error_code: str | None
    received_ms: int  # the record's Kafka timestamp (ms since the epoch): SQL makes it `received_at`


# The rows of a round (a recordset of `InboxRow`, service/store/recordset.py), part of the round's one write
# statement (service/store/batch.py). A plain insert: a message id that is there already is a unique violation
# of `pk_inbox`, which fails the round's transaction (a concurrent consumer won; see batch.py).
COLUMNS = Columns(
    ("message_id", "text"),
    ("status", "text"),
    ("source_topic", "text"),
    ("source_partition", "int"),
    ("source_offset", "bigint"),
    ("aggregate_id", "text"),
    ("error_code", "text"),
    ("received_ms", "bigint"),
)
# The record's timestamp is producer input, any int64: it is held to what the service's datetimes hold (records.py),
# where PostgreSQL's range would fail the round, and converted in whole seconds and milliseconds apart, exact where a
# double is not (past 2255) and without a `numeric` division (docs/performance.md, "One statement, one transaction
# per round").
ADD_ROWS = f"""
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                       aggregate_id, error_code, received_at)
    SELECT :consumer, message_id, status, source_topic, source_partition, source_offset, aggregate_id, error_code,
           to_timestamp(ms / 1000) + (ms % 1000) * INTERVAL '1 millisecond'
    FROM ({COLUMNS.select("inbox_rows")}) AS v,
         LATERAL (SELECT LEAST(GREATEST(received_ms, {EARLIEST_MS}), {LATEST_MS}) AS ms) AS t"""


_REOPEN = text(
    """
    UPDATE inbox SET status = v.status, error_code = v.error_code, processed_at = now()
    FROM unnest(CAST(:ids AS text[]), CAST(:statuses AS text[]), CAST(:codes AS text[]))
         AS v(message_id, status, error_code)
    WHERE inbox.consumer_name = :consumer AND inbox.message_id = v.message_id
      AND inbox.status = 'quarantined'
    RETURNING inbox.message_id
    """
)


async def reopen(connection: AsyncConnection, consumer: str, rows: Sequence[InboxRow]) -> set[str]:
    """Move quarantined messages that a reprocess applied to their new status; return the ids moved.

    Only a `quarantined` row moves: a message may become `processed` once, never twice.
    """
    if not rows:
        return set()
    result = await connection.execute(
        _REOPEN,
        {
            "consumer": consumer,
            "ids": [row.message_id for row in rows],
            "statuses": [row.status for row in rows],
            "codes": [row.error_code for row in rows],
        },
    )
    return set(result.scalars())


# ctid batches keep each delete small; SKIP LOCKED never waits on a row a consumer is writing.
_PURGE = text(
    """
    DELETE FROM inbox WHERE ctid IN (
        SELECT ctid FROM inbox WHERE processed_at < now() - CAST(:older_than AS interval)
        LIMIT :limit FOR UPDATE SKIP LOCKED)
    """
)


async def purge(connection: AsyncConnection, older_than: timedelta, limit: int) -> int:
    """Delete up to `limit` rows that reached their terminal state more than `older_than` ago; return how many."""
    result = await connection.execute(_PURGE, {"older_than": older_than, "limit": limit})
    return int(result.rowcount)
