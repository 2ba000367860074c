"""A reprocess dry run lists each matched record once (contract §10): among those it would send, or among those it
skips because they no longer decode; the counts add up.

Real PostgreSQL and Kafka; the CLI runs as a process.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support import Topics, cli, quarantine_as, settings_for
from tests.support.orders import placed, quarantined_placement


async def test_a_dry_run_by_code_lists_each_record_either_as_selected_or_as_undecodable(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two records quarantined as INVALID_FIELD: one decodes with today's schemas, one still does not
    settings = settings_for(database_url, kafka, topics)
    failed_at = datetime.now(UTC) - timedelta(hours=1)
    sendable = quarantined_placement(f"{topics.source}/0/0", "R-1", failed_at, code="INVALID_FIELD")
    broken = dataclasses.replace(
        quarantined_placement(f"{topics.source}/0/1", "R-2", failed_at, code="INVALID_FIELD"),
        payload=json.dumps({**placed("R-2"), "currency": "euro"}).encode(),
    )
    await quarantine_as(engine, settings.consumer_name, [sendable, broken])

    # When an operator dry-runs reprocessing the code, as lines and as JSON
    command = ("reprocess", "--error-code", "INVALID_FIELD", "--reason", "look", "--dry-run")
    human = await cli(settings, *command)
    document = json.loads((await cli(settings, *command, "--json")).stdout)

    # Then each record is in exactly one list, and the counts add up
    selected = [line.split(": ", 1)[1] for line in human.stdout.splitlines() if line.startswith("  selected: ")]
    skipped = [line.split(": ", 1)[1] for line in human.stdout.splitlines() if line.startswith("  skipped ")]
    assert (selected, skipped) == ([sendable.failure_id], [broken.failure_id])
    assert "matched 2: selected 1, skipped as undecodable 1;" in human.stdout
    assert (document["selection"], document["undecodable"]) == ([sendable.failure_id], [broken.failure_id])
    assert document["selected"] == len(document["selection"]) + len(document["undecodable"])
