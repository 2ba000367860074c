"""Per-order event order: events carry `orderVersion`, and one order's events are published in version order,
also when an effect worker settles a payment while the consumer holds the order (issue 13, finding 8).
"""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.store import outbox
from service.store.outbox import OutboxMessage
from tests.support import Topics, eventually, produce, read_topic, running, scalar, settings_for


def placed(order_id: str) -> dict[str, object]:
    """An `order.placed.v1` for a known tenant and an active customer."""
    return {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": "acme",
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 900}],
    }


async def test_an_effect_settled_while_the_order_is_held_is_published_after_the_change_that_held_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a placed order (version 1) whose capture is pending
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, payments_url=downstream.url)
    await produce(kafka, topics.source, [("E-1", placed("E-1"), {})])
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM effects WHERE state = 'pending'"))

    # When a change of the order holds its row (as a consumer's round does) while the effect worker settles
    # the capture, and the change commits first
    async with engine.connect() as held:
        transaction = await held.begin()
        await held.execute(text("SELECT 1 FROM orders WHERE order_id = 'E-1' FOR UPDATE"))
        async with running(settings, "effect_worker"):
            await eventually(lambda: _waiting_for_a_lock(engine), timeout=30)
            version = await held.scalar(
                text("UPDATE orders SET version = version + 1 WHERE order_id = 'E-1' RETURNING version")
            )
            document = {"type": "order.noted", "orderId": "E-1", "orderVersion": version}
            await outbox.add(held, [OutboxMessage.json(topics.events, "E-1", {"event-id": "E-1/noted"}, document)])
            await transaction.commit()
            await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM effects WHERE state = 'sent'"))

    # Then the order's events are published in version order: accepted, the change, then the capture
    async with running(settings, "relay"):
        events = await read_topic(kafka, topics.events, expect=3, timeout=30)
    published = [json.loads(record.value) for record in events]
    assert [(event["type"], event["orderVersion"]) for event in published] == [
        ("order.accepted", 1),
        ("order.noted", 2),
        ("payment.captured", 3),
    ]
    assert await scalar(engine, "SELECT version FROM orders WHERE order_id = 'E-1'") == 3


async def _waiting_for_a_lock(engine: AsyncEngine) -> bool:
    """Whether a session of this database waits for a row lock (the effect worker's order update)."""
    waiting = await scalar(
        engine,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return bool(waiting)
