"""The live system as operators see it: real processes write heartbeats to PostgreSQL (their partitions, lag and
breakers), `status` and the console's Processes page and overview show them, and a killed process shows as gone."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from dependency_injector import providers
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from service.config import Settings
from service.console.app import create_app
from service.console.web import Wiring
from service.containers import Container
from service.orders.domain import DOMAIN
from service.orders.fakes import Downstream
from service.worker.reprocess_run import Options, Progress, Report, Selection
from tests.conftest import KAFKA
from tests.support import ServiceProcess, Topics, cli, eventually, make_engine, produce, rows, settings_for
from tests.support.orders import placed

pytestmark = pytest.mark.slow

TOKEN = "viewer-token-" + "0f1e2d3c" * 5
BEARER = {"authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def console_client(engine: AsyncEngine, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The console application on this test's database, and a client for it."""
    container = Container(settings=settings, domain=DOMAIN)

    async def reprocess(owner: Settings, selection: Selection, options: Options, progress: Progress) -> Report:
        raise AssertionError("nothing here reprocesses")

    wiring = Wiring(
        settings=settings,
        engine=engine,
        effect_specs=container.effect_specs(),
        failing_field=container.failing_field(),
        reprocess=reprocess,
        codes=DOMAIN.error_codes,
    )
    app = create_app(wiring)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40_000))
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
            yield client


async def heartbeat_of(engine: AsyncEngine, pid: int) -> dict[str, Any] | None:
    found = await rows(engine, "SELECT * FROM processes WHERE pid = :pid", pid=pid)
    return found[0] if found else None


async def status_json(settings: Settings) -> dict[str, Any]:
    finished = await cli(settings, "status", "--json")
    document: dict[str, Any] = json.loads(finished.stdout)
    return document


def breaker_open(row: dict[str, Any] | None) -> bool:
    return row is not None and any(
        b["downstream"] == "customers" and b["state"] != "closed" for b in row["facts"]["breakers"]
    )


def lagging(row: dict[str, Any] | None, topic: str) -> bool:
    return row is not None and any(p["topic"] == topic and (p["lag"] or 0) > 0 for p in row["facts"]["partitions"])


async def test_a_consumer_behind_an_open_breaker_reports_its_partitions_lag_and_breaker_and_shows_gone_once_killed(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a customer directory that is down, and orders that need it
    downstream.outage("customers.get", 600.0)
    await produce(kafka, topics.source, [(f"P-{n}", placed(f"P-{n}", customer=f"c-{n}"), {}) for n in range(20)])
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        heartbeat_interval="300ms",
        max_elapsed="10m",
        max_attempts=50,
        http_timeout="1s",
        console_tokens=f"vic:viewer:{TOKEN}",
    )

    # When a consumer runs against it
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    pid = consumer.process.pid
    try:
        # Then its heartbeat row names its role, its partitions with their lag, and the open breaker
        row = await eventually(lambda: _when(engine, pid, topics.source), timeout=90)
        assert row["role"] == "consume"
        assert row["consumer_name"] == settings.consumer_name
        assert row["stopped_at"] is None
        assigned = {(p["topic"], p["partition"]) for p in row["facts"]["partitions"]}
        assert {(topics.source, n) for n in range(3)} <= assigned
        breaker = next(b for b in row["facts"]["breakers"] if b["downstream"] == "customers")
        assert breaker["state"] in {"open", "half_open"}
        assert breaker["code"] is not None

        # And `status --json` shows the same process live, its lag and its open breaker
        shown = await status_json(settings)
        mine = next(p for p in shown["processes"] if p["pid"] == pid)
        assert mine["status"] == "live"
        assert mine["role"] == "consume"
        assert shown["lag_by_topic"][topics.source] > 0
        assert any(b["downstream"] == "customers" and b["host"] == mine["host"] for b in shown["open_breakers"])
        assert shown["oldest_unprocessed_seconds"] is not None

        # And the console's Processes page, its API and the overview show them
        async with console_client(engine, settings) as console:
            page = await console.get("/processes", headers=BEARER)
            api = await console.get("/api/processes", headers=BEARER)
            overview = await console.get("/", headers=BEARER)
            refused = await console.get("/api/processes")
        assert page.status_code == 200
        assert f">{pid}</span>" in page.text
        assert "status-live" in page.text
        assert "customers" in page.text
        assert f"{topics.source}/0" in page.text
        assert api.status_code == 200
        assert any(p["pid"] == pid and p["status"] == "live" for p in api.json()["processes"])
        assert overview.status_code == 200
        assert 'id="open-breakers"' in overview.text
        assert "customers" in overview.text
        assert f'Lag <span class="id">{topics.source}</span>' in overview.text
        assert refused.status_code == 401
    finally:
        # When it is killed (no clean stop)
        consumer.kill()

    # Then, silent for more than three intervals, it shows as gone, and its breaker is no longer listed as open
    gone = await eventually(lambda: _status_of(settings, pid, "gone"), timeout=30)
    assert gone["open_breakers"] == [] or all(b["process_id"] != _id(gone, pid) for b in gone["open_breakers"])
    async with console_client(engine, settings) as console:
        page = await console.get("/processes", headers=BEARER)
    assert "status-gone" in page.text


async def test_a_cleanly_stopped_process_is_marked_stopped(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a relay that beats
    settings = settings_for(database_url, kafka, topics, heartbeat_interval="300ms")
    relay = ServiceProcess("relay", settings, tmp_path / "relay.log")
    pid = relay.process.pid
    try:
        row = await eventually(lambda: heartbeat_of(engine, pid), timeout=60)
        assert row["role"] == "relay"
    finally:
        # When it stops cleanly
        assert relay.terminate() == 0

    # Then its row says so, and `status` does not count it as live or gone
    shown = await status_json(settings)
    mine = next(p for p in shown["processes"] if p["pid"] == pid)
    assert mine["status"] == "stopped"
    assert mine["stopped_at"] is not None
    assert shown["live"] == 0
    assert shown["gone"] == 0


async def test_the_console_beats_as_role_console_and_is_marked_stopped_when_it_stops(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a console process (loopback, a viewer token) that beats every 300 ms
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = settings_for(
        database_url,
        kafka,
        topics,
        heartbeat_interval="300ms",
        console_bind=f"127.0.0.1:{port}",
        console_tokens=f"ana:viewer:{TOKEN}",
    )
    console = ServiceProcess("console", settings, tmp_path / "console.log")
    pid = console.process.pid
    try:
        # Then its row names it, with no partitions and no breakers open, and `status` counts it live
        row = await eventually(lambda: heartbeat_of(engine, pid), timeout=60)
        assert row["role"] == "console"
        assert row["facts"]["partitions"] == []
        live = await eventually(lambda: _status_of(settings, pid, "live"), timeout=30)
        assert live["live"] >= 1
    finally:
        # When it stops cleanly
        assert console.terminate() == 0, console.log()

    # Then its row says stopped
    stopped = await heartbeat_of(engine, pid)
    assert stopped is not None
    assert stopped["stopped_at"] is not None


async def _when(engine: AsyncEngine, pid: int, topic: str) -> dict[str, Any] | None:
    row = await heartbeat_of(engine, pid)
    return row if breaker_open(row) and lagging(row, topic) else None


async def _status_of(settings: Settings, pid: int, wanted: str) -> dict[str, Any] | None:
    shown = await status_json(settings)
    return shown if any(p["pid"] == pid and p["status"] == wanted for p in shown["processes"]) else None


def _id(shown: dict[str, Any], pid: int) -> str:
    return str(next(p["process_id"] for p in shown["processes"] if p["pid"] == pid))


async def test_a_heartbeat_that_cannot_reach_the_database_neither_raises_nor_waits_past_its_interval() -> None:
    # Given a heartbeat whose database does not answer (a port nothing listens on), at a 300 ms interval
    engine = make_engine("postgresql+asyncpg://postgres@127.0.0.1:1/nothing")
    settings = settings_for("postgresql+asyncpg://postgres@127.0.0.1:1/nothing", KAFKA, Topics("hb"))
    container = Container(
        settings=settings.model_copy(update={"heartbeat_interval": timedelta(milliseconds=300)}), domain=DOMAIN
    )
    container.engine.override(providers.Object(engine))
    heartbeat = container.heartbeat(role="consume")
    try:
        # When it beats three times
        started = time.monotonic()
        with capture_logs() as logs:
            for _ in range(3):
                await heartbeat.tick()
        took = time.monotonic() - started
    finally:
        await engine.dispose()

    # Then nothing was raised, none took longer than its interval, and the failure was logged once for the spell
    assert took < 3 * 0.3 + 0.5
    assert [line["event"] for line in logs if line["event"].startswith("heartbeat")] == ["heartbeat_failed"]
