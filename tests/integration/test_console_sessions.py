"""Console sessions live in the database: a logout, an expiry or a removed token ends a session on every console
replica. Two console applications share one real PostgreSQL database, as two replicas behind a balancer do."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.console.sessions import COOKIE, session_id_hash
from tests.integration.test_console_security import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    _refused_with,
    seed,
    serving,
    session,
)


async def test_a_logged_out_cookie_opens_nothing_on_the_other_replica(engine: AsyncEngine, database_url: str) -> None:
    # Given two console replicas on one database, and an operator logged in on the first, whose session the second
    # accepts
    await seed(engine)
    async with serving(engine, database_url) as first, serving(engine, database_url) as second:
        csrf = await session(first.client, OPERATOR_TOKEN)
        cookie = first.client.cookies[COOKIE]
        assert await _refused_with(second, cookie) == (200, 200)

        # When the operator logs out on the first, and a copy of the cookie is presented to both
        first.client.cookies.set(COOKIE, cookie)
        logout = await first.client.post("/logout", data={"csrf": csrf})

        # Then the logout went to the login page, and the copied cookie is refused on either replica
        assert logout.status_code == 303
        assert await _refused_with(second, cookie) == (303, 401)
        assert await _refused_with(first, cookie) == (303, 401)
        # And the row says when it was revoked; no row holds the cookie's token itself
        async with engine.connect() as connection:
            rows = (await connection.execute(text("SELECT id_hash, revoked_at FROM console_sessions"))).all()
        assert [row.id_hash for row in rows] == [session_id_hash(cookie)]
        assert rows[0].revoked_at is not None
        assert cookie not in {row.id_hash for row in rows}


async def test_an_expired_session_is_refused_on_every_replica(engine: AsyncEngine, database_url: str) -> None:
    # Given a session opened on one replica
    await seed(engine)
    async with serving(engine, database_url) as first, serving(engine, database_url) as second:
        await session(first.client, VIEWER_TOKEN)
        cookie = first.client.cookies[COOKIE]

        # When its expiry passes
        async with engine.begin() as connection:
            await connection.execute(text("UPDATE console_sessions SET expires_at = now() - interval '1 second'"))

        # Then neither replica accepts it
        assert await _refused_with(first, cookie) == (303, 401)
        assert await _refused_with(second, cookie) == (303, 401)


async def test_a_token_removed_on_a_replica_ends_its_sessions_there(engine: AsyncEngine, database_url: str) -> None:
    # Given an operator's session opened on a replica with both tokens
    await seed(engine)
    async with serving(engine, database_url) as first:
        await session(first.client, OPERATOR_TOKEN)
        cookie = first.client.cookies[COOKIE]
        assert await _refused_with(first, cookie) == (200, 200)

        # When another replica runs with the operator's token removed from its configuration
        async with serving(engine, database_url, console_tokens=f"vic:viewer:{VIEWER_TOKEN}") as second:
            # Then that replica refuses the session, while the replica still configured with it accepts it
            assert await _refused_with(second, cookie) == (303, 401)
            assert await _refused_with(first, cookie) == (200, 200)


async def test_a_session_whose_operator_was_renamed_under_the_same_token_is_refused(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given an operator's session
    await seed(engine)
    async with serving(engine, database_url) as first:
        await session(first.client, OPERATOR_TOKEN)
        cookie = first.client.cookies[COOKIE]
    # When the row names another role than the configured token has (the configuration demoted it, say)
    async with engine.begin() as connection:
        await connection.execute(text("UPDATE console_sessions SET role = 'viewer'"))
    # Then the session is refused: its name and role must still be those of a configured token
    async with serving(engine, database_url) as again:
        assert await _refused_with(again, cookie) == (303, 401)
