"""Metrics, health and logs as operators see them: scraped over HTTP from real processes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import ServiceProcess, Topics, eventually, produce, settings_for
from tests.support.orders import placed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a process's /metrics, keyed by name and sorted labels."""
    body = (await get(port, "/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def test_a_scripted_scenario_shows_exact_counts_a_growing_oldest_age_and_a_draining_outbox(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given two good orders, a duplicate, malformed bytes and an unknown tenant
    good = ("O-1", placed("O-1"), {"message-id": "O-1.1"})
    await produce(
        kafka,
        topics.source,
        [good, ("O-2", placed("O-2"), {}), good, ("X", b"\x00", {}), ("U", placed("U", tenant="umbrella"), {})],
        partition=0,
    )
    port = free_port()
    settings = settings_for(database_url, kafka, topics, metrics_port=port, metrics_refresh="500ms")

    # When only the consumer runs (no relay yet)
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    relay = None
    try:
        first = await eventually(lambda: _when(port, "orders_records_total", "processed", 2.0), timeout=60)
        first = await eventually(lambda: _scrape_when_refreshed(port), timeout=30)

        # Then each outcome and code is counted exactly, and the shared state is visible
        assert value(first, "orders_records_total", outcome="processed") == 2
        assert value(first, "orders_records_total", outcome="duplicate") == 1
        assert value(first, "orders_records_total", outcome="quarantined") == 1
        assert value(first, "orders_records_total", outcome="rejected") == 1
        assert value(first, "orders_failures_total", error_code="MALFORMED_PAYLOAD") == 1
        assert value(first, "orders_failures_total", error_code="UNKNOWN_TENANT") == 1
        assert value(first, "orders_quarantined_total", error_code="MALFORMED_PAYLOAD") == 1
        assert value(first, "orders_quarantine_open", error_code="MALFORMED_PAYLOAD", owner="order-producers") == 1
        assert value(first, "orders_effects", state="pending") == 2
        assert value(first, "orders_outbox_pending") == 4  # 2 accepted, 1 rejected, 1 envelope
        assert value(first, "orders_consumer_lag", topic=topics.source, partition="0") == 0
        oldest = value(first, "orders_quarantine_oldest_age_seconds")
        assert oldest is not None
        # And the oldest-age gauge moves with time
        later = await eventually(lambda: _grown(port, "orders_quarantine_oldest_age_seconds", oldest + 1), timeout=30)
        assert later > oldest
        assert (await get(port, "/healthz")).status_code == 200
        assert (await get(port, "/readyz")).status_code == 200

        # When a relay runs, the outbox gauges go to zero
        relay = ServiceProcess(
            "relay", settings.model_copy(update={"metrics_port": free_port()}), tmp_path / "relay.log"
        )
        await eventually(lambda: _when(port, "orders_outbox_pending", None, 0.0), timeout=60)
        assert value(await scrape(port), "orders_outbox_oldest_age_seconds") == 0
    finally:
        assert consumer.terminate() == 0
        if relay is not None:
            assert relay.terminate() == 0
    # And at info the duplicate is counted and not logged, where the quarantined and rejected records are both
    events = {json.loads(line)["event"] for line in consumer.log().splitlines() if line.startswith("{")}
    assert {"record_quarantined", "record_rejected"} <= events
    assert "record_duplicate" not in events


async def test_log_lines_of_a_failing_record_carry_its_ids_and_never_its_payload(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a record whose customer lookups fail, with unmistakable text in its payload, and a malformed one
    downstream.fail_next("customers.get", times=1000, status=503)
    order = placed("L-1", customer="zz-very-secret-customer")
    order["items"][0]["sku"] = "sku-with-unmistakable-text"
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await produce(
        kafka,
        topics.source,
        [
            ("L-1", order, {"message-id": "L-1.1/order.placed", "traceparent": traceparent}),
            ("L-2", b"4111111111111111 unmistakable-bytes", {"message-id": "L-2.1"}),
        ],
        partition=0,
    )
    settings = settings_for(
        database_url, kafka, topics, customers_url=downstream.url, retry_tiers="", max_attempts=2, max_elapsed="2s"
    )

    # When the consumer fails them
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    try:
        await eventually(lambda: _logged(consumer, "record_quarantined", 2), timeout=60)
    finally:
        assert consumer.terminate() == 0

    # Then every line about them names the message id and failure id, with the trace id, and no payload
    lines = [json.loads(line) for line in consumer.log().splitlines() if line.startswith("{")]
    about = [line for line in lines if line.get("message_id") in ("L-1.1/order.placed", "L-2.1")]
    assert {line["event"] for line in about} >= {"record_failed", "record_quarantined"}
    for line in about:
        assert line["failure_id"] in (f"{topics.source}/0/0", f"{topics.source}/0/1")
    assert {line.get("trace_id") for line in about if line["message_id"] == "L-1.1/order.placed"} == {
        "0af7651916cd43dd8448eb211c80319c"
    }
    text = consumer.log()
    for secret in ("zz-very-secret-customer", "sku-with-unmistakable-text", "4111111111111111", "unmistakable-bytes"):
        assert secret not in text
    assert "Traceback" not in text


async def _when(port: int, name: str, outcome: str | None, expected: float) -> bool:
    try:
        samples = await scrape(port)
    except httpx.HTTPError:
        return False
    labels = {"outcome": outcome} if outcome else {}
    return value(samples, name, **labels) == expected


async def _scrape_when_refreshed(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    samples = await scrape(port)
    return samples if value(samples, "orders_outbox_pending") == 4 else None


async def _grown(port: int, name: str, above: float) -> float | None:
    current = value(await scrape(port), name)
    return current if current is not None and current > above else None


async def _logged(process: ServiceProcess, event: str, times: int) -> bool:
    return process.log().count(f'"{event}"') >= times
