"""The second domain (examples/inventory) on the real core: the consumer loop, the relay, the effect worker and the
reconciler, on real PostgreSQL and Kafka, with the fake stock and warehouse APIs on the fault-injection server.

The core's container is built from the domain's `DOMAIN`; the database is migrated by the core's history alone plus
the domain's own migration branch, applied through the core's schema seam. Every test asserts on rows
(reservations, inbox, effects), on topic contents, and on what the warehouse holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from inventory.codes import InventoryCode
from inventory.domain import DOMAIN
from inventory.fakes import HOLDS_GET, HOLDS_POST, RELEASES_POST, STOCK_GET, Warehouse
from inventory.model import Stock
from inventory.providers import StockClient, WarehouseClient
from inventory.settings import InventorySettings
from service.adapters.http import HttpClient
from service.codes import ErrorCode
from service.containers import Container
from service.errors import DownstreamError, SchemaNotCurrent
from service.policy.effects import Found, Missing, NotSent, Refused, Sent, Unknown
from service.store import schema
from tests.support import Topics, eventually, make_engine, produce, read_topic, rows, scalar
from tests.support import committed as _committed
from tests.support.effects import effect, state_is
from tests.support.inventory import released, reserved

HOLD = "warehouse.hold"
UNHOLD = "warehouse.unhold"


@pytest.fixture
def warehouse() -> Iterator[Warehouse]:
    """The fake stock and warehouse APIs."""
    with Warehouse() as server:
        yield server


@pytest.fixture
def inventory_database(core_database_url: str) -> str:
    """This test's database, migrated by the core's history, with the inventory domain's migration branch applied."""
    schema.upgrade_to_head(core_database_url, DOMAIN.migrations)
    return core_database_url


@pytest.fixture
async def engine(inventory_database: str) -> AsyncIterator[AsyncEngine]:
    """An engine on this test's inventory database."""
    engine = make_engine(inventory_database)
    yield engine
    await engine.dispose()


def inventory_settings(database_url: str, kafka: str, topics: Topics, warehouse: Warehouse, **overrides: Any) -> Any:
    """The core's test settings and the domain's URLs; short HTTP timeout and lease so tests stay fast."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap_servers": kafka,
        "source_topic": topics.source,
        "consumer_name": f"{topics.source}-consumer",
        "metrics_port": 0,
        "max_attempts": 4,
        "retry_tiers": "",
        "max_elapsed": "20s",
        "http_timeout": "1s",
        "effect_lease": "3s",
        "stock_url": warehouse.url,
        "warehouse_url": warehouse.url,
    }
    return InventorySettings(**(values | overrides))


@contextlib.asynccontextmanager
async def running(settings: InventorySettings, *parts: str) -> AsyncIterator[Container]:
    """The inventory-wired container's loops (e.g. "consumer_loop", "relay") as tasks until the block exits."""
    container = Container(domain=DOMAIN, settings=settings)
    await container.init_resources()
    stop = asyncio.Event()
    loops = [await _built(getattr(container, part)()) for part in parts]
    tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
    try:
        yield container
    finally:
        stop.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await container.shutdown_resources()
        for result in results:
            if isinstance(result, BaseException):
                raise result


async def _built(provided: Any) -> Any:
    """A provider's object; one that depends on an async resource comes as an awaitable."""
    return await provided if asyncio.isfuture(provided) or asyncio.iscoroutine(provided) else provided


async def reconcile_once(container: Container) -> Any:
    """One reconcile pass with the container's registry (the inventory domain's kinds)."""
    reconciler = await _built(container.reconciler())
    return await reconciler.run_once(30)


async def events(kafka: str, topic: str, expect: int) -> list[dict[str, Any]]:
    """The JSON documents on a topic, in order."""
    return [json.loads(record.value) for record in await read_topic(kafka, topic, expect=expect)]


async def reservation(engine: AsyncEngine, reservation_id: str) -> dict[str, Any]:
    """The reservation row."""
    [row] = await rows(engine, "SELECT * FROM reservations WHERE reservation_id = :id", id=reservation_id)
    return row


async def test_a_reserve_is_accepted_and_held_exactly_once_at_the_warehouse(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given 5 of SKU-1 in Berlin
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)

    # When a reservation of 2 is consumed, and its effect executed and its events relayed
    await produce(kafka, topics.source, [("R-1", reserved("R-1"), {})])
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: state_is(engine, f"R-1/{HOLD}", "sent"))
        published = await events(kafka, topics.events, expect=2)

    # Then the reservation exists, held, and the warehouse made exactly one hold of 2
    row = await reservation(engine, "R-1")
    assert (row["status"], row["hold_status"], row["quantity"], row["version"]) == ("reserved", "held", 2, 2)
    [hold] = warehouse.fakes.holds().values()
    assert (hold["idempotency_key"], hold["quantity"], hold["warehouse"]) == (f"R-1/{HOLD}", 2, "berlin")
    assert warehouse.calls(HOLDS_POST) == 1
    assert warehouse.calls(STOCK_GET, "SKU-1") == 1
    assert warehouse.fakes.stock("SKU-1") == {"berlin": 3}
    held = await effect(engine, f"R-1/{HOLD}")
    assert (held["aggregate_id"], held["attempts"], held["provider_ref"]) == ("R-1", 1, hold["hold_id"])
    inbox = await rows(engine, "SELECT status, aggregate_id FROM inbox")
    assert inbox == [{"status": "processed", "aggregate_id": "R-1"}]
    # And the events say accepted, then held, each with the reservation's version after it
    assert [(e["type"], e["reservationId"], e["reservationVersion"]) for e in published] == [
        ("reservation.accepted", "R-1", 1),
        ("reservation.held", "R-1", 2),
    ]
    assert published[0] | {"messageId": None} == {
        "type": "reservation.accepted",
        "reservationId": "R-1",
        "reservationVersion": 1,
        "messageId": None,
        "sku": "SKU-1",
        "quantity": 2,
        "warehouse": "berlin",
    }
    assert published[1]["reference"] == hold["hold_id"]


async def test_an_unknown_sku_and_too_little_stock_are_rejected_and_make_no_effect(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given 1 of SKU-1 in Berlin, and a SKU the catalogue does not know
    warehouse.fakes.set_stock("SKU-1", "berlin", 1)
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)

    # When a reserve of the unknown SKU and a reserve of 2 of SKU-1 are consumed
    records = [("R-2", reserved("R-2", sku="SKU-404"), {}), ("R-3", reserved("R-3", quantity=2), {})]
    await produce(kafka, topics.source, records)
    async with running(settings, "consumer_loop", "relay"):
        rejected = await events(kafka, topics.rejected, expect=2)

    # Then both are rejected with the domain's codes, terminal in the inbox, announced on <source>.rejected
    codes = {e["reservationId"]: (e["type"], e["errorCode"], e["payloadSchema"]) for e in rejected}
    assert codes == {
        "R-2": ("reservation.rejected", "UNKNOWN_SKU", "stock.reserved.v1"),
        "R-3": ("reservation.rejected", "INSUFFICIENT_STOCK", "stock.reserved.v1"),
    }
    inbox = await rows(engine, "SELECT aggregate_id, status, error_code FROM inbox ORDER BY aggregate_id")
    assert inbox == [
        {"aggregate_id": "R-2", "status": "rejected", "error_code": "UNKNOWN_SKU"},
        {"aggregate_id": "R-3", "status": "rejected", "error_code": "INSUFFICIENT_STOCK"},
    ]
    # And nothing was reserved, no effect was recorded, the warehouse was asked for stock but never for a hold
    assert await scalar(engine, "SELECT count(*) FROM reservations") == 0
    assert await scalar(engine, "SELECT count(*) FROM effects") == 0
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE topic = :t", t=topics.events) == 0
    assert (warehouse.calls(STOCK_GET, "SKU-404"), warehouse.calls(STOCK_GET, "SKU-1")) == (1, 1)
    assert warehouse.calls(HOLDS_POST) == 0


async def test_a_release_waits_for_its_hold_then_the_warehouse_releases_it(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given stock, and a warehouse whose first hold call for R-4 fails (503): the hold is retried later
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    warehouse.fail_next(HOLDS_POST, status=503, key=f"R-4/{HOLD}")
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)

    # When R-4 is reserved and released at once, and the effects run
    await produce(kafka, topics.source, [("R-4", reserved("R-4"), {}), ("R-4", released("R-4"), {})])
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: state_is(engine, f"R-4/{UNHOLD}", "sent"))
        published = await events(kafka, topics.events, expect=4)

    # Then the release was claimed once, only after the hold was sent on its second attempt: the warehouse saw
    # the hold first (a release of a key it does not hold would have been refused, NOTHING_HELD)
    hold, unhold = await effect(engine, f"R-4/{HOLD}"), await effect(engine, f"R-4/{UNHOLD}")
    assert (hold["state"], hold["attempts"], unhold["state"], unhold["attempts"]) == ("sent", 2, "sent", 1)
    assert warehouse.fakes.journal() == [("hold", f"R-4/{HOLD}"), ("release", f"R-4/{UNHOLD}")]
    assert (warehouse.calls(HOLDS_POST), warehouse.calls(RELEASES_POST)) == (2, 1)
    assert warehouse.fakes.stock("SKU-1") == {"berlin": 5}
    # And the reservation is released and unheld; its events carry versions 1 to 4 in the order they happened
    row = await reservation(engine, "R-4")
    assert (row["status"], row["hold_status"], row["version"]) == ("released", "unheld", 4)
    assert [(e["type"], e["reservationVersion"]) for e in published] == [
        ("reservation.accepted", 1),
        ("reservation.released", 2),
        ("reservation.held", 3),
        ("reservation.unheld", 4),
    ]


async def test_a_hold_that_timed_out_after_the_warehouse_made_it_is_reconciled_to_sent(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given a warehouse that makes R-5's hold but answers after 3 s, with an HTTP timeout of 1 s
    key = f"R-5/{HOLD}"
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    warehouse.delay_next(HOLDS_POST, seconds=3, key=key)
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)

    await produce(kafka, topics.source, [("R-5", reserved("R-5"), {})])
    async with running(settings, "consumer_loop", "relay", "effect_worker") as container:
        # When the call times out, the effect is uncertain
        await eventually(lambda: state_is(engine, key, "uncertain"))
        uncertain = await effect(engine, key)
        # And the reconciler runs
        summary = await reconcile_once(container)
        published = await events(kafka, topics.events, expect=2)

    # Then the reconciler found the hold by its key and settled the effect sent with the warehouse's hold id
    assert (uncertain["last_error_code"], uncertain["provider_ref"]) == ("DOWNSTREAM_TIMEOUT", None)
    assert (summary.resolved_sent, summary.sent_back_to_pending, summary.still_uncertain) == (1, 0, 0)
    [hold] = warehouse.fakes.holds().values()
    row = await effect(engine, key)
    assert (row["state"], row["provider_ref"], row["attempts"]) == ("sent", hold["hold_id"], 1)
    # And there is exactly one hold: one call, one look-up, never a second call
    assert (warehouse.calls(HOLDS_POST, key), warehouse.calls(HOLDS_GET, key)) == (1, 1)
    assert warehouse.fakes.stock("SKU-1") == {"berlin": 3}
    assert (await reservation(engine, "R-5"))["hold_status"] == "held"
    assert [e["type"] for e in published] == ["reservation.accepted", "reservation.held"]


async def test_a_redelivered_record_is_a_duplicate_with_one_inbox_row_and_one_effect(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given the same reserve delivered twice under one message id (a producer's retry)
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)
    record = ("R-6", reserved("R-6"), {"message-id": "R-6.1/stock.reserved"})
    await produce(kafka, topics.source, [record, record], partition=0)

    # When both are consumed and the effects run
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 0, 2))
        await eventually(lambda: state_is(engine, f"R-6/{HOLD}", "sent"))
        published = await events(kafka, topics.events, expect=2)

    # Then the second is a duplicate: one inbox row, one reservation, one effect, one hold, one accepted event
    inbox = await rows(engine, "SELECT message_id, status FROM inbox")
    assert inbox == [{"message_id": "R-6.1/stock.reserved", "status": "processed"}]
    assert await scalar(engine, "SELECT count(*) FROM reservations") == 1
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert len(warehouse.fakes.holds()) == 1
    assert warehouse.calls(HOLDS_POST) == 1
    assert [e["type"] for e in published] == ["reservation.accepted", "reservation.held"]


async def test_the_schema_is_current_only_with_the_domains_branch_applied(core_database_url: str) -> None:
    # Given a database migrated by the core's history: the core is current, the inventory domain's branch is not
    await schema.require_head(core_database_url)
    assert schema.head_revision(DOMAIN.migrations) == "0021, inv_0001"
    with pytest.raises(SchemaNotCurrent, match=r"is at 0021, this version needs 0021, inv_0001: run"):
        await schema.require_head(core_database_url, DOMAIN.migrations)

    # When the domain's branch is applied through the seam
    head = await asyncio.to_thread(schema.upgrade_to_head, core_database_url, DOMAIN.migrations)

    # Then both heads are current: the version table keeps the core's newest revision and the branch, which
    # depends on the core revision it was written against (0010), not on every later one
    assert head == "0021, inv_0001"
    await schema.require_head(core_database_url, DOMAIN.migrations)
    assert await schema.current_revision(core_database_url) == "0021, inv_0001"
    # And the core's history left no other domain's table behind
    engine = make_engine(core_database_url)
    try:
        assert await scalar(engine, "SELECT to_regclass('orders')") is None
    finally:
        await engine.dispose()


async def test_a_hold_the_warehouse_refuses_fails_and_says_so_on_the_reservation_and_in_an_event(
    inventory_database: str, engine: AsyncEngine, kafka: str, topics: Topics, warehouse: Warehouse
) -> None:
    # Given stock the stock API shows, and a warehouse that refuses R-7's hold (422: the stock went meanwhile)
    key = f"R-7/{HOLD}"
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    warehouse.fail_next(HOLDS_POST, status=422, body={"error": "insufficient_stock"}, key=key)
    settings = inventory_settings(inventory_database, kafka, topics, warehouse)

    # When R-7 is reserved and its hold attempted
    await produce(kafka, topics.source, [("R-7", reserved("R-7"), {})])
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "failed"))
        published = await events(kafka, topics.events, expect=2)

    # Then the effect failed at once with the domain's code, never retried, and the reservation says so
    row = await effect(engine, key)
    assert (row["last_error_code"], row["attempts"]) == ("HOLD_REFUSED", 1)
    assert warehouse.calls(HOLDS_POST, key) == 1
    assert (await reservation(engine, "R-7"))["hold_status"] == "hold_failed"
    assert [(e["type"], e["reservationVersion"], e.get("errorCode")) for e in published] == [
        ("reservation.accepted", 1, None),
        ("reservation.hold_failed", 2, "HOLD_REFUSED"),
    ]


async def test_the_clients_tell_what_the_warehouse_may_have_done(warehouse: Warehouse) -> None:
    # Given the clients on the fake APIs, with a short timeout, and 5 of SKU-1 in Berlin
    warehouse.fakes.set_stock("SKU-1", "berlin", 5)
    body = {"reservation_id": "R-1", "sku": "SKU-1", "quantity": 2, "warehouse": "berlin"}
    http = HttpClient.open(timedelta(seconds=0.5), connections=10)
    try:
        # (each call that opens a breaker on a client of its own: the next call is read as itself, not refused)
        stock, store = StockClient(http, warehouse.url), WarehouseClient(http, warehouse.url)
        warehouse.fail_next(HOLDS_POST, status=429, retry_after=7)
        warehouse.fail_next(HOLDS_POST, status=503)
        warehouse.delay_next(HOLDS_POST, seconds=1.5)
        # When: a rate limit, an outage, a timeout after the warehouse acted, a replay, and too much at once
        limited = await WarehouseClient(http, warehouse.url).hold("R-1/warehouse.hold", body)
        down = await store.hold("R-1/warehouse.hold", body)
        timed_out = await store.hold("R-1/warehouse.hold", body)
        replayed = await store.hold("R-1/warehouse.hold", body)
        too_much = await store.hold("R-2/warehouse.hold", {**body, "reservation_id": "R-2", "quantity": 4})
        found, missing = await store.find_hold("R-1/warehouse.hold"), await store.find_hold("R-2/warehouse.hold")
        nothing_held = await store.release("R-2/warehouse.unhold", {"hold_key": "R-2/warehouse.hold"})
        level, unknown = await stock.level("SKU-1"), await stock.level("SKU-404")
        warehouse.fail_next(STOCK_GET, status=429, retry_after=3)
        with pytest.raises(DownstreamError) as rate_limited:
            await StockClient(http, warehouse.url).level("SKU-1")
    finally:
        await http.close()

    # Then only a timeout is uncertain; the replay answers the hold the timed-out call made
    [hold] = warehouse.fakes.holds().values()
    # (a 429 with Retry-After opens the warehouse's breaker: the call is charged to nobody)
    assert limited == NotSent(ErrorCode.RATE_LIMITED, timedelta(seconds=7), charged=False)
    assert down == NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)
    assert timed_out == Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)
    assert replayed == Sent(hold["hold_id"])
    assert too_much == Refused(InventoryCode.HOLD_REFUSED)
    assert (found, missing) == (Found(hold["hold_id"]), Missing())
    assert nothing_held == Refused(InventoryCode.NOTHING_HELD)
    assert (level, unknown) == (Stock("SKU-1", True, {"berlin": 3}), Stock("SKU-404", False))
    # (the record waits for the breaker the 429 opened, for the 3 s it asked: minus the moment since)
    assert (rate_limited.value.code, rate_limited.value.charged) == (ErrorCode.RATE_LIMITED, False)
    assert rate_limited.value.retry_after is not None
    assert timedelta(seconds=2.5) < rate_limited.value.retry_after <= timedelta(seconds=3)
