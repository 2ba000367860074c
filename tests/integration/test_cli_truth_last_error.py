"""An effect's last error is the one it really had (contract §10): the stored one, whatever the configuration of
the machine that shows it; a CLI and a console without the provider URLs (an operator's machine) show the same.

Real PostgreSQL; the CLI runs as a process, the console in this process (tests/integration/test_console_security.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.conftest import KAFKA
from tests.integration.test_console_security import OPERATOR_TOKEN, Console, serving, session
from tests.support import Topics, cli, settings_for

# (key, state, attempts, stored last error)
EFFECTS = (
    ("S-1/payment.capture", "sent", 1, None),
    ("S-2/payment.capture", "sent", 3, None),
    ("F-1/payment.capture", "failed", 5, "PROVIDER_REJECTED"),
    ("U-1/email.shipped", "uncertain", 1, "OUTCOME_UNKNOWN"),
    ("P-1/payment.capture", "pending", 2, "DOWNSTREAM_5XX"),
)


@pytest.fixture
async def ledger(engine: AsyncEngine) -> AsyncEngine:
    async with engine.begin() as connection:
        for key, state, attempts, code in EFFECTS:
            await connection.execute(
                text(
                    "INSERT INTO effects"
                    " (idempotency_key, aggregate_id, kind, state, payload, attempts, last_error_code)"
                    " VALUES (:key, split_part(:key, '/', 1), split_part(:key, '/', 2), :state, '{}', :attempts, :code)"
                ),
                {"key": key, "state": state, "attempts": attempts, "code": code},
            )
    return engine


@pytest.fixture
def settings(database_url: str) -> Settings:
    """A CLI's settings without any provider URL, as on an operator's machine."""
    found = settings_for(database_url, KAFKA, Topics("lasterr"))
    assert (found.payments_url, found.emails_url) == (None, None)
    return found


@pytest.fixture
async def console(ledger: AsyncEngine, database_url: str) -> AsyncIterator[Console]:
    async with serving(ledger, database_url) as served:
        assert served.settings.payments_url is None
        yield served


async def test_the_cli_without_provider_urls_shows_each_effects_stored_last_error(
    ledger: AsyncEngine, settings: Settings
) -> None:
    # When an operator lists every effect, piped, from a machine without the provider URLs
    listed = await cli(
        settings, "effects", "list", *(f"--state={state}" for state in ("sent", "failed", "uncertain", "pending"))
    )

    # Then each row's last error is the stored one, and a sent effect has none
    shown = {line.split("\t")[0]: line.split("\t")[4] for line in listed.stdout.splitlines()[1:]}
    assert shown == {key: code or "" for key, _, _, code in EFFECTS}
    assert "not configured" not in listed.stdout


async def test_the_consoles_effects_pages_show_each_effects_stored_last_error(console: Console) -> None:
    # Given an operator's session on a console without the provider URLs
    await session(console.client, OPERATOR_TOKEN)

    # When the effects page lists every state, and a sent effect's page is shown
    listed = await console.client.get(
        "/effects", params=[("state", state) for state in ("sent", "failed", "uncertain", "pending")]
    )
    sent = await console.client.get("/effects/S-1/payment.capture")

    # Then no row says a provider is not configured, each stored error is there, and the sent one has none
    assert listed.status_code == sent.status_code == 200
    assert "not configured" not in listed.text
    for _, _, _, code in EFFECTS:
        if code:
            assert code in listed.text
    assert "<dt>Last error</dt><dd>-</dd>" in sent.text
    assert "not configured" not in sent.text
