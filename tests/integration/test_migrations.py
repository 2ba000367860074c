"""The Alembic history and the SQLAlchemy models describe the same schema (like `alembic check`)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.errors import SchemaNotCurrent
from service.orders import tables as order_tables  # noqa: F401 (the domain's tables join the metadata)
from service.orders.domain import DOMAIN
from service.store import schema
from service.store.tables import metadata
from tests.support import rows

MIGRATIONS = DOMAIN.migrations


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
    assert ("quarantine", "PRIMARY KEY (consumer_name, failure_id)") in keys


def test_records_quarantined_before_0009_get_their_timeline_from_what_their_rows_say(database_url: str) -> None:
    # Given a database at 0008 holding a retried record that was annotated and then resolved
    import asyncio

    from alembic import command

    from service.store.schema import alembic_config, upgrade_to_head
    from tests.support import make_engine

    with alembic_config(database_url, DOMAIN.migrations) as config:
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
            await asyncio.to_thread(upgrade_to_head, database_url, DOMAIN.migrations)
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


def test_records_quarantined_before_0015_keep_their_rows_and_history_under_their_consumer(database_url: str) -> None:
    # Given a database at 0014 holding a quarantined record, annotated and sent back by a reprocess run
    import asyncio

    from alembic import command

    from service.store import quarantine
    from service.store.schema import alembic_config, upgrade_to_head
    from tests.support import make_engine

    with alembic_config(database_url, DOMAIN.migrations) as config:
        command.downgrade(config, "0014")

    async def given(engine: Any) -> None:
        async with engine.begin() as connection:
            for statement in (
                """
                INSERT INTO quarantine (failure_id, consumer_name, message_id, error_code, owner, envelope, attempts,
                    first_failed_at, last_failed_at)
                VALUES ('o/0/1', 'billing', 'm', 'MALFORMED_PAYLOAD', 'team', '{}', 1, now(), now())
                """,
                "INSERT INTO quarantine_annotations (failure_id, author, note) VALUES ('o/0/1', 'bob', 'seen')",
                "INSERT INTO reprocess_runs (id, actor, reason, selection, options, outcome)"
                " VALUES ('rp-1', 'eve', 'why', '{}', '{}', 'completed')",
                "INSERT INTO reprocess_items (run_id, failure_id, message_id, stage, attempt, outcome, published_at)"
                " VALUES ('rp-1', 'o/0/1', 'm', 'main', 1, 'published', now())",
            ):
                await connection.execute(text(statement))

    async def when_then() -> tuple[list[Any], ...]:
        engine = make_engine(database_url)
        try:
            await given(engine)
            # When the schema goes to the head
            await asyncio.to_thread(upgrade_to_head, database_url, DOMAIN.migrations)
            # And a second consumer name reading the same topic quarantines the same record
            row = quarantine.QuarantineRow(
                "o/0/1", "m", "MALFORMED_PAYLOAD", "team", None, {}, None, [], 1, datetime.now(UTC), datetime.now(UTC)
            )
            async with engine.begin() as connection:
                await connection.execute(
                    text(quarantine.ADD_ROWS),
                    {"consumer": "shipping", "quarantine_rows": quarantine.COLUMNS.encode([row])},
                )
            return (
                await rows(engine, "SELECT consumer_name, failure_id FROM quarantine ORDER BY 1"),
                await rows(engine, "SELECT DISTINCT consumer_name, event FROM quarantine_events ORDER BY 1, 2"),
                await rows(engine, "SELECT consumer_name, note FROM quarantine_annotations"),
                await rows(engine, "SELECT consumer_name, failure_id FROM reprocess_items"),
            )
        finally:
            await engine.dispose()

    records, events, notes, items = asyncio.run(when_then())

    # Then the first record, its note, its reprocess item and its timeline are kept under its consumer, and the
    # second consumer has a record of its own beside it
    assert records == [
        {"consumer_name": "billing", "failure_id": "o/0/1"},
        {"consumer_name": "shipping", "failure_id": "o/0/1"},
    ]
    assert [(e["consumer_name"], e["event"]) for e in events] == [
        ("billing", "annotated"),
        ("billing", "failed"),
        ("billing", "quarantined"),
        ("billing", "reprocess sent"),
        ("shipping", "failed"),
        ("shipping", "quarantined"),
    ]
    assert notes == [{"consumer_name": "billing", "note": "seen"}]
    assert items == [{"consumer_name": "billing", "failure_id": "o/0/1"}]
    # And going back to 0014, which cannot hold both, is refused, naming the failure id, with nothing changed
    with (
        alembic_config(database_url, DOMAIN.migrations) as config,
        pytest.raises(RuntimeError, match=r"several consumer names.*o/0/1"),
    ):
        command.downgrade(config, "0014")
    asyncio.run(schema.require_head(database_url, DOMAIN.migrations))


def test_a_current_schema_is_checked_without_importing_alembic(database_url: str) -> None:
    # Given a migrated database, when a fresh interpreter checks it as a starting command does
    script = (
        "import asyncio, sys\n"
        "from service.orders.domain import DOMAIN\n"
        "from service.store import schema\n"
        "asyncio.run(schema.require_head(sys.argv[1], DOMAIN.migrations))\n"
        "print('alembic' in sys.modules)\n"
    )
    checked = subprocess.run(
        [sys.executable, "-c", script, database_url], capture_output=True, text=True, timeout=120, check=False
    )

    # Then the schema is current, and Alembic (slow to import) was never imported
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "False"


@pytest.mark.parametrize("recorded", ["0013", "9999"], ids=["older", "unknown"])
async def test_a_version_table_other_than_the_heads_is_not_current(
    engine: AsyncEngine, database_url: str, recorded: str
) -> None:
    # Given a version table that names an older revision, or one this version does not know
    async with engine.begin() as connection:
        # (one row for the whole table: a migrated database holds one per head that no other head depends on)
        await connection.execute(text("DELETE FROM alembic_version"))
        await connection.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": recorded})

    # Then the check says where it is, what this version needs, and what to run
    needs = schema.head_revision(DOMAIN.migrations)
    with pytest.raises(SchemaNotCurrent, match=rf"is at {recorded}, this version needs {needs}: run"):
        await schema.require_head(database_url, DOMAIN.migrations)
