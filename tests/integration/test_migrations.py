"""The Alembic history and the SQLAlchemy models describe the same schema (like `alembic check`)."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

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
