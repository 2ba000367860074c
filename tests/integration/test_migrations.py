"""The Alembic history and the SQLAlchemy models describe the same schema (like `alembic check`)."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders import tables as order_tables  # noqa: F401 (the domain's tables join the metadata)
from service.store.tables import metadata
from tests.support import rows


async def test_the_migrated_schema_has_no_difference_from_the_models(engine: AsyncEngine) -> None:
    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with engine.connect() as connection:
        differences = await connection.run_sync(diff)
    assert differences == []


async def test_the_contract_keys_and_constraints_exist(engine: AsyncEngine) -> None:
    constraints = await rows(
        engine,
        """
        SELECT conrelid::regclass::text AS table_name, contype, pg_get_constraintdef(oid) AS definition
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND contype IN ('p', 'u')
        ORDER BY 1
        """,
    )
    keys = {(c["table_name"], c["definition"]) for c in constraints}
    assert ("inbox", "PRIMARY KEY (consumer_name, message_id)") in keys
    assert ("orders", "PRIMARY KEY (order_id)") in keys
    assert ("outbox", "PRIMARY KEY (id)") in keys
    assert ("effects", "PRIMARY KEY (idempotency_key)") in keys
    assert ("quarantine", "PRIMARY KEY (failure_id)") in keys


def test_records_quarantined_before_0009_get_their_timeline_from_what_their_rows_say(database_url: str) -> None:
    # Given a database at 0008 holding a retried record that was annotated and then resolved
    import asyncio

    from alembic import command
    from sqlalchemy import text

    from service.store.schema import alembic_config, upgrade_to_head
    from tests.support import make_engine

    with alembic_config(database_url) as config:
        command.downgrade(config, "0008")

    async def given_then() -> list[dict[str, Any]]:
        engine = make_engine(database_url)
        try:
            async with engine.begin() as connection:
                await connection.execute(
                    text(
                        """
                        INSERT INTO quarantine (failure_id, consumer_name, message_id, error_code, status, owner,
                            envelope, attempts, first_failed_at, last_failed_at, created_at, resolved_by,
                            resolution, resolved_at)
                        VALUES ('o/0/1', 'c', 'm', 'RATE_LIMITED_EXHAUSTED', 'resolved', 'team', '{}', 4,
                            '2026-01-01T00:00:00Z', '2026-01-01T00:05:00Z', '2026-01-01T00:05:01Z', 'eve',
                            'done', '2026-01-02T00:00:00Z')
                        """
                    )
                )
                await connection.execute(
                    text(
                        "INSERT INTO quarantine_annotations (failure_id, author, note, created_at)"
                        " VALUES ('o/0/1', 'bob', 'seen', '2026-01-01T12:00:00Z')"
                    )
                )
            # When the schema goes to the head
            await asyncio.to_thread(upgrade_to_head, database_url)
            return await rows(engine, "SELECT event, error_code, attempts, actor FROM quarantine_events ORDER BY id")
        finally:
            await engine.dispose()

    events = asyncio.run(given_then())

    # Then its timeline is what its row said, in order
    assert [(e["event"], e["error_code"], e["attempts"], e["actor"]) for e in events] == [
        ("failed", None, 1, None),
        ("failed", "RATE_LIMITED_EXHAUSTED", 4, None),
        ("quarantined", "RATE_LIMITED_EXHAUSTED", 4, None),
        ("annotated", None, None, "bob"),
        ("resolved", None, None, "eve"),
    ]
