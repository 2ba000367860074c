"""Console sessions in the database (contract §9), so that a login, a logout and an expiry hold on every replica."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# A request touches `last_seen_at` at most this often: a page's requests do not each write the row.
_SEEN_EVERY = timedelta(minutes=1)

_ISSUE = text(
    """
    INSERT INTO console_sessions (id_hash, operator, role, fingerprint, tokens_digest, expires_at)
    VALUES (:id_hash, :operator, :role, :fingerprint, :tokens_digest, now() + CAST(:ttl AS interval))
    """
)
# Live only: not revoked, not past its expiry, nor older than the reading console's own lifetime.
_LIVE = text(
    """
    SELECT operator, role, fingerprint, tokens_digest, last_seen_at < now() - CAST(:seen_every AS interval) AS stale
    FROM console_sessions
    WHERE id_hash = :id_hash AND revoked_at IS NULL AND expires_at > now()
      AND created_at > now() - CAST(:ttl AS interval)
    """
)
_SEEN = text("UPDATE console_sessions SET last_seen_at = now() WHERE id_hash = :id_hash")
_REVOKE = text("UPDATE console_sessions SET revoked_at = now() WHERE id_hash = :id_hash AND revoked_at IS NULL")


@dataclass(frozen=True)
class SessionRow:
    """Who a live session is for, and the token list it was opened under."""

    operator: str
    role: str
    fingerprint: str
    tokens_digest: str


async def issue(connection: AsyncConnection, id_hash: str, session: SessionRow, ttl: timedelta) -> None:
    """Open a session that ends `ttl` from now (database time, the same for every replica)."""
    await connection.execute(_ISSUE, {"id_hash": id_hash, **asdict(session), "ttl": ttl})


async def live(connection: AsyncConnection, id_hash: str, ttl: timedelta) -> SessionRow | None:
    """The live session of this hash (None: none, revoked or expired), its `last_seen_at` brought up to date."""
    row = (await connection.execute(_LIVE, {"id_hash": id_hash, "ttl": ttl, "seen_every": _SEEN_EVERY})).first()
    if row is None:
        return None
    if row.stale:
        await connection.execute(_SEEN, {"id_hash": id_hash})
    return SessionRow(row.operator, row.role, row.fingerprint, row.tokens_digest)


async def revoke(connection: AsyncConnection, id_hash: str) -> bool:
    """End a session (logout); False when it had ended already or never was."""
    return (await connection.execute(_REVOKE, {"id_hash": id_hash})).rowcount > 0
