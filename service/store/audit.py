"""The operator audit: one append-only row per action or payload reveal, in the action's own transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.tables import audit_log


async def record(
    connection: AsyncConnection, actor: str, action: str, selection: dict[str, Any], result: dict[str, Any]
) -> None:
    """Append what `actor` did (`action`, e.g. `effects.retry`), to what, and what came of it."""
    await connection.execute(insert(audit_log).values(actor=actor, action=action, selection=selection, result=result))


async def recent(connection: AsyncConnection, *, action: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The latest audit rows, newest first, optionally of one action."""
    query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if action is not None:
        query = query.where(audit_log.c.action == action)
    return [dict(row._mapping) for row in await connection.execute(query)]
