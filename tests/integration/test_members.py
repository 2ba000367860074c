"""Several members on one consumer name: exactly one member releases a parked record, and no retry row outlives
its record's terminal state (issue 13, finding 3). Real PostgreSQL; processors in this process, one container each,
so each is a member of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.codes import ErrorCode
from service.config import Settings
from service.containers import Container
from service.orders.domain import DOMAIN
from service.policy.delivery import RetryState
from service.policy.headers import from_json
from service.policy.records import SourceRecord
from service.policy.retry import AttemptHistory
from service.store import parking, retries
from service.store.parking import ParkedRecord
from service.store.retries import RetryRow
from service.worker.processor import Processor
from tests.support import Topics, cli, rows, scalar, settings_for


def placed(order_id: str) -> bytes:
    return orjson.dumps(
        {
            "schema": "order.placed.v1",
            "order_id": order_id,
            "tenant": "acme",
            "customer_id": "c-1",
            "currency": "EUR",
            "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 900}],
        }
    )


def cancelled(order_id: str) -> bytes:
    return orjson.dumps({"schema": "order.cancelled.v1", "order_id": order_id, "reason": "changed my mind"})


@pytest.fixture
def settings(database_url: str, kafka: str, topics: Topics) -> Settings:
    return settings_for(database_url, kafka, topics, ordering="key", retry_tiers="1s,2s", max_elapsed="60s")


async def _processors(settings: Settings, count: int) -> AsyncIterator[list[Processor]]:
    containers = [Container(settings=settings, domain=DOMAIN) for _ in range(count)]
    for container in containers:
        await container.init_resources()
    try:
        yield [await container.processor() for container in containers]
    finally:
        for container in containers:
            await container.shutdown_resources()


@pytest.fixture
async def members(settings: Settings) -> AsyncIterator[list[Processor]]:
    async for processors in _processors(settings, 2):
        yield processors


async def _execute(engine: AsyncEngine, sql: str, **params: object) -> None:
    async with engine.begin() as connection:
        await connection.execute(text(sql), params)


async def _park(engine: AsyncEngine, settings: Settings, key: str, count: int) -> None:
    records = [
        ParkedRecord(key, f"{key}.{n}/cancel", settings.source_topic, 0, 100 + n, 0, cancelled(key), [])
        for n in range(count)
    ]
    async with engine.begin() as connection:
        await parking.park(connection, settings.consumer_name, records)


async def _retry_row(engine: AsyncEngine, settings: Settings, message_id: str, key: str | None) -> None:
    now = datetime.now(UTC)
    row = RetryRow(
        message_id, key, f"{message_id}#f", 1, 1, now, now, now + timedelta(seconds=60), "DOWNSTREAM_TIMEOUT"
    )
    async with engine.begin() as connection:
        await retries.upsert(connection, settings.consumer_name, [row])


async def test_a_parked_key_is_released_by_exactly_one_member_until_it_lets_go_or_its_lease_ends(
    engine: AsyncEngine, settings: Settings, members: list[Processor]
) -> None:
    # Given three records parked behind a free key, and two members looking for releasable records
    await _park(engine, settings, "K", 3)
    first, second = members

    # When both ask at once
    taken = await asyncio.gather(first.releasable(set()), second.releasable(set()))

    # Then one member took all three, in order, and the other none
    counts = sorted(len(batch) for batch in taken)
    assert counts == [0, 3]
    holder, other = (first, second) if taken[0] else (second, first)
    assert [p.record.offset for p in max(taken, key=len)] == [100, 101, 102]
    # Asking again (its records in memory) renews the holder's claim and gives the other nothing
    assert await holder.releasable({"K"}) == []
    assert await other.releasable(set()) == []
    assert await scalar(engine, "SELECT count(DISTINCT claimed_by) FROM parked WHERE claimed_until > now()") == 1

    # When the holder lets go (it stops), the other member takes them
    await holder.let_go()
    assert len(await other.releasable(set())) == 3

    # And when the new holder's lease runs out (it stalled or died), the first one takes them back
    await _execute(engine, "UPDATE parked SET claimed_until = now() - interval '1 second'")
    assert len(await holder.releasable(set())) == 3


async def test_a_parked_record_whose_key_is_held_again_is_left_parked_and_unclaimed(
    engine: AsyncEngine, settings: Settings, members: list[Processor]
) -> None:
    # Given a claimed parked record whose key is blocked again before the member applies it
    await _park(engine, settings, "H", 1)
    member = members[0]
    [pending] = await member.releasable(set())
    await _execute(
        engine,
        "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)"
        " VALUES (:c, 'H', 'H#f', 'quarantined')",
        c=settings.consumer_name,
    )

    # When the member attempts it
    left = await member.attempt([pending], asyncio.Event())

    # Then it left memory, stays parked, and no member holds a claim on it any more
    assert left == {pending}
    assert await rows(engine, "SELECT ordering_key, claimed_by FROM parked") == [
        {"ordering_key": "H", "claimed_by": None}
    ]


async def test_a_late_hand_off_from_a_member_that_lost_the_race_leaves_no_retry_row_and_its_copy_cleans_up(
    engine: AsyncEngine, settings: Settings, members: list[Processor]
) -> None:
    # Given one record delivered to two members (a rebalance), and the revoked member's round, which decided on
    # a retry tier, in flight: its look-up found the record not terminal yet
    record = SourceRecord(settings.source_topic, 1, 7, 0, b"R", placed("R"), (("message-id", b"R.1/placed"),))
    new_owner, revoked = members
    late = revoked.pending(record)
    now = datetime.now(UTC)
    handing_over = RetryState(
        AttemptHistory(2, now, now), next_tier=timedelta(seconds=1), last_code=ErrorCode.DOWNSTREAM_TIMEOUT
    )
    looked_up = revoked._look_up

    async def new_owner_commits_meanwhile(*args: Any) -> Any:
        assert len(await new_owner.attempt([new_owner.pending(record)], asyncio.Event())) == 1
        return await looked_up(*args)

    revoked._look_up = new_owner_commits_meanwhile  # type: ignore[method-assign]

    # When the new owner applies the record between that look-up and the revoked member's write
    assert len((await revoked.attempt_round({late: handing_over}, asyncio.Event())).left) == 1

    # Then no retry row holds the key: the record is terminal
    assert await scalar(engine, "SELECT count(*) FROM retries") == 0
    assert await scalar(engine, "SELECT status FROM inbox WHERE message_id = 'R.1/placed'") == "processed"

    # And when a retry row did survive (the two transactions overlapped), the tier copy removes it on arrival
    await _retry_row(engine, settings, "R.1/placed", "R")
    [copy] = await rows(engine, "SELECT topic, headers, payload FROM outbox WHERE topic LIKE '%.retry.%'")
    delivered = SourceRecord(copy["topic"], 0, 0, 0, b"R", bytes(copy["payload"]), from_json(copy["headers"]))
    assert len(await new_owner.attempt([new_owner.pending(delivered)], asyncio.Event())) == 1
    assert await scalar(engine, "SELECT count(*) FROM retries") == 0
    assert await scalar(engine, "SELECT count(*) FROM orders WHERE order_id = 'R'") == 1


async def test_the_reconciler_sweeps_a_retry_row_whose_record_is_terminal(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given a processed record with a retry row left behind (its tier copy never came), and a live one
    await _execute(
        engine,
        "INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset, "
        "received_at) VALUES (:c, 'S.1', 'processed', 'orders', 0, 1, now())",
        c=settings.consumer_name,
    )
    await _retry_row(engine, settings, "S.1", "S")
    await _retry_row(engine, settings, "T.1", "T")

    # When the reconciler runs
    run = await cli(settings, "reconcile")

    # Then only the orphan is gone, and the summary says so
    assert "1 orphan retry rows removed" in run.stdout
    assert await rows(engine, "SELECT message_id FROM retries") == [{"message_id": "T.1"}]


async def test_parked_release_frees_a_key_held_by_a_retrying_head_which_keeps_its_retry_row(
    engine: AsyncEngine, settings: Settings, members: list[Processor]
) -> None:
    # Given a key held by a head in a retry tier, with two records parked behind it
    await _retry_row(engine, settings, "U.1", "U")
    await _park(engine, settings, "U", 2)
    listed = json.loads((await cli(settings, "parked", "list", "--json")).stdout)
    assert [(item["ordering_key"], item["retrying"], item["blocked_by"]) for item in listed] == [("U", "U.1", None)]
    assert "head in a retry tier U.1" in (await cli(settings, "parked", "list")).stdout
    assert await members[0].releasable(set()) == []

    # When an operator releases it
    released = json.loads((await cli(settings, "parked", "release", "U", "--json")).stdout)

    # Then the key is free, the head keeps retrying (its row stays, holding nothing), and its records are released
    assert released == {
        "key": "U",
        "consumer": settings.consumer_name,
        "released": True,
        "blocked_by": None,
        "retrying": ["U.1"],
        "parked": 2,
    }
    assert await rows(engine, "SELECT message_id, ordering_key FROM retries") == [
        {"message_id": "U.1", "ordering_key": None}
    ]
    assert len(await members[0].releasable(set())) == 2
    assert "being released by" in (await cli(settings, "parked", "list")).stdout
    again = await cli(settings, "parked", "release", "U")
    assert again.stdout.strip() == "U: nothing held it; its 2 parked records are released by a running consumer"


async def test_parked_release_of_a_key_nothing_holds_says_so_and_exits_1(
    settings: Settings, engine: AsyncEngine
) -> None:
    released = await cli(settings, "parked", "release", "NOBODY", check=False)
    assert released.returncode == 1
    assert released.stdout == ""
    assert released.stderr.strip() == "parked release: nothing holds NOBODY and nothing is parked behind it"


async def test_a_parked_record_delivered_again_is_parked_once(
    engine: AsyncEngine, settings: Settings, members: list[Processor]
) -> None:
    # Given a key held by a quarantined head, and a record of it that one member parked
    await _execute(
        engine,
        "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)"
        " VALUES (:c, 'P', 'P#f', 'quarantined')",
        c=settings.consumer_name,
    )
    record = SourceRecord(settings.source_topic, 0, 3, 0, b"P", cancelled("P"), (("message-id", b"P.2/cancel"),))
    first, second = members
    assert len(await first.attempt([first.pending(record)], asyncio.Event())) == 1

    # When it is delivered again, to the same or another member (its offset was not committed yet)
    assert len(await second.attempt([second.pending(record)], asyncio.Event())) == 1
    assert len(await first.attempt([first.pending(record)], asyncio.Event())) == 1

    # Then it is parked once
    assert await rows(engine, "SELECT message_id FROM parked") == [{"message_id": "P.2/cancel"}]


async def test_parked_release_looks_up_the_keys_in_memory_by_hash_in_a_generic_plan_too(engine: AsyncEngine) -> None:
    # Given the free-keys look-up as a prepared statement with its generic plan (the plan a connection's cache holds
    # after five runs), and 2,000 keys in memory
    positional = parking._FREE_KEYS.text
    for n, name in enumerate(("consumer", "exclude", "member", "keys"), start=1):
        positional = positional.replace(f":{name}", f"${n}")
    exclude = "ARRAY[" + ",".join(f"'k-{n}'" for n in range(2_000)) + "]"
    async with engine.connect() as connection:
        await connection.execute(text("SET plan_cache_mode = force_generic_plan"))
        await connection.exec_driver_sql(f"PREPARE free_keys (text, text[], text, int) AS {positional}")
        # When it is explained
        explained = (
            await connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) EXECUTE free_keys ('c', {exclude}, 'm', 50)")
        ).scalar()
        await connection.exec_driver_sql("DEALLOCATE free_keys")
        await connection.execute(text("RESET plan_cache_mode"))

    # Then the parked rows' filter looks each key up in a hash of the keys in memory, never compares it with each
    plan = json.dumps(json.loads(explained) if isinstance(explained, str) else explained)
    assert "ALL" not in plan, plan
    assert "hashed SubPlan" in plan, plan
