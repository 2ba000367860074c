"""A record's trace on the console: the record page shows the envelope's `traceId` as a fact and, with
`ORDERS_CONSOLE_TRACE_URL` set, links it (a new tab, no opener, no referrer); the API document carries `trace_id` and
`trace_url`. Only a W3C trace id (32 lowercase hex digits) is ever put in a link: anything else is shown inert.

Real PostgreSQL (a fresh migrated database per test), the console application in this process driven by httpx.
"""

from __future__ import annotations

from typing import Any

import pytest
from markupsafe import escape
from sqlalchemy.ext.asyncio import AsyncEngine

from service.inert import shown
from service.store import quarantine
from tests.integration.test_console_security import OPERATOR_TOKEN, add, bearer, quarantined, serving, session

FAILURE_ID = "orders/0/5"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE_URL = "http://jaeger.internal:16686/trace/{trace_id}"
LINK = f'<a href="http://jaeger.internal:16686/trace/{TRACE_ID}" target="_blank" rel="noopener noreferrer">'


async def traced(engine: AsyncEngine, trace_id: str) -> None:
    """A quarantined record whose envelope holds this trace id."""
    record = quarantined(FAILURE_ID)
    envelope = {**record.envelope, "traceId": trace_id}
    await add(engine, [quarantine.QuarantineRow(**{**record.__dict__, "envelope": envelope})])


async def page_and_document(engine: AsyncEngine, database_url: str, **overrides: Any) -> tuple[str, dict[str, Any]]:
    """The record's page as an operator sees it, and its API document."""
    async with serving(engine, database_url, **overrides) as console:
        await session(console.client, OPERATOR_TOKEN)
        page = await console.client.get(f"/quarantine/{FAILURE_ID}")
        api = await console.client.get(f"/api/quarantine/{FAILURE_ID}", headers=bearer(OPERATOR_TOKEN))
    assert (page.status_code, api.status_code) == (200, 200), (page.text[:300], api.text[:300])
    return page.text, api.json()


async def test_a_trace_id_is_shown_and_linked_to_its_trace_when_a_trace_url_is_set(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given a record whose envelope holds a W3C trace id
    await traced(engine, TRACE_ID)

    # When an operator opens it on a console with a trace URL, and on one without
    linked, linked_document = await page_and_document(engine, database_url, console_trace_url=TRACE_URL)
    plain, plain_document = await page_and_document(engine, database_url)

    # Then both show the id; only the first links it, opening a new tab with no opener and no referrer
    assert f"{LINK}{TRACE_ID}</a>" in linked
    assert linked_document["trace_id"] == TRACE_ID
    assert linked_document["trace_url"] == f"http://jaeger.internal:16686/trace/{TRACE_ID}"
    assert f'<dd class="id" id="trace">{TRACE_ID}</dd>' in plain
    assert "jaeger" not in plain
    assert (plain_document["trace_id"], plain_document["trace_url"]) == (TRACE_ID, None)


@pytest.mark.parametrize(
    "hostile",
    [
        '"><script>alert(1)</script>',
        TRACE_ID + "0",  # 33 characters
        TRACE_ID.upper(),
        f"{TRACE_ID[:16]}\u202e{TRACE_ID[17:]}",
        "javascript:alert(1)",
    ],
)
async def test_a_trace_id_that_is_not_32_lowercase_hex_digits_is_shown_inert_and_never_linked(
    engine: AsyncEngine, database_url: str, hostile: str
) -> None:
    # Given a record whose envelope holds something else as its trace id
    await traced(engine, hostile)

    # When an operator opens it on a console with a trace URL
    page, document = await page_and_document(engine, database_url, console_trace_url=TRACE_URL)

    # Then the page shows it as escaped, visible text, and links nothing; the API keeps the exact value, unlinked
    assert f'<dd class="id" id="trace">{escape(shown(hostile))}</dd>' in page
    assert "jaeger" not in page
    assert "<script>alert" not in page
    assert (document["trace_id"], document["trace_url"]) == (hostile, None)
