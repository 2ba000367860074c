"""Every long-running process survives a PostgreSQL restart and a broker restart without exiting, and resumes on
its own (each test prints how long it took).

Regression of issue 13: relays exited on `CannotConnectNowError: the database system is shutting down`, which
the unit of work did not take for an outage (it matched exception classes, not SQLSTATEs).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import ROOT, ServiceProcess, Topics, eventually, produce, rows, scalar, settings_for

pytestmark = pytest.mark.slow


def placed(order_id: str) -> dict[str, object]:
    """An `order.placed.v1` for a known tenant and an active customer."""
    return {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": "acme",
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 700}],
    }


def pg_local(command: str) -> None:
    """Stop or start the test cluster itself (`pg_ctl -m fast`: sessions end with an admin shutdown)."""
    subprocess.run([str(ROOT / "scripts" / "pg-local"), command], check=True, capture_output=True, timeout=120)


async def test_consume_relay_and_effects_survive_a_database_restart_and_resume_on_their_own(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given the three long-running processes at work
    settings = settings_for(
        database_url, kafka, topics, customers_url=downstream.url, payments_url=downstream.url, max_elapsed="60s"
    )
    processes = [ServiceProcess(role, settings, tmp_path / f"{role}.log") for role in ("consume", "relay", "effects")]
    try:
        await produce(kafka, topics.source, [(f"P-{n}", placed(f"P-{n}"), {}) for n in range(5)])
        await eventually(lambda: scalar(engine, "SELECT count(*) = 5 FROM effects WHERE state = 'sent'"), timeout=60)

        # When PostgreSQL restarts under them, and records arrive while it is down
        pg_local("stop")
        try:
            await produce(kafka, topics.source, [(f"Q-{n}", placed(f"Q-{n}"), {}) for n in range(5)])
        finally:
            pg_local("start")
        back = time.monotonic()
        await engine.dispose()  # this test's own pooled connections died with the server

        # Then every process is still running, and the new records are applied, published and paid
        await eventually(lambda: scalar(engine, "SELECT count(*) = 10 FROM effects WHERE state = 'sent'"), timeout=60)
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=60
        )
        resumed = time.monotonic() - back
        for process in processes:
            assert process.process.poll() is None, process.log()[-3000:]
        # No record spent an attempt on the outage
        assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status <> 'processed'") == 0
        print(json.dumps({"resumed_within_seconds": round(resumed, 1)}))
    finally:
        for process in processes:
            if process.process.poll() is None:
                process.terminate()


def kafka_local(command: str) -> None:
    """Stop or start the local broker itself (same port, same data)."""
    subprocess.run([str(ROOT / "scripts" / "kafka-local"), command], check=True, capture_output=True, timeout=300)


async def test_consume_relay_and_effects_survive_a_broker_restart_and_resume_on_their_own(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given the three long-running processes at work
    settings = settings_for(
        database_url, kafka, topics, customers_url=downstream.url, payments_url=downstream.url, max_elapsed="60s"
    )
    processes = [ServiceProcess(role, settings, tmp_path / f"{role}.log") for role in ("consume", "relay", "effects")]
    try:
        await produce(kafka, topics.source, [(f"P-{n}", placed(f"P-{n}"), {}) for n in range(5)])
        await eventually(lambda: scalar(engine, "SELECT count(*) = 5 FROM effects WHERE state = 'sent'"), timeout=60)

        # When the broker restarts under them
        kafka_local("stop")
        kafka_local("start")
        back = time.monotonic()
        await produce(kafka, topics.source, [(f"Q-{n}", placed(f"Q-{n}"), {}) for n in range(5)])

        # Then every process is still running, and the new records are applied, published and paid
        await eventually(lambda: scalar(engine, "SELECT count(*) = 10 FROM effects WHERE state = 'sent'"), timeout=90)
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=90
        )
        resumed = time.monotonic() - back
        for process in processes:
            assert process.process.poll() is None, process.log()[-3000:]
        # No record spent an attempt on the outage
        assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status <> 'processed'") == 0
        assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
        print(json.dumps({"broker_resumed_within_seconds": round(resumed, 1)}))
    finally:
        for process in processes:
            if process.process.poll() is None:
                process.terminate()
    assert "Traceback" not in "".join(process.log() for process in processes)


async def test_records_waiting_in_a_tier_through_a_broker_outage_longer_than_their_budget_are_applied_after_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a record whose customer look-up fails twice (in place, then once more after the broker outage), a 3 s
    # tier and an 8 s elapsed budget, and the consumer and relay at work
    downstream.fail_next("customers.get", times=2, status=503, key="c-late")
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        retry_tiers="3s",
        blocking_attempts=1,
        max_attempts=5,
        max_elapsed="8s",
    )
    processes = [ServiceProcess(role, settings, tmp_path / f"{role}.log") for role in ("consume", "relay")]
    try:
        await produce(kafka, topics.source, [("T-1", placed("T-1") | {"customer_id": "c-late"}, {})])
        await eventually(lambda: _true(downstream.calls("customers.get", "c-late") >= 1), timeout=60)
        failed_at = time.monotonic()

        # When the broker goes away while the record waits for its tier, for longer than its whole budget
        kafka_local("stop")
        try:
            await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - failed_at)))  # the outage's length
        finally:
            kafka_local("start")

        # Then its tier copy is attempted after the outage, fails once more, and is retried, not quarantined: the
        # outage (the copy's wait past its due time) did not count against its budget
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM inbox"), timeout=120)
        for process in processes:
            assert process.process.poll() is None, process.log()[-3000:]
    finally:
        for process in processes:
            if process.process.poll() is None:
                process.terminate()
    assert await rows(engine, "SELECT status, error_code FROM inbox") == [{"status": "processed", "error_code": None}]
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
    assert downstream.calls("customers.get", "c-late") == 3


async def _true(value: bool) -> bool:
    return value
