"""Non-blocking retry tiers, per-key ordering and a downstream's circuit breaker on real Kafka and PostgreSQL.

Tier delays are shortened by configuration (1s, 2s); outcomes are awaited by polling, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.support import ServiceProcess, Topics, cli, eventually, produce, read_topic, rows, running, scalar
from tests.support import committed as _committed
from tests.support import settings_for as base_settings
from tests.support.orders import placed


def settings_for(database_url: str, kafka: str, topics: Topics, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "retry_tiers": "1s,2s",
        "blocking_attempts": 2,
        "blocking_elapsed": "2s",
        "max_attempts": None,
        "max_elapsed": "60s",
    }
    return base_settings(database_url, kafka, topics, **(values | overrides))


def cancelled(order_id: str) -> dict[str, Any]:
    return {"schema": "order.cancelled.v1", "order_id": order_id, "reason": "changed my mind"}


async def test_a_spent_blocking_budget_puts_exactly_one_copy_on_the_first_tier_even_across_a_crash(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a customer directory that is down for one customer, and a consumer that dies (SIGKILL) right
    # after the transaction that hands the record to the first tier, before the source offset commit
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    await produce(kafka, topics.source, [("R-1", placed("R-1", customer="c-down"), {})], partition=0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    doomed = ServiceProcess("consume", settings, tmp_path / "doomed.log", {"ORDERS_FAULT_CRASH_AT": "after-commit"})
    assert doomed.wait() == -9
    assert await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.retry('1s')}'") == 1
    assert not await _committed(kafka, settings.consumer_name, topics.source, 0, 1)

    # When a healthy consumer and a relay take over, and the record runs through every tier
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then the redelivered source record was recognised: one copy per tier, one quarantine
    assert len(await read_topic(kafka, topics.retry("1s"), expect=1, timeout=5)) == 1
    assert len(await read_topic(kafka, topics.retry("2s"), expect=1, timeout=5)) == 1
    assert len(await read_topic(kafka, topics.quarantine, expect=1, timeout=5)) == 1
    assert await scalar(engine, "SELECT count(*) FROM retries") == 0


async def test_a_record_that_always_fails_passes_every_tier_and_is_quarantined_once_with_its_origin(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a record whose customer lookup always fails
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    await produce(kafka, topics.source, [("R-2", placed("R-2", customer="c-down"), {})], partition=1)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When the service runs until it gives up
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then it was tried 2 times in place and once per tier, and quarantined once with its source coordinates
    [row] = await rows(engine, "SELECT * FROM quarantine")
    envelope = row["envelope"]
    assert row["error_code"] == envelope["errorCode"] == "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"
    assert row["attempts"] == envelope["attempt"] == 4
    assert row["failure_id"] == envelope["failureId"] == f"{topics.source}/1/0"
    assert envelope["source"]["topic"] == topics.source
    first, last = (datetime.fromisoformat(envelope[k]) for k in ("firstFailedAt", "lastFailedAt"))
    assert (last - first).total_seconds() >= 3  # the 1s and 2s tiers lie between them
    assert downstream.calls("customers.get", "c-down") == 4
    tier_copies = await read_topic(kafka, topics.retry("1s"), expect=1, timeout=5)
    headers = {name: value.decode() for name, value in tier_copies[0].headers}
    assert headers["failure-id"] == f"{topics.source}/1/0"
    assert headers["retry-attempt"] == "2"
    assert len(await read_topic(kafka, topics.quarantine, expect=1, timeout=5)) == 1
    assert await scalar(engine, "SELECT status FROM inbox") == "quarantined"


async def test_under_key_ordering_a_later_record_waits_behind_its_retrying_key_and_others_flow(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given K's placement failing three times (two blocking attempts and the first tier), then succeeding,
    # K's cancellation right behind it, and other keys behind both on the same partition
    downstream.fail_next("customers.get", times=3, status=503, key="c-flaky")
    records = [
        ("K", placed("K", customer="c-flaky"), {}),
        ("K", cancelled("K"), {}),
        *((f"L-{n}", placed(f"L-{n}", customer=f"c-{n}"), {}) for n in range(3)),
    ]
    await produce(kafka, topics.source, records, partition=0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When the service runs
    async with running(settings, "consumer_loop", "relay"):
        # Then K's cancellation is parked while K waits in a tier, and the other keys are applied meanwhile
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM parked WHERE ordering_key = 'K'"))
        assert await scalar(engine, "SELECT count(*) FROM orders WHERE order_id LIKE 'L-%'") == 3
        assert await scalar(engine, "SELECT count(*) FROM orders WHERE order_id = 'K'") == 0
        await eventually(lambda: scalar(engine, "SELECT count(*) = 5 FROM inbox"), timeout=60)

    # And once K's head succeeds, the cancellation is applied after it, in order
    assert await rows(engine, "SELECT status FROM orders WHERE order_id = 'K'") == [{"status": "cancelled"}]
    applied = await rows(engine, "SELECT message_id, status FROM inbox ORDER BY processed_at, source_offset")
    assert [row["message_id"] for row in applied][-2:] == [f"{topics.source}/0/0", f"{topics.source}/0/1"]
    assert {row["status"] for row in applied} == {"processed"}
    assert await scalar(engine, "SELECT count(*) FROM parked") == 0
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE aggregate_id = 'K'") == 2


async def test_a_quarantined_head_keeps_its_key_parked_until_an_operator_releases_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given K's placement that never succeeds, and K's cancellation behind it
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    records = [("K", placed("K", customer="c-down"), {}), ("K", cancelled("K"), {"message-id": "K.2/cancel"})]
    await produce(kafka, topics.source, records, partition=2)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    async with running(settings, "consumer_loop", "relay"):
        # When the head is quarantined
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        # Then K stays parked, and `parked list` says why
        listed = json.loads((await cli(settings, "parked", "list", "--json")).stdout)
        assert [(item["ordering_key"], item["parked"], item["blocked_by"]) for item in listed] == [
            ("K", 1, f"{topics.source}/2/0")
        ]
        assert await scalar(engine, "SELECT count(*) FROM inbox WHERE message_id = 'K.2/cancel'") == 0

        # When an operator releases the key
        released = await cli(settings, "parked", "release", "K", "--json")
        assert json.loads(released.stdout)["released"] is True

        # Then the parked record is applied (its order never existed, so it is rejected), and K is free
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM inbox WHERE message_id = 'K.2/cancel'"))
    assert await scalar(engine, "SELECT error_code FROM inbox WHERE message_id = 'K.2/cancel'") == "ORDER_NOT_FOUND"
    assert await scalar(engine, "SELECT count(*) FROM parked") == 0
    assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 0


async def test_unordered_mode_applies_a_later_record_before_a_retrying_earlier_one(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given K's placement failing through the blocking phase, and K's cancellation behind it
    downstream.fail_next("customers.get", times=2, status=503, key="c-flaky")
    records = [("K", placed("K", customer="c-flaky"), {}), ("K", cancelled("K"), {})]
    await produce(kafka, topics.source, records, partition=0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, ordering="unordered")

    # When the service runs
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM inbox"), timeout=60)

    # Then the cancellation overtook the placement (and found no order): the documented reordering
    applied = await rows(engine, "SELECT source_offset, status, error_code FROM inbox ORDER BY processed_at")
    assert applied == [
        {"source_offset": 1, "status": "rejected", "error_code": "ORDER_NOT_FOUND"},
        {"source_offset": 0, "status": "processed", "error_code": None},
    ]
    assert await scalar(engine, "SELECT count(*) FROM parked") == 0


async def test_versioned_mode_skips_a_record_older_than_the_applied_sequence(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a placement (sequence 1), a shipment (sequence 3), then a late cancellation (sequence 2)
    shipped = {"schema": "order.shipped.v1", "order_id": "V", "carrier": "dhl", "tracking_number": "1", "sequence": 3}
    late = {**cancelled("V"), "sequence": 2}
    await produce(kafka, topics.source, [("V", placed("V"), {}), ("V", shipped, {}), ("V", late, {})], partition=0)
    settings = settings_for(database_url, kafka, topics, ordering="versioned")

    # When the service runs
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM inbox"))

    # Then the stale cancellation changed nothing and caused no refund
    assert await rows(engine, "SELECT status, sequence FROM orders") == [{"status": "shipped", "sequence": 3}]
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE kind = 'payment.refund'") == 0
    assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status = 'processed'") == 3


async def test_a_lookup_that_overruns_the_processing_timeout_fails_as_processing_timeout(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a customer directory that answers once after 3 s, with a processing timeout of 1 s
    downstream.delay_next("customers.get", times=1, seconds=3)
    await produce(kafka, topics.source, [("T-1", placed("T-1"), {})], partition=0)
    settings = settings_for(
        database_url, kafka, topics, customers_url=downstream.url, processing_timeout="1s", http_timeout="10s"
    )

    # When the service runs
    async with running(settings, "consumer_loop") as container:
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM inbox"), timeout=30)
        metrics = container.metrics().registry

    # Then the slow attempt counted as PROCESSING_TIMEOUT, and the retry applied the order
    assert metrics.get_sample_value("orders_failures_total", {"error_code": "PROCESSING_TIMEOUT"}) == 1
    assert await scalar(engine, "SELECT status FROM inbox") == "processed"


async def test_a_downstream_kept_down_opens_its_breaker_for_longer_and_longer_and_all_flows_when_it_is_back(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a customer directory that is down, and orders arriving on one partition
    downstream.fail_next("customers.get", times=10_000, status=503)
    await produce(kafka, topics.source, [(f"P-{n}", placed(f"P-{n}", customer=f"c-{n}"), {}) for n in range(4)], 0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, max_elapsed="120s")
    service = ServiceProcess("run", settings, tmp_path / "service.log")
    try:
        # When failures pile up, the directory's breaker opens, and each failed probe opens it for longer
        await eventually(lambda: asyncio.sleep(0, len(_open_times(service.log())) >= 3), timeout=60)
        lag_before = await _lag(kafka, settings.consumer_name, topics.source)
        await produce(kafka, topics.source, [(f"Q-{n}", placed(f"Q-{n}", customer=f"d-{n}"), {}) for n in range(6)], 0)
        lag_after = await _lag(kafka, settings.consumer_name, topics.source)

        # And when the directory is back, everything is applied and the lag drains
        downstream.clear_faults()
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 10 FROM inbox WHERE status = 'processed'"), timeout=120
        )
        await eventually(lambda: _lag_is(kafka, settings.consumer_name, topics.source, 0), timeout=30)
    finally:
        assert service.terminate() == 0

    # Then the breaker's openings were logged, each twice as long as the one before, the lag grew meanwhile, the
    # breaker closed once, and nothing was quarantined
    openings = _breaker_openings(service.log())
    assert {(o["downstream"], o["error_code"]) for o in openings} == {("customers", "DOWNSTREAM_UNAVAILABLE")}
    assert _open_times(service.log())[:3] == [2, 4, 8]
    assert lag_after > lag_before >= 1
    assert service.log().count('"breaker_closed"') == 1
    # A record spent at most the attempts of the run that opened the breaker: waiting for it spent none
    attempts = [json.loads(line)["attempt"] for line in service.log().splitlines() if '"record_failed"' in line]
    assert max(attempts) <= 4
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0


def _breaker_openings(log: str) -> list[dict[str, Any]]:
    """The `breaker_open` lines of a service's log."""
    return [json.loads(line) for line in log.splitlines() if '"breaker_open"' in line]


def _open_times(log: str) -> list[int]:
    """How long the breaker opened for at each opening, in whole seconds: a spell's later failed probes (another
    record's, its request a suspect too) open it again for as long, and count once."""
    times: dict[int, int] = {}
    for opening in _breaker_openings(log):
        times.setdefault(opening["openings"], round(opening["open_seconds"]))
    return list(times.values())


async def _lag(bootstrap: str, group: str, topic: str) -> int:
    """How many records of the topic's partition 0 the group has not committed yet."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    partition = TopicPartition(topic, 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = (await admin.list_consumer_group_offsets(group)).get(partition)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        end = (await consumer.end_offsets([partition]))[partition]
    finally:
        await consumer.stop()
    return int(end - (committed.offset if committed and committed.offset >= 0 else 0))


async def _lag_is(bootstrap: str, group: str, topic: str, value: int) -> bool:
    return await _lag(bootstrap, group, topic) == value
