"""Effects-ledger helpers for tests: settings pointed at the fault-injecting downstream, a reconcile pass as a
process, and the effect rows, events and payment status to assert on."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.support import ROOT, Topics, env_for, rows, scalar, settings_for

LOCK_MESSAGE = "reconcile: another reconcile run holds the lock; nothing to do"


def effect_settings(
    database_url: str, kafka: str, topics: Topics, downstream: Downstream, **overrides: Any
) -> Settings:
    """Every downstream call goes to the test server; short HTTP timeout and lease so tests stay fast."""
    values: dict[str, Any] = {
        "customers_url": downstream.url,
        "payments_url": downstream.url,
        "emails_url": downstream.url,
        "http_timeout": "1s",
        "effect_lease": "3s",
    }
    return settings_for(database_url, kafka, topics, **(values | overrides))


@dataclass(frozen=True)
class Run:
    """What a finished `order-service reconcile` process left behind."""

    code: int
    stdout: str
    stderr: str


async def start_reconcile(settings: Settings) -> asyncio.subprocess.Process:
    """Start `order-service reconcile` as cron would; asynchronous so in-process loops keep running meanwhile."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        "reconcile",
        cwd=ROOT,
        env=env_for(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(process: asyncio.subprocess.Process) -> Run:
    """Wait for a reconcile process and collect what it printed."""
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Run(process.returncode, stdout.decode(), stderr.decode())


async def reconcile(settings: Settings) -> Run:
    """One reconcile pass as a process; it must succeed and print exactly its one summary line."""
    run = await finish(await start_reconcile(settings))
    assert run.code == 0, run.stderr
    assert len(run.stdout.splitlines()) == 1, run.stdout
    assert run.stdout.startswith("reconcile: ")
    return run


async def effect(engine: AsyncEngine, key: str) -> dict[str, Any]:
    """The effect row of this idempotency key."""
    [row] = await rows(engine, "SELECT * FROM effects WHERE idempotency_key = :key", key=key)
    return row


async def state_is(engine: AsyncEngine, key: str, state: str) -> bool:
    """Whether the effect is in `state`."""
    return await scalar(engine, "SELECT state FROM effects WHERE idempotency_key = :key", key=key) == state


async def called(downstream: Downstream, route: str, times: int, key: str | None = None) -> bool:
    """Whether the downstream saw exactly `times` calls of the route (for `key`)."""
    return downstream.calls(route, key) == times


async def events_in_outbox(engine: AsyncEngine, topics: Topics, event_type: str) -> list[dict[str, Any]]:
    """The events of this type written to the outbox for `<source>.events`."""
    payloads = await rows(engine, "SELECT payload FROM outbox WHERE topic = :topic", topic=topics.events)
    return [event for event in (json.loads(row["payload"]) for row in payloads) if event["type"] == event_type]


async def payment_status(engine: AsyncEngine, order_id: str) -> str | None:
    """The order's `payment_status`."""
    sql = "SELECT details->>'payment_status' FROM orders WHERE order_id = :order_id"
    return await scalar(engine, sql, order_id=order_id)
