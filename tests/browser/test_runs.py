"""Actions that need the whole pipeline, in a real browser: a reprocess run watched until it is verified, and a
held key released, each against a consumer loop and the relay running in-process on the local Kafka broker."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.async_api import Page, expect
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.browser.support import LogIn, Screenshot, ServeConsole
from tests.support import Topics, eventually, produce, rows, running, scalar
from tests.support import settings_for as base_settings
from tests.support.orders import placed, shipped

pytestmark = pytest.mark.kafka

RUN_DEADLINE_MS = 60_000  # a run of two records is verified in a few seconds; this is the limit, not the wait


def settings_for(
    database_url: str, kafka: str, topics: Topics, downstream: Downstream, console_tokens: str, **extra: Any
) -> Settings:
    """A consumer of `topics` whose customer directory is `downstream`, with a short retry budget, and the
    console's tokens."""
    values: dict[str, Any] = {
        "customers_url": downstream.url,
        "retry_tiers": "",
        "blocking_attempts": 2,
        "blocking_elapsed": "2s",
        "max_attempts": 2,
        "max_elapsed": "2s",
        "console_tokens": console_tokens,
    }
    return base_settings(database_url, kafka, topics, **(values | extra))


async def test_an_operator_reprocesses_two_records_and_watches_the_run_finish_verified(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    console_tokens: str,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    screenshot: Screenshot,
) -> None:
    # Given three orders quarantined while their customer directory was down, and the directory back up
    settings = settings_for(database_url, kafka, topics, downstream, console_tokens)
    for number in range(3):
        downstream.fail_next("customers.get", times=1000, status=503, key=f"c-q{number}")
    orders = [(f"Q-{k}", placed(f"Q-{k}", customer=f"c-q{k}"), {"message-id": f"Q-{k}.1/placed"}) for k in range(3)]
    await produce(kafka, topics.source, orders, partition=0)
    chosen = [f"{topics.source}/0/0", f"{topics.source}/0/1"]
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM quarantine"), timeout=60)
        downstream.clear_faults()
        url = await serve_console(settings)
        await log_in(page, url, operator_token)

        # When ann ticks two of them in the queue and asks to reprocess them
        await page.goto(f"{url}/quarantine?status=open")
        await expect(page.locator("#total")).to_have_text("3")
        for failure_id in chosen:
            await page.get_by_label(f"select {failure_id}", exact=True).check()
        await page.get_by_label("Note or reason").fill("customer directory is back (INC-31)")
        await page.get_by_role("button", name="Reprocess…").click()

        # Then a dry run says what will be sent, where, and how fast; no run exists yet
        await expect(page.locator("h1")).to_have_text("Dry run: reprocess")
        await expect(page.locator("#preview-count")).to_have_text("2")
        await expect(page.locator("ul.sample li")).to_have_text(chosen)
        await expect(page.locator("#preview dl")).to_contain_text(topics.reprocess)
        await screenshot(page, "reprocess-preview")
        assert await scalar(engine, "SELECT count(*) FROM reprocess_runs") == 0

        # When she confirms, she lands on the run's page, which refreshes itself until the run is verified
        await page.locator("#confirm").click()
        await expect(page).to_have_url(re.compile(r"/runs/[^/]+$"))
        run = page.locator("#run")
        await expect(run).to_have_attribute("data-outcome", "completed", timeout=RUN_DEADLINE_MS)

        # Then each record was reprocessed and verified by its business state
        await expect(page.locator("#run-progress")).to_have_text("2 sent, 2 verified")
        await expect(run.locator("tbody tr td:nth-child(5)")).to_have_text(["reprocessed", "reprocessed"])
        await expect(run.locator(".live")).to_have_count(0)
        await screenshot(page, "run")
        run_id = page.url.rsplit("/", 1)[1]
        [audited] = await rows(engine, "SELECT id, actor, reason, outcome, counts FROM reprocess_runs")
        assert (audited["id"], audited["actor"], audited["reason"], audited["outcome"]) == (
            run_id,
            "ann",
            "customer directory is back (INC-31)",
            "completed",
        )
        assert audited["counts"]["reprocessed"] == 2
        assert await rows(engine, "SELECT failure_id, status FROM quarantine ORDER BY 1") == [
            {"failure_id": chosen[0], "status": "reprocessed"},
            {"failure_id": chosen[1], "status": "reprocessed"},
            {"failure_id": f"{topics.source}/0/2", "status": "open"},
        ]
        assert await rows(engine, "SELECT order_id FROM orders ORDER BY 1") == [
            {"order_id": "Q-0"},
            {"order_id": "Q-1"},
        ]

        # And the two accepted orders' effects wait in the ledger, shown on the effects page
        await page.get_by_role("link", name="Effects", exact=True).click()
        waiting = await scalar(engine, "SELECT count(*) FROM effects WHERE state <> 'sent'")
        assert waiting == 2
        await expect(page.locator("p.count")).to_have_text(f"{waiting} of {waiting} shown")
        for key in await rows(engine, "SELECT idempotency_key FROM effects"):
            effect = page.locator("table tbody tr").filter(has_text=key["idempotency_key"])
            await expect(effect).to_contain_text("pending")
            await expect(effect).to_contain_text("provider not configured")
        await screenshot(page, "effects")


async def test_an_operator_releases_a_held_key_and_the_consumer_applies_what_was_parked_behind_it(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    console_tokens: str,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    operator_token: str,
    screenshot: Screenshot,
) -> None:
    # Given K's placement quarantined from the last retry tier (its customer directory down), holding K, with
    # K's shipment parked behind it (key ordering)
    downstream.fail_next("customers.get", times=1000, status=503, key="c-k")
    records = [("K", placed("K", customer="c-k"), {"message-id": "K.1"}), ("K", shipped("K"), {"message-id": "K.2"})]
    await produce(kafka, topics.source, records, partition=1)
    settings = settings_for(
        database_url,
        kafka,
        topics,
        downstream,
        console_tokens,
        ordering="key",
        retry_tiers="1s",
        max_attempts=None,
        max_elapsed="30s",
    )
    head = f"{topics.source}/1/0"
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM key_blocks"), timeout=60)
        assert await scalar(engine, "SELECT count(*) FROM parked WHERE ordering_key = 'K'") == 1
        url = await serve_console(settings)
        await log_in(page, url, operator_token)

        # When ann finds the key on the held keys page and asks to release it
        await page.get_by_role("link", name="Held keys", exact=True).click()
        held = page.locator("table tbody tr")
        await expect(held).to_have_count(1)
        await expect(held.locator("td.num")).to_have_text("1")
        await expect(held).to_contain_text(f"quarantined head {head}")
        await screenshot(page, "keys")
        await held.get_by_role("button", name="Release…").click()

        # Then a dry run says what holds it and what waits behind it; nothing is released yet
        await expect(page.locator("h1")).to_have_text("Dry run: release")
        await expect(page.locator("#preview-count")).to_have_text("1")
        await expect(page.locator("#preview dl")).to_contain_text(f"held by{head}")
        await expect(page.locator("#preview dl")).to_contain_text("parked behind it1")
        await screenshot(page, "release-preview")
        assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 1

        # When she confirms
        await page.locator("#confirm").click()

        # Then the key is free, the head stays quarantined, and the release is audited
        consumer = settings.consumer_name
        await expect(page.locator("#outcome")).to_have_text(
            f"consumer {consumer}: K: released (was held by quarantined head {head}); 1 parked"
        )
        assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 0
        assert await scalar(engine, "SELECT status FROM quarantine WHERE failure_id = :id", id=head) == "open"
        [audited] = await rows(engine, "SELECT actor, action, selection, result FROM audit_log")
        assert (audited["actor"], audited["action"]) == ("ann", "parked.release")
        assert audited["selection"] == {"consumer": consumer, "key": "K"}
        assert audited["result"] == {"freed": True, "blocked_by": head, "parked": 1}

        # And the running consumer applies the parked shipment at once, ahead of its still quarantined placement
        # (so it finds no order and is rejected): nothing is held any more
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM parked"), timeout=30)
        assert await rows(engine, "SELECT message_id, status FROM inbox ORDER BY 1") == [
            {"message_id": "K.1", "status": "quarantined"},
            {"message_id": "K.2", "status": "rejected"},
        ]
        await page.get_by_role("link", name="Held keys", exact=True).click()
        await expect(page.locator("p.empty")).to_have_text("No key is held.")
