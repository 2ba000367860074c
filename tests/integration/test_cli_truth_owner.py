"""The CLI has the console's owner filter (contract §10): `--owner` on `quarantine list` and `stats`, on the bulk
selections and on a reprocess selection, meaning what the console's `owner` means (the records routed to that
owner, exactly).

Real PostgreSQL; the CLI runs as a process, the console in this process (tests/integration/test_console_security.py).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.conftest import KAFKA
from tests.integration.test_console_security import OPERATOR_TOKEN, bearer, serving
from tests.support import Topics, cli, quarantine_as, rows, settings_for
from tests.support.orders import quarantined_placement

CONSUMER = "owners-consumer"
SOURCE = "owners.src"
# failure id → owner and code
RECORDS = {
    f"{SOURCE}/0/0": ("billing", "INVALID_FIELD"),
    f"{SOURCE}/0/1": ("orders", "INVALID_FIELD"),
    f"{SOURCE}/0/2": ("billing", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"),
    f"{SOURCE}/0/3": ("orders", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"),
}
BILLING = [one for one, (owner, _) in RECORDS.items() if owner == "billing"]


@pytest.fixture
async def settings(engine: AsyncEngine, database_url: str) -> Settings:
    """A CLI's settings, on a database holding two owners' records (each decodes with today's schemas)."""
    failed_at = datetime.now(UTC) - timedelta(hours=1)
    await quarantine_as(
        engine,
        CONSUMER,
        [
            dataclasses.replace(
                quarantined_placement(failure_id, f"O-{n}", failed_at + timedelta(seconds=n), code=code), owner=owner
            )
            for n, (failure_id, (owner, code)) in enumerate(RECORDS.items())
        ],
    )
    return settings_for(database_url, KAFKA, Topics("owners"), consumer_name=CONSUMER, source_topic=SOURCE)


async def test_list_and_stats_by_owner_are_what_the_consoles_api_answers_for_that_owner(
    engine: AsyncEngine, database_url: str, settings: Settings
) -> None:
    # When an operator lists and counts one owner's records with the CLI and asks the console's API the same
    listed = json.loads((await cli(settings, "quarantine", "list", "--owner", "billing", "--json")).stdout)
    counted = json.loads((await cli(settings, "quarantine", "stats", "--owner", "billing", "--json")).stdout)
    async with serving(engine, database_url) as console:
        api_list = (await console.client.get("/api/quarantine?owner=billing", headers=bearer(OPERATOR_TOKEN))).json()
        api_stats = (await console.client.get("/api/stats?owner=billing", headers=bearer(OPERATOR_TOKEN))).json()

    # Then both hold exactly that owner's records, the same ones
    assert [row["failure_id"] for row in listed] == BILLING
    assert [row["failure_id"] for row in api_list["items"]] == BILLING
    assert {group["owner"] for group in counted["by_code"]} == {"billing"}
    assert counted["open"] == len(BILLING)
    assert {k: v for k, v in counted.items() if k != "oldest_open_age_seconds"} == {
        k: v for k, v in api_stats.items() if k != "oldest_open_age_seconds"
    }


async def test_a_bulk_resolve_by_owner_selects_and_resolves_only_that_owners_records(
    engine: AsyncEngine, settings: Settings
) -> None:
    # When an operator dry-runs, then runs, resolving one owner's open records
    select = ("quarantine", "resolve", "--owner", "billing", "--reason", "billing fixed it")
    dry = await cli(settings, *select, "--dry-run")
    done = await cli(settings, *select, "--yes")

    # Then exactly that owner's records were counted, then resolved, and the audit keeps the owner
    assert dry.stdout.strip() == f"quarantine resolve: {len(BILLING)} records selected: {', '.join(BILLING)}"
    assert done.stdout.split() == [word for one in BILLING for word in (f"{one}:", "resolved")]
    statuses = await rows(engine, "SELECT failure_id, status FROM quarantine ORDER BY failure_id")
    assert {row["failure_id"] for row in statuses if row["status"] == "resolved"} == set(BILLING)
    [audit] = await rows(engine, "SELECT selection FROM audit_log")
    assert audit["selection"]["owner"] == "billing"


async def test_a_reprocess_dry_run_by_owner_and_code_selects_only_that_owners_records(settings: Settings) -> None:
    # When an operator dry-runs reprocessing one owner's records of one code
    dry = await cli(
        settings, "reprocess", "--owner", "billing", "--error-code", "INVALID_FIELD", "--reason", "r", "--dry-run"
    )

    # Then only that owner's record of that code is selected
    selected = [line.split(": ", 1)[1] for line in dry.stdout.splitlines() if line.startswith("  selected: ")]
    assert selected == [f"{SOURCE}/0/0"]
