"""Short commands print their human output alone: logs at warning and above only, on stderr as JSON (README,
Commands); `migrate` says where the schema was and is in one line, without Alembic's own lines."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.codes import ErrorCode
from service.orders.domain import DOMAIN
from service.policy.delivery import RetryState
from service.policy.records import SourceRecord
from service.store import schema
from tests.support import Topics, cli, running, settings_for

PLACED = (
    b'{"schema": "order.placed.v1", "order_id": "Q-1", "tenant": "acme", "customer_id": "c-1",'
    b' "currency": "EUR", "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 100}]}'
)


def _log_lines(output: str) -> list[dict[str, Any]]:
    """The lines of `output` that are JSON log events."""
    found = []
    for line in output.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "level" in event:
            found.append(event)
    return found


async def test_a_reprocess_run_prints_its_report_without_a_log_line_among_it(
    database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a record quarantined after its retries, and no consumer to verify its reprocessing
    settings = settings_for(database_url, kafka, topics)
    async with running(settings) as container:
        processor = await container.processor()
        pending = processor.pending(SourceRecord(topics.source, 0, 0, 0, b"Q-1", PLACED))
        exhausted = RetryState(verdict=ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)
        assert len((await processor.attempt_round({pending: exhausted}, asyncio.Event())).left) == 1

    # When an operator reprocesses it
    finished = await cli(
        settings,
        *("reprocess", "--failure-id", f"{topics.source}/0/0", "--reason", "fixed", "--yes", "--verify-timeout", "1"),
        check=False,
    )

    # Then the report is on stdout, and no info log line is printed anywhere among it
    assert finished.returncode == 1, finished.stdout + finished.stderr  # unverified: no consumer runs
    assert "reprocess " in finished.stdout
    assert _log_lines(finished.stdout) == []
    assert [event for event in _log_lines(finished.stderr) if event["level"] in ("debug", "info")] == []


async def test_migrate_says_where_the_schema_was_and_is_in_one_line(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given an empty database, and the test's database, already migrated
    base_settings = settings_for(database_url, kafka, topics)
    head = schema.head_revision(DOMAIN.migrations)
    name = f"wtd_empty_{uuid.uuid4().hex[:10]}"
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    empty = base_settings.model_copy(
        update={"database_url": base_settings.database_url.get_secret_value().rsplit("/", 1)[0] + f"/{name}"}
    )
    try:
        # When both are migrated
        first = await cli(empty, "migrate")
        again = await cli(base_settings, "migrate")
    finally:
        async with engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    # Then each prints one line, and nothing on stderr (no Alembic plugin or upgrade lines)
    assert first.stdout.splitlines() == [f"migrated an empty database to the latest revision ({head})"]
    assert again.stdout.splitlines() == [f"database schema is at the latest revision ({head}): nothing to apply"]
    assert (first.stderr, again.stderr) == ("", "")
