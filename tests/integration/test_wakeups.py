"""Wake-ups on real PostgreSQL and Kafka: new outbox rows and effects wake the workers that found none.

Each test makes the workers' poll a minute long, so that only a notification can get a row through within the
test's deadline: without migration 0012's triggers (or with a waiter that misses them) these tests fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from service.store import outbox, wakeups
from service.store.outbox import OutboxMessage
from service.store.uow import UnitOfWork
from service.worker import effects as effect_worker
from service.worker import relay
from tests.support import Topics, eventually, produce, scalar, settings_for
from tests.support import running as running_parts
from tests.support.effects import effect_settings, state_is
from tests.support.orders import cancelled, placed

LONG_POLL = 60.0  # far beyond every deadline below


async def _add_row(engine: AsyncEngine, topic: str, n: int, *, commit: bool = True) -> None:
    async with UnitOfWork(engine) as uow:
        await outbox.add(uow.connection, [OutboxMessage(topic, "K", {"n": str(n)}, str(n).encode())])
        if commit:
            await uow.commit()


async def _woken(waiter: wakeups.Waiter, stop: asyncio.Event, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        await waiter.wait(stop, LONG_POLL)


async def test_a_committed_insert_wakes_every_waiter_and_a_rolled_back_one_wakes_none(
    engine: AsyncEngine, topics: Topics
) -> None:
    # Given two waiters of one process, listening on the outbox's channel
    stop = asyncio.Event()
    async with wakeups.Wakeups(engine, wakeups.OUTBOX) as woken:
        assert woken.listening
        first, second = woken.waiter(), woken.waiter()

        # When a transaction inserts a row and rolls back, then another inserts one and commits
        await _add_row(engine, topics.events, 1, commit=False)
        await _add_row(engine, topics.events, 2)

        # Then both waiters wake at once (the poll is a minute), and a second wait waits for the next commit
        await _woken(first, stop)
        await _woken(second, stop)
        with pytest.raises(TimeoutError):
            await _woken(first, stop, within=0.5)


async def _add_effects(engine: AsyncEngine, *effects: tuple[str, str]) -> None:
    """Effects (idempotency key, kind) inserted by one statement, as a round's write inserts them."""
    keys, kinds = [key for key, _ in effects], [kind for _, kind in effects]
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, payload)"
                " SELECT k, 'A-' || k, kind, '{}'"
                " FROM unnest(CAST(:keys AS text[]), CAST(:kinds AS text[])) AS v(k, kind)"
                " ON CONFLICT (idempotency_key) DO NOTHING"
            ),
            {"keys": keys, "kinds": kinds},
        )
        await uow.commit()


async def test_new_effects_wake_the_waiters_of_their_kind_and_not_the_others(engine: AsyncEngine) -> None:
    # Given a process's waiters for captures, for refunds, and for every kind (0014's trigger names the kinds)
    stop = asyncio.Event()
    async with wakeups.Wakeups(engine, wakeups.EFFECTS) as woken:
        captures, refunds, every = woken.waiter("capture"), woken.waiter("refund"), woken.waiter()

        # When one statement adds two captures
        await _add_effects(engine, ("K-1", "capture"), ("K-2", "capture"))

        # Then the capture waiter and the one for all kinds wake, and the refund waiter sleeps on
        await _woken(captures, stop)
        await _woken(every, stop)
        with pytest.raises(TimeoutError):
            await _woken(refunds, stop, within=0.5)

        # When a statement adds nothing (its keys exist already), then one adds a capture and a refund
        await _add_effects(engine, ("K-1", "refund"), ("K-2", "refund"))
        with pytest.raises(TimeoutError):
            await _woken(refunds, stop, within=0.5)
        await _add_effects(engine, ("K-3", "capture"), ("K-4", "refund"))

        # Then both kinds' waiters wake
        await _woken(captures, stop)
        await _woken(refunds, stop)

        # And a kind whose name is too long for a notification's payload is still inserted, and wakes every waiter
        await _add_effects(engine, ("K-5", "x" * 9000))
        for waiter in (captures, refunds, every):
            await _woken(waiter, stop)
        assert await scalar(engine, "SELECT count(*) FROM effects") == 5


async def test_a_waiter_listens_again_after_the_database_dropped_its_connection(
    engine: AsyncEngine, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a listening process whose listening connection the database terminates
    monkeypatch.setattr(wakeups, "_RELISTEN_SECONDS", 0.1)
    stop = asyncio.Event()
    async with wakeups.Wakeups(engine, wakeups.EFFECTS) as woken:
        waiter = woken.waiter()
        terminated = await scalar(
            engine,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()",
        )
        assert terminated == 1
        await _woken(waiter, stop)  # the loss itself wakes the waiters: they look once

        # When its next waits have let it listen again
        async def listening_again() -> bool:
            await waiter.wait(stop, 0.05)
            return woken.listening

        await eventually(listening_again, timeout=10)

        # Then an insert wakes it again, through the new connection
        await _add_row(engine, topics.events, 1)  # an outbox row: no effect notification
        async with UnitOfWork(engine) as uow:
            await uow.connection.exec_driver_sql("NOTIFY effects_rows_added")
            await uow.commit()
        await _woken(waiter, stop)


async def test_a_row_written_while_the_relay_is_idle_is_published_without_waiting_for_its_poll(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a relay that has published everything and polls only once a minute
    monkeypatch.setattr(relay, "_IDLE_POLL_SECONDS", LONG_POLL)
    settings = settings_for(database_url, kafka, topics)
    async with running_parts(settings, "relay"):
        await _add_row(engine, topics.events, 1)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

        # When a round writes one more row
        await _add_row(engine, topics.events, 2)

        # Then it is published within seconds, not at the next poll
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 2 FROM outbox WHERE published_at IS NOT NULL"), timeout=10
        )


async def test_at_a_trickle_the_relay_claims_once_for_what_came_and_once_to_find_the_outbox_drained(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an idle relay whose claims are counted (it wakes only by notification here)
    monkeypatch.setattr(relay, "_IDLE_POLL_SECONDS", LONG_POLL)
    claims: list[int] = []
    claim = outbox.claim

    async def counted(*args: Any, **kwargs: Any) -> outbox.Claim:
        claimed = await claim(*args, **kwargs)
        claims.append(len(claimed.rows))
        return claimed

    monkeypatch.setattr(outbox, "claim", counted)
    settings = settings_for(database_url, kafka, topics)
    async with running_parts(settings, "relay"):

        async def looked() -> bool:
            return bool(claims)

        await eventually(looked)
        claims.clear()

        # When rows come one at a time, each after the one before was published
        for n in range(1, 11):
            await _add_row(engine, topics.events, n)
            await eventually(
                lambda n=n: scalar(engine, "SELECT count(*) = :n FROM outbox WHERE published_at IS NOT NULL", n=n),
                timeout=10,
            )

    # Then each row took one claim, and one more found the outbox drained: a short batch is not followed by a claim
    # while it is in flight (which would find nothing, its key being busy), only by one after it settled
    assert sum(claims) == 10
    assert len(claims) <= 2 * 10 + 1, claims


async def test_an_order_consumed_while_the_effect_workers_are_idle_is_captured_and_published_at_once(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the whole pipeline, idle after one order went through, with the workers polling once a minute
    monkeypatch.setattr(relay, "_IDLE_POLL_SECONDS", LONG_POLL)
    monkeypatch.setattr(effect_worker, "_IDLE_POLL_SECONDS", LONG_POLL)
    settings = effect_settings(database_url, kafka, topics, downstream)
    async with running_parts(settings, "consumer_loop", "relay", "effect_worker"):
        await produce(kafka, topics.source, [("W-1", placed("W-1"), {})], partition=0)
        await eventually(lambda: state_is(engine, "W-1/payment.capture", "sent"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

        # When the next order arrives
        await produce(kafka, topics.source, [("W-2", placed("W-2"), {})], partition=0)

        # Then its capture is sent and both its events are published within seconds, not at the next poll
        await eventually(lambda: state_is(engine, "W-2/payment.capture", "sent"), timeout=10)
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 2 FROM outbox WHERE key = 'W-2' AND published_at IS NOT NULL"),
            timeout=10,
        )
    assert downstream.calls("payments.post", "W-2/payment.capture") == 1


async def test_a_refund_waiting_for_its_capture_is_claimed_as_soon_as_the_capture_is_sent(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given effect workers that poll once a minute, and an order placed and cancelled whose capture the provider
    # answers only after half a second: its refund is inserted (and looked at) while the capture is in flight
    monkeypatch.setattr(effect_worker, "_IDLE_POLL_SECONDS", LONG_POLL)
    capture, refund = "WR-1/payment.capture", "WR-1/payment.refund"
    downstream.delay_next("payments.post", seconds=0.5, key=capture)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("WR-1", placed("WR-1"), {}), ("WR-1", cancelled("WR-1"), {})], partition=0)
    async with running_parts(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: state_is(engine, refund, "pending"))
        assert downstream.calls("payments.post", refund) == 0

        # When the capture is sent (an update: no insert notifies the refund's lanes)
        await eventually(lambda: state_is(engine, capture, "sent"))

        # Then the refund is made within seconds, not at the next poll
        await eventually(lambda: state_is(engine, refund, "sent"), timeout=10)
    assert downstream.calls("payments.post", refund) == 1
