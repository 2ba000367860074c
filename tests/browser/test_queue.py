"""The quarantine queue in a real browser: log in, filter, open a record, note it and reveal its payload
(audited, on the record's timeline) as an operator but not as a viewer; resolve ticked records after a dry run."""

from __future__ import annotations

import json
import re

from playwright.async_api import Page, expect
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.browser.support import LogIn, Screenshot, ServeConsole, by_code, csrf_of, seed_queue, seed_settings
from tests.support import rows, scalar


async def test_an_operator_filters_the_queue_opens_a_record_notes_it_and_reveals_its_payload(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    screenshot: Screenshot,
) -> None:
    # Given half a day of quarantined records of three codes and owners, and ann, an operator, logged in
    settings = seed_settings(console_settings)
    seeded = await seed_queue(settings)
    invalid = by_code(seeded, "INVALID_FIELD")
    url = await serve_console(settings)
    await log_in(page, url, operator_token)

    # Then the overview counts what is open by code and owner, past the oldest-open alert, charted over the day
    await expect(page.locator("#open-count")).to_have_text(str(len(seeded)))
    await expect(page.locator("#oldest-tile")).to_contain_text("past the 1h alert")
    await expect(page.locator("section h2 small").first).to_have_text(f"{len(seeded)} records")
    groups = page.locator("table tbody tr")
    await expect(groups).to_have_count(3)
    await expect(groups.filter(has_text="INVALID_FIELD")).to_contain_text(f"checkout-web {len(invalid)}")
    await screenshot(page, "overview")

    # When she opens the queue and narrows it to one code (htmx swaps the table and keeps the URL)
    await page.get_by_role("link", name="Quarantine", exact=True).click()
    await expect(page.locator("#total")).to_have_text(str(len(seeded)))
    await screenshot(page, "quarantine")
    await page.locator("form.filters select[name=error_code]").select_option("INVALID_FIELD")

    # Then only that code's records are listed, oldest first, and the address says what is shown
    await expect(page.locator("#total")).to_have_text(str(len(invalid)))
    await expect(page).to_have_url(re.compile(r"/quarantine\?.*error_code=INVALID_FIELD"))
    listed = page.locator("table.queue tbody tr td.id a")
    await expect(listed).to_have_text([one.failure_id for one in invalid])
    await screenshot(page, "quarantine-filtered")

    # When she opens the newest one: the record, its true timeline and the failing field, but not its payload
    record = invalid[-1]
    await listed.last.click()
    await expect(page.locator("h1")).to_have_text(record.failure_id)
    await expect(page.locator("#failing-field")).to_have_text("items.0.quantity: greater_than")
    timeline = page.locator("#timeline li strong")
    await expect(timeline).to_have_text(["failed", "quarantined"])
    order_id = json.loads(record.payload)["order_id"]
    await expect(page.locator("main")).not_to_contain_text(f"cust-{order_id.lower()}")

    # And notes what she found (a dry run first), then reveals the payload
    await page.locator("form[action='/actions/annotate'] input[name=note]").fill("producer sends quantity 0: INC-7")
    await page.locator("form[action='/actions/annotate'] button").click()
    await expect(page.locator("#preview-count")).to_have_text("1")
    await page.locator("#confirm").click()
    await expect(page.locator("#outcome")).to_have_text(f"{record.failure_id}: note added")
    await page.get_by_role("link", name="Back").click()
    await page.locator("#reveal").click()

    # Then the payload is shown as indented JSON text, and the reveal is on the timeline and in the audit
    body = page.locator("#payload-body")
    await expect(body).to_contain_text(f'"customer_id": "cust-{order_id.lower()}"')
    await expect(body).to_contain_text('"quantity": 0')
    await expect(timeline).to_have_text(["failed", "quarantined", "annotated", "payload revealed"])
    await expect(page.locator("#timeline li").last).to_contain_text("by ann: as text or hex")
    await screenshot(page, "record")
    await body.scroll_into_view_if_needed()
    await screenshot(page, "record-payload")
    audited = await rows(engine, "SELECT actor, action, selection, result FROM audit_log ORDER BY id")
    assert [(one["actor"], one["action"]) for one in audited] == [
        ("ann", "quarantine.annotate"),
        ("ann", "quarantine.reveal"),
    ]
    assert audited[1]["selection"] == {
        "consumer": settings.consumer_name,
        "failure_id": record.failure_id,
        "as": ["text or hex"],
        "via": "console",
    }
    assert audited[1]["result"] == {"revealed": True}
    events = await rows(
        engine,
        "SELECT event, actor, detail FROM quarantine_events WHERE failure_id = :id ORDER BY id",
        id=record.failure_id,
    )
    assert events[-2:] == [
        {"event": "annotated", "actor": "ann", "detail": "producer sends quantity 0: INC-7"},
        {"event": "payload revealed", "actor": "ann", "detail": "as text or hex"},
    ]


async def test_a_viewer_reads_a_record_but_cannot_reveal_its_payload_not_even_by_a_forged_post(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    viewer_token: str,
    screenshot: Screenshot,
) -> None:
    # Given a quarantined record, and vic, a viewer, logged in
    settings = seed_settings(console_settings)
    record = by_code(await seed_queue(settings), "MALFORMED_PAYLOAD")[0]
    url = await serve_console(settings)
    await log_in(page, url, viewer_token)

    # When she opens the record
    await page.goto(f"{url}/quarantine/{record.failure_id}")

    # Then she reads it, but is offered neither the reveal nor any action
    await expect(page.locator("h1")).to_have_text(record.failure_id)
    await expect(page.locator("#payload")).to_contain_text("Only operators reveal payloads.")
    await expect(page.locator("#reveal")).to_have_count(0)
    await expect(page.locator("form[action^='/actions/']")).to_have_count(0)
    await screenshot(page, "viewer-record")

    # And a reveal posted anyway, with her session's own CSRF token, is refused: nothing shown, nothing audited
    forged = await page.request.post(
        f"{url}/actions/reveal", form={"csrf": await csrf_of(page), "failure_id": record.failure_id}
    )
    assert forged.status == 403
    assert "vic is a viewer" in await forged.text()
    assert record.payload.decode() not in await forged.text()
    assert await scalar(engine, "SELECT count(*) FROM audit_log") == 0
    assert await scalar(engine, "SELECT count(*) FROM quarantine_events WHERE event = 'payload revealed'") == 0


async def test_resolving_ticked_records_shows_a_dry_run_and_changes_nothing_until_it_is_confirmed(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    screenshot: Screenshot,
) -> None:
    # Given the seeded queue, and ann, an operator, on the list of one code
    settings = seed_settings(console_settings)
    seeded = await seed_queue(settings)
    malformed = by_code(seeded, "MALFORMED_PAYLOAD")
    chosen = [one.failure_id for one in malformed[1:4]]
    url = await serve_console(settings)
    await log_in(page, url, operator_token)
    await page.goto(f"{url}/quarantine?error_code=MALFORMED_PAYLOAD")
    await expect(page.locator("#total")).to_have_text(str(len(malformed)))

    # When she ticks three of them and asks to resolve them with a reason
    for failure_id in chosen:
        await page.get_by_label(f"select {failure_id}", exact=True).check()
    await page.get_by_label("Note or reason").fill("producer fixed; resent as new orders (INC-12)")
    await page.get_by_role("button", name="Resolve…").click()

    # Then a dry run says what will happen: three records, which ones, and why; nothing has changed yet
    await expect(page.locator("h1")).to_have_text("Dry run: resolve")
    await expect(page.locator("#preview-count")).to_have_text("3")
    await expect(page.locator("ul.sample li")).to_have_text(chosen)
    await screenshot(page, "resolve-preview")
    assert await scalar(engine, "SELECT count(*) FROM quarantine WHERE status <> 'open'") == 0
    assert await scalar(engine, "SELECT count(*) FROM audit_log") == 0

    # When she confirms
    await page.locator("#confirm").click()

    # Then exactly those three are resolved, by her, with her reason, audited once; the rest stay open
    await expect(page.locator("#outcome li")).to_have_text([f"{one}: resolved" for one in chosen])
    resolved = await rows(
        engine, "SELECT failure_id, resolved_by, resolution FROM quarantine WHERE status = 'resolved' ORDER BY 1"
    )
    assert resolved == [
        {"failure_id": one, "resolved_by": "ann", "resolution": "producer fixed; resent as new orders (INC-12)"}
        for one in sorted(chosen)
    ]
    assert await scalar(engine, "SELECT count(*) FROM quarantine WHERE status = 'open'") == len(seeded) - 3
    [audited] = await rows(engine, "SELECT actor, action, selection, result FROM audit_log")
    assert (audited["actor"], audited["action"], audited["result"]) == ("ann", "quarantine.resolve", {"resolved": 3})
    assert audited["selection"]["picked"] == chosen
    assert audited["selection"]["reason"] == "producer fixed; resent as new orders (INC-12)"
    # And the list says so too
    await page.goto(f"{url}/quarantine?status=resolved")
    await expect(page.locator("table.queue tbody tr td.id a")).to_have_text(sorted(chosen, key=chosen.index))
