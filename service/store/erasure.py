"""Erasure (docs/runbook.md, Retention and erasure): a quarantined record's original bytes and header values are
removed on request (a data subject's key, say); the row's facts stay, marked erased, with an event in its timeline."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.quarantine import RecordKey
from service.store.retention import erase_records

_OF_KEY = text(
    """
    SELECT consumer_name, failure_id FROM quarantine
    WHERE ordering_key = :key AND (CAST(:consumer AS text) IS NULL OR consumer_name = :consumer)
    ORDER BY first_failed_at, failure_id
    """
)
_ALREADY = text(
    """
    SELECT failure_id FROM quarantine
    WHERE consumer_name = :consumer AND failure_id = ANY(CAST(:failure_ids AS text[])) AND erased_at IS NOT NULL
    """
)
_IS_ERASED = text(
    "SELECT erased_at IS NOT NULL FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id"
)
_ERASE = text(
    erase_records(
        """SELECT consumer_name, failure_id FROM quarantine
           WHERE consumer_name = :consumer AND failure_id = ANY(CAST(:failure_ids AS text[])) AND erased_at IS NULL
           FOR UPDATE"""
    )
)


async def of_key(connection: AsyncConnection, key: str, consumer: str | None) -> list[RecordKey]:
    """Every record of this ordering key, whatever its status (of one consumer when it is named), oldest first."""
    found = await connection.execute(_OF_KEY, {"key": key, "consumer": consumer})
    return [RecordKey(row.consumer_name, row.failure_id) for row in found]


async def already_erased(connection: AsyncConnection, consumer: str, failure_ids: list[str]) -> set[str]:
    """Which of these records of `consumer` were erased already."""
    found = await connection.execute(_ALREADY, {"consumer": consumer, "failure_ids": failure_ids})
    return {row.failure_id for row in found}


async def erase(connection: AsyncConnection, consumer: str, failure_ids: list[str], actor: str) -> list[str]:
    """Remove the bytes and header values of these records of `consumer` not erased yet; the ones erased now."""
    found = await connection.execute(_ERASE, {"consumer": consumer, "failure_ids": failure_ids, "actor": actor})
    return [row.failure_id for row in found]


async def is_erased(connection: AsyncConnection, record: RecordKey) -> bool:
    """Whether this record's bytes were removed."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    return bool((await connection.execute(_IS_ERASED, params)).scalar())
