"""The reconciler's passes: the lock that lets one pass run at a time, and one row per pass that finished."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

_TRY_LOCK = text("SELECT pg_try_advisory_lock(hashtext(:key))")
_UNLOCK = text("SELECT pg_advisory_unlock(hashtext(:key))")
_RECORD = text(
    """
    INSERT INTO reconcile_runs (started_at, finished_at, outcome, summary)
    VALUES (:started_at, :finished_at, :outcome, :summary)
    """
).bindparams(bindparam("summary", type_=JSONB))


async def try_lock(connection: AsyncConnection, key: str) -> bool:
    """Take the session-level advisory lock named `key` if no other session holds it; False when one does.

    Session-level, not transaction-level: held on this connection across the pass's own transactions, and
    released by PostgreSQL if the process dies.
    """
    return bool((await connection.execute(_TRY_LOCK, {"key": key})).scalar())


async def unlock(connection: AsyncConnection, key: str) -> None:
    """Release the session-level advisory lock `try_lock` took on this connection."""
    await connection.execute(_UNLOCK, {"key": key})


async def record(
    connection: AsyncConnection, started: datetime, finished: datetime, outcome: str, summary: dict[str, Any]
) -> None:
    """Log one pass: when it ran, `complete` or `partial`, and what it did."""
    await connection.execute(
        _RECORD, {"started_at": started, "finished_at": finished, "outcome": outcome, "summary": summary}
    )
