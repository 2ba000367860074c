"""Edit and retry in a real browser: an operator corrects a quarantined record's payload, previews the diff and
the domain's verdict, and sends it; the record keeps its original bytes and lists the edit. With approvals on,
another operator approves it, and its author cannot."""

from __future__ import annotations

import json
import secrets

import pytest
from playwright.async_api import Page, expect
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.browser.support import (
    LogIn,
    NewPage,
    Screenshot,
    ServeConsole,
    by_code,
    csrf_of,
    seed_queue,
    seed_settings,
)
from tests.support import rows, scalar


async def test_an_operator_edits_a_payload_previews_the_diff_and_sends_it_once(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    screenshot: Screenshot,
) -> None:
    # Given a quarantined placement whose quantity is 0, and ann, an operator, logged in on its page
    settings = seed_settings(console_settings)
    record = by_code(await seed_queue(settings), "INVALID_FIELD")[-1]
    url = await serve_console(settings)
    await log_in(page, url, operator_token)
    await page.goto(f"{url}/quarantine/{record.failure_id}")

    # When she opens the edit form: the payload is in it (a reveal, audited)
    await page.locator("#edit").click()
    await expect(page.locator("h1")).to_have_text("Edit and retry")
    box = page.locator("#edit-payload")
    original = await box.input_value()
    assert '"quantity": 0' in original
    await box.fill(original.replace('"quantity": 0', '"quantity": 2'))
    await page.locator("#edit-set").fill("fixed-by=ann")
    await screenshot(page, "edit-form")

    # And previews it: the diff of the indented payload and the header, and the domain's verdict
    await page.locator("#edit-preview").click()
    diff = page.locator("#edit-diff")
    await expect(diff).to_contain_text('-      "quantity": 0,')
    await expect(diff).to_contain_text('+      "quantity": 2,')
    await expect(diff).to_contain_text('header fixed-by: added "ann"')
    await expect(page.locator("#edit-verdict")).to_have_text("Validation: valid")
    assert await scalar(engine, "SELECT count(*) FROM quarantine_edits") == 0  # a preview writes nothing
    await screenshot(page, "edit-preview")

    # And sends it
    await page.locator("#confirm").click()
    await expect(page.locator("#outcome")).to_contain_text("sent (once, under the original message id)")
    await screenshot(page, "edit-sent")

    # Then one copy waits in the outbox for the record's reprocess topic, under the original message id
    copies = await rows(engine, "SELECT topic, headers, payload FROM outbox WHERE topic LIKE '%.reprocess'")
    assert len(copies) == 1
    assert json.loads(copies[0]["payload"])["items"][0]["quantity"] == 2
    assert ["fixed-by", "ann"] in copies[0]["headers"]
    # And the record keeps its original bytes, lists the edit and has it on its timeline
    stored = await scalar(engine, "SELECT payload FROM quarantine WHERE failure_id = :f", f=record.failure_id)
    assert stored == record.payload
    await page.get_by_role("link", name="Back to the record").click()
    await expect(page.locator("#edits li")).to_have_count(1)
    await expect(page.locator("#edits .edit-state")).to_have_text("sent")
    await expect(page.locator("#timeline li strong")).to_contain_text(["payload revealed", "edited"])
    await screenshot(page, "edit-record")

    # And the edit's page shows the diff beside the original and the edited payload
    await page.locator("#edits a").click()
    await expect(page.locator("#edit-state")).to_have_text("sent")
    await expect(page.locator("#edited-payload")).to_contain_text('"quantity": 2')


@pytest.fixture
def reviewer_token() -> str:
    """The token of `bob`, a second operator (40 characters, random per test)."""
    return secrets.token_urlsafe(30)


@pytest.fixture
def console_tokens(operator_token: str, viewer_token: str, reviewer_token: str) -> str:
    """`ORDERS_CONSOLE_TOKENS` for ann and bob (operators) and vic (viewer)."""
    return f"ann:operator:{operator_token},vic:viewer:{viewer_token},bob:operator:{reviewer_token}"


async def test_with_approvals_on_another_operator_approves_an_edit_and_its_author_cannot(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    new_page: NewPage,
    log_in: LogIn,
    operator_token: str,
    reviewer_token: str,
) -> None:
    # Given approvals on, and ann's edit of a quarantined placement submitted
    settings = seed_settings(console_settings).model_copy(update={"console_edit_approval": True})
    record = by_code(await seed_queue(settings), "INVALID_FIELD")[-1]
    url = await serve_console(settings)
    await log_in(page, url, operator_token)
    await page.goto(f"{url}/quarantine/{record.failure_id}")
    await page.locator("#edit").click()
    box = page.locator("#edit-payload")
    await box.fill((await box.input_value()).replace('"quantity": 0', '"quantity": 3'))
    await page.locator("#edit-preview").click()
    await page.locator("#confirm").click()
    await expect(page.locator("#outcome")).to_contain_text("pending approval by another operator")
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE topic LIKE '%.reprocess'") == 0

    # When ann opens her edit: no approve button, and a forged approval is refused
    await page.get_by_role("link", name="The edit").click()
    await expect(page.locator("#edit-state")).to_have_text("pending approval")
    await expect(page.locator("#approve")).to_have_count(0)
    edit_id = await scalar(engine, "SELECT id FROM quarantine_edits")
    forged = await page.request.post(
        f"{url}/actions/decide-edit",
        form={"csrf": await csrf_of(page), "edit_id": str(edit_id), "decision": "approve"},
    )
    assert forged.status == 409
    assert "another operator approves it" in await forged.text()

    # And bob approves it on the same page
    bobs = await new_page()
    await log_in(bobs, url, reviewer_token)
    await bobs.goto(f"{url}/edits/{edit_id}")
    await bobs.locator("#approve").click()

    # Then it is sent once, approved by bob, audited
    await expect(bobs.locator("#outcome")).to_contain_text(f"edit {edit_id} of {record.failure_id}: sent by bob")
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE topic LIKE '%.reprocess'") == 1
    decided = await rows(engine, "SELECT actor, state, decided_by FROM quarantine_edits")
    assert decided == [{"actor": "ann", "state": "sent", "decided_by": "bob"}]
    actions = await rows(engine, "SELECT actor, action FROM audit_log WHERE action LIKE '%edit' ORDER BY id")
    assert actions == [
        {"actor": "ann", "action": "quarantine.edit"},
        {"actor": "bob", "action": "quarantine.approve_edit"},
    ]
    # And bob's reading of the edit's page (the record's bytes, the edited ones, the diff) is audited as a reveal
    reveals = await rows(engine, "SELECT selection FROM audit_log WHERE action = 'quarantine.reveal' AND actor = 'bob'")
    assert [row["selection"]["as"] for row in reveals] == [[f"edit {edit_id}"]]
