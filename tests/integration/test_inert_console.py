"""Record content is inert on every console page and in the console's JSON API: keys, message ids, header names
and values, envelope values and notes holding control characters, bidi overrides and escape sequences reach the
list, the record page (facts, headers, envelope, timeline, notes, revealed payload) and the API only as escapes,
and the API's JSON decodes back to the exact values.

Real PostgreSQL (a fresh migrated database per test), the console application in this process driven by httpx.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import quarantine
from tests.integration.test_console_security import (
    CONSUMER,
    OPERATOR_TOKEN,
    Console,
    add,
    bearer,
    quarantined,
    serving,
    session,
)

BIDI = [chr(c) for c in (0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
CONTROLS = [chr(c) for c in (*range(1, 0x20), 0x7F, *range(0x80, 0xA0))]  # PostgreSQL text holds no NUL
SEQUENCES = ["\x1b]52;c;aGVsbG8=\x07", "\x1b[2J", "\x1b]0;owned\x1b\\", "\u202eevil", "Zürich"]
# Form fields carry a value back exactly as the record holds it (a key to release): not shown, so not checked.
FORM_VALUE = re.compile(r'value="[^"]*"')

hostile = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_characters="\x00"), max_size=6),
            st.sampled_from(SEQUENCES),
            st.sampled_from(BIDI + CONTROLS),
        ),
        min_size=1,
        max_size=6,
    )
    .map("".join)
    .filter(lambda text: text.strip() != "")
)
offsets = itertools.count()


def dangerous(page: str) -> list[str]:
    """The characters of a page, outside form values, that a browser would act on or that would hide text."""
    shown = FORM_VALUE.sub("", page)
    return sorted({f"U+{ord(char):04X}" for char in shown if (char in CONTROLS and char not in "\n\t") or char in BIDI})


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(key=hostile, message_id=hostile, header=hostile, value=hostile, note=hostile)
async def test_hostile_record_content_reaches_pages_only_as_escapes_and_the_api_keeps_exact_values(
    engine: AsyncEngine, database_url: str, key: str, message_id: str, header: str, value: str, note: str
) -> None:
    # Given a record whose key, message id, headers, envelope, payload and note hold hostile text
    failure_id = f"orders/0/{next(offsets)}"
    record = quarantined(failure_id, key=key, payload=value.encode())
    record = quarantine.QuarantineRow(
        **{
            **record.__dict__,
            "message_id": message_id,
            "source_headers": [[header, value], ["sent-at", "1785000000000"]],
            "envelope": {"failureId": failure_id, "key": key, "note": value},
        }
    )
    await add(engine, [record])
    async with engine.begin() as connection:
        await quarantine.annotate(connection, quarantine.RecordKey(CONSUMER, failure_id), "ann", note)

    async with serving(engine, database_url) as console:
        csrf = await session(console.client, OPERATOR_TOKEN)

        # When an operator opens the list, the record page, reveals its payload, and a tool reads the API
        pages = await _pages(console, failure_id, csrf)
        api = await console.client.get(f"/api/quarantine/{quote(failure_id)}", headers=bearer(OPERATOR_TOKEN))

    # Then no page holds a raw control or bidi character outside a form's value
    for name, page in pages.items():
        assert dangerous(page) == [], name

    # And the API's JSON holds them only as escapes, and reads back to the exact values
    assert api.status_code == 200
    assert dangerous(api.text) == []
    document: dict[str, Any] = api.json()
    assert (document["ordering_key"], document["message_id"]) == (key, message_id)
    assert document["source_headers"][0] == [header, value]
    assert document["envelope"]["note"] == value
    assert [one["note"] for one in document["annotations"]] == [note]


async def _pages(console: Console, failure_id: str, csrf: str) -> dict[str, str]:
    """The list, the record page, and the record page with its payload revealed, as HTML."""
    listed = await console.client.get("/quarantine")
    shown = await console.client.get(f"/quarantine/{quote(failure_id)}", params={"consumer": CONSUMER})
    revealed = await console.client.post(
        "/actions/reveal",
        data={"csrf": csrf, "failure_id": failure_id, "consumer": CONSUMER},
    )
    for response in (listed, shown, revealed):
        assert response.status_code == 200, response.text[:500]
    return {"the list": listed.text, "the record": shown.text, "the revealed record": revealed.text}


async def test_a_header_of_epoch_milliseconds_is_shown_with_its_utc_time_on_the_record_page(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given a record with a header holding epoch milliseconds
    record = quarantined("orders/0/1")
    record = quarantine.QuarantineRow(**{**record.__dict__, "source_headers": [["sent-at", "1785000000000"]]})
    await add(engine, [record])

    # When an operator opens its page
    async with serving(engine, database_url) as console:
        await session(console.client, OPERATOR_TOKEN)
        page = (await console.client.get("/quarantine/orders/0/1")).text

    # Then the raw value is there, and next to it the time it names
    moment = datetime.fromtimestamp(1_785_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f'1785000000000 <span class="when">({moment})</span>' in page
