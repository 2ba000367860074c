"""What the browser tests share besides fixtures: the fixtures' callable types, and quarantined records made
by the service's own processor (no Kafka) as a consumer would have quarantined them over the last half day."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dependency_injector import providers
from playwright.async_api import Page
from sqlalchemy import text

from service.config import Settings
from service.containers import Container
from service.orders.domain import DOMAIN
from service.policy.records import SourceRecord
from tests.support.orders import placed

ServeConsole = Callable[[Settings], Awaitable[str]]  # settings -> the base URL of a console serving them
LogIn = Callable[[Page, str, str], Awaitable[None]]  # (page, base URL, token)
Screenshot = Callable[[Page, str], Awaitable[Path]]  # (page, name) -> the PNG written
NewPage = Callable[[], Awaitable[Page]]

SOURCE = "orders"
# Who owns what in the seeded queue (ORDERS_QUARANTINE_OWNERS): three teams, as a real deployment has.
OWNERS = "INVALID_FIELD=checkout-web,SCHEMA_UNSUPPORTED=partner-integrations"


@dataclass(frozen=True)
class Seeded:
    """A record the seed quarantined: its failure id, its error code and the payload it carried."""

    failure_id: str
    error_code: str
    payload: bytes


def _invalid_quantity(order_id: str) -> bytes:
    """An order whose line has a quantity of 0: `INVALID_FIELD` at `items.0.quantity`."""
    document = placed(order_id, customer=f"cust-{order_id.lower()}")
    document["items"][0]["quantity"] = 0
    return json.dumps(document).encode()


def _unknown_schema(order_id: str) -> bytes:
    """A message of a schema this service does not know: `SCHEMA_UNSUPPORTED`."""
    return json.dumps({"schema": "order.returned.v1", "order_id": order_id, "reason": "damaged"}).encode()


def _truncated(order_id: str) -> bytes:
    """A payload cut off in the middle (a producer's bug): `MALFORMED_PAYLOAD`."""
    return json.dumps(placed(order_id)).encode()[:37]


# (error code, payload maker, message kind, how many, hours ago of the first): half a day of queue.
MIX: tuple[tuple[str, Callable[[str], bytes], str, int, float], ...] = (
    ("MALFORMED_PAYLOAD", _truncated, "placed", 6, 11.0),
    ("INVALID_FIELD", _invalid_quantity, "placed", 4, 7.5),
    ("SCHEMA_UNSUPPORTED", _unknown_schema, "returned", 3, 3.2),
)


def seed_settings(settings: Settings) -> Settings:
    """The console's settings with the owners the seeded queue was quarantined under."""
    return settings.model_copy(update={"quarantine_owners": OWNERS})


class _Clock:
    """The processor's clock, set to when each record failed."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        """The time the seed set."""
        return self.now


@contextlib.asynccontextmanager
async def _quarantining(
    settings: Settings,
) -> AsyncIterator[Callable[[Sequence[SourceRecord], datetime], Awaitable[None]]]:
    """Quarantine invalid records through the service's own processor alone (no Kafka involved), its clock at the
    time given; at the end the database's own `created_at`, which the overview's chart counts by, is moved back
    with them."""
    clock = _Clock()
    container = Container(settings=settings, domain=DOMAIN)
    container.clock.override(providers.Object(clock))
    await container.init_resources()
    quarantined: list[str] = []
    try:

        async def quarantine(records: Sequence[SourceRecord], at: datetime) -> None:
            """Quarantine `records` in one round, the processor's clock at `at`."""
            clock.now = at
            quarantined.extend(f"{record.topic}/{record.partition}/{record.offset}" for record in records)
            processor = await container.processor()
            pending = [processor.pending(record) for record in records]
            left = await processor.attempt(pending, asyncio.Event())
            assert left == set(pending), "every record is invalid input: quarantined in one round"

        yield quarantine
        engine = await container.engine()
        async with engine.begin() as connection:
            await connection.execute(
                text("UPDATE quarantine SET created_at = first_failed_at WHERE failure_id = ANY(:ids)"),
                {"ids": quarantined},
            )
    finally:
        await container.shutdown_resources()


async def quarantine_at(settings: Settings, records: Sequence[SourceRecord], at: datetime) -> None:
    """Quarantine invalid records as a consumer would have at `at`: through the processor alone, no Kafka."""
    async with _quarantining(settings) as quarantine:
        await quarantine(records, at)


async def seed_queue(settings: Settings, now: datetime | None = None) -> list[Seeded]:
    """Quarantine the `MIX` over the last half day (a record every 40 minutes per code, the last of each a minute
    ago) as a consumer of `orders` would have; the records, oldest first."""
    now = now or datetime.now(UTC)
    seeded: list[Seeded] = []
    async with _quarantining(settings) as quarantine:
        for code, make, kind, count, hours_ago in MIX:
            for number in range(count):
                offset = len(seeded)
                at = now - timedelta(hours=hours_ago) + timedelta(minutes=40 * number)
                if number == count - 1:
                    at = now - timedelta(minutes=1)
                order_id = f"{code[:2]}-{100 + offset}"
                payload = make(order_id)
                headers = (("message-id", f"{order_id}.1/{kind}".encode()),)
                timestamp_ms = int(at.timestamp() * 1000)
                record = SourceRecord(SOURCE, offset % 3, offset, timestamp_ms, order_id.encode(), payload, headers)
                await quarantine([record], at)
                seeded.append(Seeded(f"{SOURCE}/{offset % 3}/{offset}", code, payload))
    return seeded


async def csrf_of(page: Page) -> str:
    """The CSRF token of the page's session (the log-out form carries it)."""
    token = await page.locator("form[action='/logout'] input[name=csrf]").get_attribute("value")
    assert token, "the page is not of a logged-in session"
    return token


def by_code(seeded: Sequence[Seeded], code: str) -> list[Seeded]:
    """The seeded records of one error code, oldest first."""
    return [one for one in seeded if one.error_code == code]
