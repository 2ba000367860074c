"""Claims at a steady rate are spaced (service/worker/spacing.py), and claims behind a backlog are not: the relay
and an effect kind's lanes tell their spacing when a claim came back full, and the next starts at once."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.containers import Container
from service.orders.domain import DOMAIN
from service.orders.fakes import Downstream
from service.store import outbox
from service.store.outbox import OutboxMessage
from service.store.uow import UnitOfWork
from service.worker import relay as relay_module
from service.worker.spacing import Spacing
from tests.support import Topics, eventually, produce, running, scalar, settings_for
from tests.support.effects import effect_settings
from tests.support.orders import placed

_LONG = 60.0  # a spacing no test could sit out: a claim that waited for it would fail the test's deadline


async def test_an_effect_kinds_next_claim_starts_at_once_after_a_full_one_and_waits_after_a_short_one(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given six pending captures, and lanes that claim four at a time (the concurrency, before any call set a pace)
    settings = effect_settings(database_url, kafka, topics, downstream, effect_concurrency=4)
    await produce(kafka, topics.source, [(f"S-{n}", placed(f"S-{n}"), {}) for n in range(6)], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 6 FROM effects WHERE state = 'pending'"))
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    spacing, stop = Spacing(_LONG), asyncio.Event()
    try:
        worker = await container.effect_worker()
        # When a lane takes its turn and claims a full batch
        async with asyncio.timeout(10):
            await spacing.turn(stop)
            first = await worker.work_once("payment.capture", spacing)
            # Then the next turn comes at once (a backlog), and that claim takes the rest
            await spacing.turn(stop)
            second = await worker.work_once("payment.capture", spacing)
        # And after that short claim, the next turn waits for the spacing
        waiting = asyncio.create_task(spacing.turn(stop))
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not done
        stop.set()
        await waiting
    finally:
        await container.shutdown_resources()
    assert (first, second) == (4, 2)
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'sent'") == 6


async def test_a_relay_behind_a_backlog_claims_batch_after_batch_without_waiting_for_the_spacing(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 250 unpublished rows, claims of 100, and a spacing no test could sit out
    monkeypatch.setattr(relay_module, "SPACING_SECONDS", _LONG)
    settings = settings_for(database_url, kafka, topics, relay_batch_size=100)
    messages = [OutboxMessage(topics.events, None, {"n": str(n)}, str(n).encode()) for n in range(250)]
    async with UnitOfWork(engine) as uow:
        await outbox.add(uow.connection, messages)
        await uow.commit()

    # When a relay runs
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    stop = asyncio.Event()
    try:
        relay = await container.relay()
        running_relay = asyncio.create_task(relay.run(stop))
        # Then every row is published well before one spacing: the two full claims did not wait for it
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    finally:
        stop.set()
        await asyncio.wait_for(running_relay, 30)
        await container.shutdown_resources()
