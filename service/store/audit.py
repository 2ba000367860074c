"""The operator audit: one append-only row per action or payload reveal, in the action's own transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

_RECORD = text(
    """
    INSERT INTO audit_log (actor, action, selection, result)
    VALUES (:actor, :action, :selection, :result)
    """
).bindparams(bindparam("selection", type_=JSONB), bindparam("result", type_=JSONB))
_RECENT = text(
    """
    SELECT id, at, actor, action, selection, result FROM audit_log
    WHERE CAST(:action AS text) IS NULL OR action = :action
    ORDER BY id DESC LIMIT :limit
    """
)


async def record(
    connection: AsyncConnection, actor: str, action: str, selection: dict[str, Any], result: dict[str, Any]
) -> None:
    """Append what `actor` did (`action`, e.g. `effects.retry`), to what, and what came of it."""
    await connection.execute(_RECORD, {"actor": actor, "action": action, "selection": selection, "result": result})


async def recent(connection: AsyncConnection, *, action: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The latest audit rows, newest first, optionally of one action."""
    return [dict(row._mapping) for row in await connection.execute(_RECENT, {"action": action, "limit": limit})]
