"""The live system in a real browser: the Processes page lists every process from its heartbeat (partitions and lag,
pauses, rates, breakers, configuration errors) and marks a silent one as gone; the overview shows the open breaker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.async_api import Page, expect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.heartbeat import BreakerView, Counters, PartitionView, Snapshot, facts
from service.store import processes
from service.store.processes import Identity
from tests.browser.support import LogIn, Screenshot, ServeConsole

TOPICS = ("orders", "orders.retry.30s", "orders.retry.5m", "orders.reprocess")
NOW_MS = int(datetime.now(UTC).timestamp() * 1000)


def _who(n: int, role: str) -> Identity:
    started = datetime.now(UTC) - timedelta(hours=2, minutes=n)
    return Identity(
        f"node-{n}:{100 + n}:x", role, "order-service", f"order-service-{n}", 100 + n, "0.1.0", 5.0, started
    )


def _consumer(partition: int, *, breaker: str = "closed", paused: str | None = None) -> dict[str, object]:
    before = Snapshot(at=0.0, counters=Counters(rounds=0, records=0))
    now = Snapshot(
        at=5.0,
        partitions=tuple(
            PartitionView(
                topic,
                partition,
                lag=(40 if topic == "orders" else 0),
                paused=paused if topic == "orders" else None,
                oldest_ms=NOW_MS - 12_000 if topic == "orders" else None,
            )
            for topic in TOPICS
        ),
        breakers=(
            BreakerView("customers", breaker, "DOWNSTREAM_UNAVAILABLE" if breaker != "closed" else None, False, 34.0),
        ),
        counters=Counters(rounds=60, records=12_000),
    )
    return facts(before, now)


async def seed_processes(engine: AsyncEngine) -> None:
    """Three live consumers (one behind an open breaker, one pausing), a relay, an effect worker, and a consumer
    that went silent a minute ago."""
    quiet = Snapshot(at=5.0, counters=Counters(published=900))
    beats = [
        (_who(1, "consume"), _consumer(0)),
        (_who(2, "consume"), _consumer(1, breaker="open", paused="backpressure: its lane is full")),
        (_who(3, "consume"), _consumer(2)),
        (_who(4, "relay"), facts(Snapshot(at=0.0), quiet)),
        (_who(5, "effects"), facts(None, Snapshot(at=5.0))),
        (_who(6, "consume"), _consumer(0)),
    ]
    async with engine.begin() as connection:
        for who, document in beats:
            await processes.beat(connection, who, document)
        await connection.execute(
            text("UPDATE processes SET last_seen = now() - interval '1 minute' WHERE process_id = :id"),
            {"id": _who(6, "consume").process_id},
        )


async def test_the_processes_page_shows_each_process_its_lag_and_breakers_and_marks_a_silent_one_gone(
    engine: AsyncEngine,
    console_settings: Settings,
    serve_console: ServeConsole,
    page: Page,
    log_in: LogIn,
    viewer_token: str,
    screenshot: Screenshot,
) -> None:
    # Given five live processes and one silent for a minute, and vic, a viewer, logged in
    await seed_processes(engine)
    url = await serve_console(console_settings)
    await log_in(page, url, viewer_token)

    # Then the overview shows the lag of the source topic, the oldest unprocessed age and the open breaker
    await expect(page.locator("#live-system")).to_contain_text("5 live processes")
    await expect(page.locator("#live-system .tile.lag").first).to_contain_text("120")
    await expect(page.locator("#open-breakers tbody tr")).to_have_count(1)
    await expect(page.locator("#open-breakers tbody tr")).to_contain_text("customers")

    # When she opens the Processes page
    await page.get_by_role("link", name="Processes", exact=True).click()

    # Then every process is listed with its status, the silent one as gone, the open breaker and the pause named
    rows = page.locator("#processes tbody tr")
    await expect(rows).to_have_count(6)
    await expect(page.locator("#processes tr.process-live")).to_have_count(5)
    gone = page.locator("#processes tr.process-gone")
    await expect(gone).to_have_count(1)
    await expect(gone).to_contain_text("order-service-6")
    behind = rows.filter(has_text="order-service-2")
    await expect(behind).to_contain_text("backpressure: its lane is full")
    await expect(behind.locator(".state-open")).to_have_text("open")
    await expect(behind).to_contain_text("orders/1 (40)")
    await screenshot(page, "processes")
