"""The outbox relay on real Kafka and PostgreSQL: broker outages, crashes, several relays, per-key order."""

from __future__ import annotations

import json
import random
import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import DefaultPartitioner
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.records import SourceRecord, pack_key, unpack_key
from service.store import outbox
from service.store.outbox import OutboxMessage
from service.store.uow import UnitOfWork
from tests.support import (
    ROOT,
    ServiceProcess,
    Topics,
    cli,
    eventually,
    make_engine,
    produce,
    quarantine_directly,
    read_topic,
    rows,
    running,
    scalar,
    settings_for,
)


def _invalid_records(topic: str, count: int) -> list[SourceRecord]:
    return [
        SourceRecord(topic, 0, offset, 1_785_000_000_000, f"K-{offset}".encode(), b"\x00 not json", ())
        for offset in range(count)
    ]


async def _create_topic(kafka: str, topic: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.create_topics([topic])
    finally:
        await admin.close()


def _kafka_local(command: str) -> None:
    subprocess.run([str(ROOT / "scripts" / "kafka-local"), command], check=True, capture_output=True, timeout=180)


async def test_envelopes_wait_in_the_outbox_while_the_broker_is_down_and_are_published_once_after(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    settings = settings_for(database_url, kafka, topics)
    relay = ServiceProcess("relay", settings, tmp_path / "relay.log")
    try:
        # Given a running relay and a broker that goes away
        await eventually(lambda: _log_contains(relay, "relay_started"))
        _kafka_local("stop")
        try:
            # When five records are quarantined meanwhile
            await quarantine_directly(settings, _invalid_records(topics.source, 5))
            # Then they wait in the outbox, and the relay says why, in one line per try
            await eventually(lambda: _log_contains(relay, "kafka_"), timeout=60)
            assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 5
        finally:
            _kafka_local("start")

        # And once the broker is back, each is published exactly once
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=120
        )
    finally:
        assert relay.terminate() == 0
    published = await read_topic(kafka, topics.quarantine, expect=5)
    failure_ids = Counter(dict(record.headers)["failure-id"].decode() for record in published)
    assert failure_ids == Counter({f"{topics.source}/0/{offset}": 1 for offset in range(5)})
    assert "Traceback" not in relay.log()


async def test_a_relay_killed_after_publishing_publishes_again_with_the_same_failure_id(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given one quarantine envelope in the outbox
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, _invalid_records(topics.source, 1))

    # When a relay dies (SIGKILL) after Kafka acknowledged and before it marked the row published
    doomed = ServiceProcess("relay", settings, tmp_path / "doomed.log", {"ORDERS_FAULT_CRASH_AT": "after-publish"})
    assert doomed.wait() == -9
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1

    # And a healthy relay takes over
    async with running(settings, "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then the envelope is on the topic twice with one failure id, and a deduplicating reader sees one
    published = await read_topic(kafka, topics.quarantine, expect=2)
    failure_ids = [dict(record.headers)["failure-id"].decode() for record in published]
    assert failure_ids == [f"{topics.source}/0/0", f"{topics.source}/0/0"]
    assert len({json.loads(record.value)["failureId"] for record in published}) == 1


async def test_two_relays_publish_every_row_once_and_keep_each_keys_order(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given 300 invalid records (missing tracking number) for 10 order keys: 300 envelopes to publish
    records = [
        (f"G-{n % 10}", {"schema": "order.shipped.v1", "order_id": f"G-{n % 10}", "carrier": "x"}, {})
        for n in range(300)
    ]
    await produce(kafka, topics.source, records, partition=0)
    settings = settings_for(database_url, kafka, topics, relay_batch_size=7)

    # When one consumer and two relays run at once
    async with running(settings, "consumer_loop", "relay"), running(settings, "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 300 FROM inbox"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then each envelope is published once, and per key in source order
    published = await read_topic(kafka, topics.quarantine, expect=300)
    offsets_by_key: dict[str, list[int]] = {}
    for record in published:
        offsets_by_key.setdefault(record.key.decode(), []).append(json.loads(record.value)["source"]["offset"])
    assert sum(len(offsets) for offsets in offsets_by_key.values()) == 300
    assert all(offsets == sorted(set(offsets)) for offsets in offsets_by_key.values())


@pytest.mark.parametrize("relays", [1, 2])
async def test_relays_publish_each_keys_rows_once_and_in_id_order_with_batches_in_flight(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, relays: int
) -> None:
    # Given 25 rows for each of 20 keys, interleaved, and 50 rows without a key, in batches of 7: a batch's keys
    # are in flight while the next ones are claimed, and two relays hand key slots over while they publish
    settings = settings_for(database_url, kafka, topics, relay_batch_size=7)
    messages = [OutboxMessage(topics.events, f"P-{n % 20}", {"n": str(n)}, str(n).encode()) for n in range(500)]
    messages += [OutboxMessage(topics.events, None, {"n": str(n)}, str(n).encode()) for n in range(500, 550)]
    await _outbox_rows(settings, messages)

    # When the relays run
    async with AsyncExitStack() as stack:
        for _ in range(relays):
            await stack.enter_async_context(running(settings, "relay"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then every row is on the topic once, and each key's rows in the order they were written
    published = await read_topic(kafka, topics.events, expect=550)
    numbers_by_key: dict[bytes | None, list[int]] = {}
    for record in published:
        numbers_by_key.setdefault(record.key, []).append(int(record.value))
    assert sorted(n for numbers in numbers_by_key.values() for n in numbers) == list(range(550))
    keyed = {key: numbers for key, numbers in numbers_by_key.items() if key is not None}
    assert len(keyed) == 20
    assert all(numbers == sorted(numbers) for numbers in keyed.values())


async def test_relays_share_the_key_slots_and_one_that_dies_leaves_its_slots_to_the_other(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    settings = settings_for(database_url, kafka, topics)
    first = ServiceProcess("relay", settings, tmp_path / "first.log")
    try:
        # Given two relays: they hold half of the key slots each
        second = ServiceProcess("relay", settings, tmp_path / "second.log")
        await eventually(lambda: _slots_by_relay(engine, [outbox.SLOTS // 2, outbox.SLOTS // 2]))

        # When one of them dies (SIGKILL)
        second.kill()

        # Then the other takes every slot, and publishes every key
        await eventually(lambda: _slots_by_relay(engine, [outbox.SLOTS]))
        await _outbox_rows(settings, [OutboxMessage(topics.events, f"S-{n}", {}, b"x") for n in range(100)])
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    finally:
        assert first.terminate() == 0
    assert "Traceback" not in first.log()


async def _slots_by_relay(engine: AsyncEngine, expected: list[int]) -> bool:
    """Whether the relays of this database hold these numbers of key slots (one session each)."""
    held = await scalar(
        engine,
        """
        SELECT coalesce(array_agg(slots ORDER BY slots), '{}') FROM (
            SELECT count(*) AS slots FROM pg_locks
            WHERE locktype = 'advisory' AND granted AND objsubid = 2
              AND classid = CAST(hashtext('outbox-relay-slot') AS oid)
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            GROUP BY pid) AS held
        """,
    )
    return bool(held == expected)


async def _log_contains(process: ServiceProcess, text: str) -> bool:
    return text in process.log()


async def _outbox_rows(settings: Settings, messages: list[OutboxMessage]) -> list[int]:
    """Write outbox rows directly, as a round would."""
    engine = make_engine(settings.database_url.get_secret_value())
    try:
        async with UnitOfWork(engine) as uow:
            ids = await outbox.add(uow.connection, messages)
            await uow.commit()
        return ids
    finally:
        await engine.dispose()


async def test_a_row_kafka_refuses_for_its_size_is_set_aside_and_every_other_row_flows(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a topic that takes at most 4 KB a batch, and rows for it (and another topic) around one that is
    # larger than that even compressed; and a 3 MB row that compresses below the broker's default limit
    small_topic = f"{topics.source}.small"
    await _create_topic(kafka, NewTopic(small_topic, 1, 1, topic_configs={"max.message.bytes": "4096"}))
    settings = settings_for(database_url, kafka, topics)
    incompressible = random.Random(7).randbytes(20_000)
    [_, too_large, *_] = await _outbox_rows(
        settings,
        [
            OutboxMessage(small_topic, "K", {"n": "1"}, b"before"),
            OutboxMessage(small_topic, "K", {"n": "2"}, incompressible),
            OutboxMessage(small_topic, "K", {"n": "3"}, b"after"),
            OutboxMessage(topics.events, "L", {"n": "4"}, b"other"),
            OutboxMessage(topics.events, "M", {"n": "5"}, b"a" * 3_000_000),
        ],
    )

    # When a relay runs
    async with running(settings, "relay"):
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 4 FROM outbox WHERE published_at IS NOT NULL"), timeout=60
        )
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM outbox WHERE set_aside_at IS NOT NULL"))

        # Then the refused row is set aside with its code, and the others are published, in key order
        assert await scalar(engine, f"SELECT set_aside_code FROM outbox WHERE id = {too_large}") == "MESSAGE_TOO_LARGE"
        published = await read_topic(kafka, small_topic, expect=2, timeout=10)
        assert [record.value for record in published] == [b"before", b"after"]
        others = await read_topic(kafka, topics.events, expect=2, timeout=10)
        assert sorted(len(record.value) for record in others) == [5, 3_000_000]

        # And an operator sees it, and can hand it back (Kafka refuses it again: it is set aside again)
        listed = json.loads((await cli(settings, "outbox", "set-aside", "--json")).stdout)
        assert [(row["id"], row["code"], row["payload_bytes"]) for row in listed] == [
            (too_large, "MESSAGE_TOO_LARGE", 20_000)
        ]
        put_back = json.loads((await cli(settings, "outbox", "put-back", str(too_large), "--json")).stdout)
        assert put_back == {"id": too_large, "put_back": True}
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM outbox WHERE set_aside_at IS NOT NULL"))


async def test_a_row_kafka_refuses_with_another_code_is_set_aside_and_every_other_row_flows(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a compacted topic, and rows for it around one without a key: Kafka refuses it with INVALID_RECORD (a code
    # aiokafka does not know; before Kafka 2.5, CORRUPT_MESSAGE), not for its size
    compacted = f"{topics.source}.compacted"
    await _create_topic(kafka, NewTopic(compacted, 1, 1, topic_configs={"cleanup.policy": "compact"}))
    settings = settings_for(database_url, kafka, topics)
    [_, keyless, *_] = await _outbox_rows(
        settings,
        [
            OutboxMessage(compacted, "K", {"n": "1"}, b"before"),
            OutboxMessage(compacted, None, {"n": "2"}, b"no key"),
            OutboxMessage(compacted, "K", {"n": "3"}, b"after"),
            OutboxMessage(topics.events, "L", {"n": "4"}, b"other"),
        ],
    )

    # When a relay runs
    relay = ServiceProcess("relay", settings, tmp_path / "relay.log")
    try:
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 3 FROM outbox WHERE published_at IS NOT NULL"), timeout=60
        )

        # Then the refused row is set aside as invalid, and the others are published, in key order
        assert await scalar(engine, "SELECT array_agg(id) FROM outbox WHERE set_aside_at IS NOT NULL") == [keyless]
        assert await scalar(engine, f"SELECT set_aside_code FROM outbox WHERE id = {keyless}") == "MESSAGE_INVALID"
        published = await read_topic(kafka, compacted, expect=2, timeout=10)
        assert [record.value for record in published] == [b"before", b"after"]
        assert [record.value for record in await read_topic(kafka, topics.events, expect=1, timeout=10)] == [b"other"]
    finally:
        assert relay.terminate() == 0
    # And the log says which answer set it aside
    lines = [json.loads(line) for line in relay.log().splitlines() if "outbox_row_set_aside" in line]
    assert [(line["outbox_id"], line["error"]) for line in lines] in (
        [(keyless, "InvalidRecordError")],  # Kafka 2.5 and later
        [(keyless, "CorruptRecordException")],
    )
    assert "Traceback" not in relay.log()


@pytest.mark.parametrize("relays", [1, 2])
async def test_the_rows_of_a_topic_the_broker_does_not_have_wait_and_every_other_row_flows(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path, relays: int
) -> None:
    # Given rows of key K for the events topic around one for a topic the broker does not have and will not create
    # (this broker creates topics on demand, so the name is one Kafka does not take), and one of key L
    missing = f"{topics.source}.no such topic"
    settings = settings_for(database_url, kafka, topics)
    [_, waiting, *_] = await _outbox_rows(
        settings,
        [
            OutboxMessage(topics.events, "K", {"n": "1"}, b"1"),
            OutboxMessage(missing, "K", {"n": "2"}, b"2"),
            OutboxMessage(topics.events, "K", {"n": "3"}, b"3"),
            OutboxMessage(topics.events, "L", {"n": "4"}, b"4"),
        ],
    )

    # When one relay runs, or two that share the key slots (and hand them over as the second starts)
    running_relays = [ServiceProcess("relay", settings, tmp_path / f"relay-{n}.log") for n in range(relays)]
    try:
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 3 FROM outbox WHERE published_at IS NOT NULL"), timeout=60
        )
        published = await read_topic(kafka, topics.events, expect=3, timeout=10)

        # Then the other rows are published, K's in their order, and the missing topic's row waits, not set aside
        assert [record.value for record in published if record.key == b"K"] == [b"1", b"3"]
        assert await scalar(
            engine, f"SELECT published_at IS NULL AND set_aside_at IS NULL FROM outbox WHERE id = {waiting}"
        )
        await eventually(lambda: _any_log_contains(running_relays, "outbox_topic_missing"))
    finally:
        assert [relay.terminate() for relay in running_relays] == [0] * relays
    # And a relay that found the topic missing said so once, for its one row, and none restarted for it
    for relay in running_relays:
        lines = [json.loads(line) for line in relay.log().splitlines() if line.startswith("{")]
        assert [(line["topic"], line["rows"]) for line in lines if line["event"] == "outbox_topic_missing"] in (
            [],
            [(missing, 1)],
        )
        assert [line["event"] for line in lines].count("relay_started") == 1
        assert "Traceback" not in relay.log()


async def _any_log_contains(processes: Sequence[ServiceProcess], text: str) -> bool:
    return any(text in process.log() for process in processes)


async def test_a_refused_batch_is_not_overtaken_by_the_next_batch_of_its_partition(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a topic that takes at most 100 KB a batch, and four rows for it that fill two of the relay's batches:
    # K1 and J2 (300 KB that does not compress: the broker refuses their batch), then K3 (300 KB that compresses
    # well) and K4. A fresh idempotent producer whose first batch was refused has no sequence at the broker, which
    # would take the next batch.
    small_topic = f"{topics.source}.small"
    await _create_topic(kafka, NewTopic(small_topic, 1, 1, topic_configs={"max.message.bytes": "100000"}))
    settings = settings_for(database_url, kafka, topics)
    await _outbox_rows(
        settings,
        [
            OutboxMessage(small_topic, "K", {"n": "1"}, b"first"),
            OutboxMessage(small_topic, "J", {"n": "2"}, random.Random(3).randbytes(300_000)),
            OutboxMessage(small_topic, "K", {"n": "3"}, b"a" * 300_000),
            OutboxMessage(small_topic, "K", {"n": "4"}, b"last"),
        ],
    )

    # When a relay runs
    async with running(settings, "relay"):
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 3 FROM outbox WHERE published_at IS NOT NULL"), timeout=60
        )
        published = await read_topic(kafka, small_topic, expect=3, timeout=10)

    # Then J2 is set aside, and K's rows are on the topic in their order: the second batch waited for the first
    assert [dict(record.headers)["n"] for record in published] == [b"1", b"3", b"4"]
    assert await scalar(engine, "SELECT set_aside_code FROM outbox WHERE set_aside_at IS NOT NULL") == (
        "MESSAGE_TOO_LARGE"
    )


async def test_the_relay_puts_each_row_on_the_partition_kafkas_own_partitioner_picks(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a topic of 8 partitions, and rows the relay batches itself (it picks each row's partition): keyed by
    # their ordering key, copies of records keyed with other bytes (the original key, byte-exact, even empty), and
    # copies of records that had no key (published without one, on the partition of their ordering key)
    wide = f"{topics.source}.wide"
    await _create_topic(kafka, NewTopic(wide, 8, 1))
    settings = settings_for(database_url, kafka, topics)
    rng = random.Random(17)
    messages = [OutboxMessage(wide, f"order-{n}", {"n": str(n)}, b"keyed") for n in range(40)]
    messages += [
        OutboxMessage(wide, f"order-{n}", {"n": str(40 + n)}, b"copy", kafka_key=pack_key(rng.randbytes(n % 9)))
        for n in range(40)
    ]
    messages += [
        OutboxMessage(wide, f"order-{n}", {"n": str(80 + n)}, b"keyless", kafka_key=pack_key(None)) for n in range(40)
    ]
    await _outbox_rows(settings, messages)

    # When a relay publishes them
    async with running(settings, "relay"):
        published = await read_topic(kafka, wide, expect=len(messages), timeout=60)

    # Then each went out once, with its key as stored, on the partition the Java client's and aiokafka's default
    # partitioner give that key (for a copy without a key: the one its ordering key gives)
    assert len(published) == len(messages)
    by_n = {dict(record.headers)["n"].decode(): record for record in published}
    partitions = list(range(8))
    for n, message in enumerate(messages):
        record = by_n[str(n)]
        assert message.key is not None
        kafka_key = unpack_key(message.kafka_key) if message.kafka_key is not None else message.key.encode()
        assert record.key == kafka_key
        picked_by = kafka_key if kafka_key is not None else message.key.encode()
        assert record.partition == DefaultPartitioner()(picked_by, partitions, partitions), f"row {n}"


def _rows_handled(plan: dict[str, Any]) -> int:
    """Rows a plan's nodes returned or dropped by a filter, over every loop of each (EXPLAIN ANALYZE gives means)."""
    per_loop = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0)
    return round(per_loop * plan["Actual Loops"]) + sum(_rows_handled(child) for child in plan.get("Plans", []))


async def _backlog_after_statistics_of_a_relay_that_kept_up(engine: AsyncEngine, *, rows_per_key: int) -> None:
    """20,000 published rows, ANALYZE, then 6,000 unpublished ones (keys `late-N`), `rows_per_key` of each key."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO outbox (topic, key, headers, payload, published_at)"
                " SELECT 't', 'done-' || (n / :per_key), '{}', 'x', now() FROM generate_series(0, 19999) AS n"
            ),
            {"per_key": rows_per_key},
        )
        await connection.execute(text("ANALYZE outbox"))
        await connection.execute(
            text(
                "INSERT INTO outbox (topic, key, headers, payload)"
                " SELECT 't', 'late-' || (n / :per_key), '{}', 'x' FROM generate_series(0, 5999) AS n"
            ),
            {"per_key": rows_per_key},
        )


async def _claim_and_plan(
    engine: AsyncEngine, limit: int, busy: Sequence[str] = ()
) -> tuple[list[outbox.ClaimedRow], dict[str, Any]]:
    """A claim by a relay holding every slot, then the plan of the same statement run again (EXPLAIN ANALYZE)."""
    async with UnitOfWork(engine) as uow:
        claimed = (await outbox.claim(uow.connection, limit, range(outbox.SLOTS), busy)).rows
    slots = list(range(outbox.SLOTS))
    parameters = {"limit": limit, "slots": slots, "busy": list(busy), "max_bytes": outbox.CLAIM_BYTES, "missing": []}
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(outbox._INDEX_WALK)
        explained = await uow.connection.scalar(text("EXPLAIN (ANALYZE, FORMAT JSON)" + outbox._CLAIM.text), parameters)
    return claimed, (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]


async def test_a_claim_far_into_a_backlog_reads_none_of_the_rows_published_before_it(engine: AsyncEngine) -> None:
    # Given a backlog of 30,000 rows whose statistics were taken before the relay began (every row unpublished: a
    # burst or an outage, then autovacuum's ANALYZE), of which the relay then published the first 24,000
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO outbox (topic, key, headers, payload)"
                " SELECT 't', 'k-' || (n / 2), '{}', 'x' FROM generate_series(0, 29999) AS n"
            )
        )
        await connection.execute(text("ANALYZE outbox"))
        await connection.execute(
            text("UPDATE outbox SET published_at = now() WHERE id <= (SELECT min(id) + 23999 FROM outbox)")
        )
    first_ids = [row["id"] for row in await rows(engine, "SELECT id FROM outbox WHERE published_at IS NULL")]

    # When a relay holding every slot claims a full batch (the statement as the relay runs it, and its plan)
    claimed, plan = await _claim_and_plan(engine, 1_000)

    # Then it takes the next 1,000 rows, and its plan handles a few rows per row claimed: with these statistics the
    # primary key and the unpublished rows' index look alike to the planner, and a walk of the primary key up to the
    # batch read every row published before it (24 a row claimed here; 300 behind a backlog of 300,000)
    assert [row.id for row in claimed] == sorted(first_ids)[:1_000]
    assert _rows_handled(plan) <= 20 * 1_000, json.dumps(plan, indent=1)


async def test_a_claim_behind_a_backlog_reads_only_each_keys_earlier_rows_whatever_the_statistics_say(
    engine: AsyncEngine,
) -> None:
    # Given an outbox whose statistics were taken while the relay kept up (every row published), then a backlog
    # (a broker outage, a burst): 6,000 unpublished rows, two of each key, as an order's two events
    await _backlog_after_statistics_of_a_relay_that_kept_up(engine, rows_per_key=2)
    first_ids = [row["id"] for row in await rows(engine, "SELECT id FROM outbox WHERE published_at IS NULL")]

    # When a relay holding every slot claims a full batch (the statement as the relay runs it, and its plan)
    claimed, plan = await _claim_and_plan(engine, 1_000)

    # Then it takes the backlog's first 1,000 rows, in id order, and its plan handles a few rows per row claimed
    # (about eight): a look-up per claimed row of the earlier unpublished rows of its key walked, with these
    # statistics, every earlier unpublished row of any key (about 500 a row here, 1,500 behind a relay's batches
    # in flight), and a claim took most of a second
    assert [row.id for row in claimed] == sorted(first_ids)[:1_000]
    assert _rows_handled(plan) <= 20 * 1_000, json.dumps(plan, indent=1)


async def test_a_claim_leaves_the_rows_of_a_missing_topic_and_takes_their_keys_rows_of_other_topics(
    engine: AsyncEngine,
) -> None:
    # Given rows of keys K and J for a topic the broker does not have, and K's and L's for a topic it has
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(
            uow.connection,
            [
                OutboxMessage("missing", "K", {}, b"1"),
                OutboxMessage("present", "K", {}, b"2"),
                OutboxMessage("missing", "J", {}, b"3"),
                OutboxMessage("present", "L", {}, b"4"),
            ],
        )
        await uow.commit()

    # When a relay that knows the topic is missing claims
    async with UnitOfWork(engine) as uow:
        claimed = (await outbox.claim(uow.connection, 10, range(outbox.SLOTS), missing=["missing"])).rows

    # Then it takes the other topic's rows, K's too: a missing topic's row does not hold its key's other rows back
    assert [row.id for row in claimed] == [ids[1], ids[3]]


@pytest.mark.parametrize(("held", "taken"), [(0, [1, 3]), (2, [0, 1, 3])], ids=["first", "second"])
async def test_a_claim_takes_a_keys_rows_only_up_to_one_another_transaction_holds(
    engine: AsyncEngine, held: int, taken: list[int]
) -> None:
    # Given two keys' rows, interleaved (K, L, K, L), and another transaction holding one of K's rows (a relay that
    # lost its slot mid-batch, or an older relay without slots): K's first, or K's second
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(
            uow.connection,
            [OutboxMessage("t", key, {"n": str(n)}, b"x") for n, key in enumerate(["K", "L", "K", "L"])],
        )
        await uow.commit()
    async with engine.connect() as holder:
        await holder.execute(text("SELECT id FROM outbox WHERE id = :id FOR UPDATE"), {"id": ids[held]})

        # When a relay holding every slot claims
        async with UnitOfWork(engine) as uow:
            claimed = [row.id for row in (await outbox.claim(uow.connection, 10, range(outbox.SLOTS))).rows]
        await holder.rollback()

    # Then it takes L's rows, and K's only up to the held one: a later row would overtake it
    assert claimed == [ids[n] for n in taken]
    # And once the row is let go, the next claim takes every row, in id order
    async with UnitOfWork(engine) as uow:
        assert [row.id for row in (await outbox.claim(uow.connection, 10, range(outbox.SLOTS))).rows] == ids


async def test_a_claim_stops_at_its_bytes_and_the_next_claim_overtakes_no_row_it_left_locked(
    engine: AsyncEngine,
) -> None:
    # Given seven rows of 1,003 bytes (a payload of 1,000, headers `{}` and a key of one), of keys K L K L K L M
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(uow.connection, [OutboxMessage("t", key, {}, b"x" * 1_000) for key in "KLKLKLM"])
        await uow.commit()

    # When a relay claims four rows with room for 2,500 bytes, and another claims while the first is open
    async with UnitOfWork(engine) as first:
        taken = await outbox.claim(first.connection, 4, range(outbox.SLOTS), max_bytes=2_500)
        async with UnitOfWork(engine) as second:
            more = await outbox.claim(second.connection, 10, range(outbox.SLOTS))

    # Then the first takes rows until it holds 2,500 bytes (the third crosses it), and says it is full: the fourth
    # stays locked, unread
    assert [row.id for row in taken.rows] == ids[:3]
    assert taken.full
    # And the second takes M's row only: K's and L's later rows would overtake the rows the first holds
    assert [row.id for row in more.rows] == ids[6:]
    assert not more.full


@pytest.mark.parametrize(
    ("limit", "max_bytes", "taken", "full"),
    [(5, 10, 1, True), (5, 3_012, 3, True), (5, 3_013, 4, True), (9, 1_000_000, 7, False), (7, 1_000_000, 7, True)],
)
async def test_a_claims_first_row_goes_whatever_its_size_and_full_says_whether_a_limit_stopped_it(
    engine: AsyncEngine, limit: int, max_bytes: int, taken: int, full: bool
) -> None:
    # Given seven rows of 1,004 bytes each (a payload of 1,000, headers `{}` and a key of two)
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(uow.connection, [OutboxMessage("t", f"K{n}", {}, b"x" * 1_000) for n in range(7)])
        await uow.commit()

    # When a relay claims with these limits
    async with UnitOfWork(engine) as uow:
        claimed = await outbox.claim(uow.connection, limit, range(outbox.SLOTS), max_bytes=max_bytes)

    # Then it takes rows in id order while fewer than `max_bytes` came before, at least one
    assert [row.id for row in claimed.rows] == ids[:taken]
    assert claimed.full is full


async def test_a_claim_looks_up_the_keys_in_flight_by_hash_in_a_generic_plan_too(engine: AsyncEngine) -> None:
    # Given 3,000 unpublished rows, the first 2,000 of keys in flight (a relay's batches behind a backlog), and the
    # claim as a prepared statement with its generic plan, the plan a connection's cache holds after five runs
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO outbox (topic, key, headers, payload)"
                " SELECT 't', 'k-' || n, '{}', 'x' FROM generate_series(0, 2999) AS n"
            )
        )
    busy = [f"k-{n}" for n in range(2_000)]
    positional = outbox._CLAIM.text
    for n, name in enumerate(("slots", "busy", "limit", "max_bytes", "missing"), start=1):
        positional = positional.replace(f":{name}", f"${n}")
    async with UnitOfWork(engine) as uow:
        c = uow.connection
        await c.execute(outbox._INDEX_WALK)
        await c.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        await c.exec_driver_sql(f"PREPARE claim_generic (int[], text[], int, bigint, text[]) AS {positional}")
        slots = "ARRAY[" + ",".join(str(slot) for slot in range(outbox.SLOTS)) + "]"
        keys = "ARRAY[" + ",".join(f"'{key}'" for key in busy) + "]"
        arguments = f"{slots}, {keys}, 500, {outbox.CLAIM_BYTES}, '{{}}'"
        # When it claims 500 rows
        explained = (
            await c.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_generic ({arguments})")
        ).scalar()
        claimed = [row[0] for row in await c.exec_driver_sql(f"EXECUTE claim_generic ({arguments})")]
        await c.exec_driver_sql("DEALLOCATE claim_generic")

    # Then it takes rows of other keys only, and each row walked looks its key up in a hash of the keys in flight:
    # compared one by one (`key <> ALL(…)`, in a generic plan), a claim behind five batches of 2,000 took 0.65 s
    assert len(claimed) == 500
    assert all(
        key not in set(busy)
        for key in (row["key"] for row in await rows(engine, f"SELECT key FROM outbox WHERE id = ANY(ARRAY{claimed})"))
    )
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    walk = next(node["Filter"] for node in _nodes(plan) if "hashtext" in node.get("Filter", ""))
    assert "hashed SubPlan" in walk, walk
    assert "key <> ALL" not in walk, walk


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan's nodes, depth first."""
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


async def test_a_claim_counts_the_bytes_of_a_copys_original_key(engine: AsyncEngine) -> None:
    # Given five copies of records with an empty value and a key of 1,000 bytes (kept as it came: a key that long
    # has its order's id as the ordering key), 1,003 bytes each as stored
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(
            uow.connection,
            [OutboxMessage("t", f"O-{n}", {}, b"", kafka_key=pack_key(b"k" * 1_000)) for n in range(5)],
        )
        await uow.commit()

    # When a relay claims with room for 2,500 bytes
    async with UnitOfWork(engine) as uow:
        claimed = await outbox.claim(uow.connection, 10, range(outbox.SLOTS), max_bytes=2_500)

    # Then the keys count: it takes three rows (2,006 bytes before the third), not all five
    assert [row.id for row in claimed.rows] == ids[:3]
    assert claimed.full


async def test_with_statistics_of_a_relay_that_kept_up_a_claim_rejects_other_keys_rows_by_hash(
    engine: AsyncEngine,
) -> None:
    # Given statistics taken while the relay kept up (every row published), then a backlog of 6,000 rows of which
    # the first 2,000 are held by the relay's batches in flight (locked, their keys busy)
    await _backlog_after_statistics_of_a_relay_that_kept_up(engine, rows_per_key=1)
    in_flight = [f"late-{n}" for n in range(2_000)]
    async with engine.connect() as holder:
        await holder.execute(text("SELECT id FROM outbox WHERE key = ANY(:keys) FOR UPDATE"), {"keys": in_flight})

        # When the relay claims its next batch (the statement as the relay runs it, and its plan)
        claimed, plan = await _claim_and_plan(engine, 2_000, in_flight)
        await holder.rollback()

    # Then it takes the next 2,000 rows, and wherever its plan reads the claimed keys' rows by walking ids, a hash of
    # those keys rejects the other rows before the array of them (never hashed) is compared with each
    assert [row.key for row in claimed] == [f"late-{n}" for n in range(2_000, 4_000)]
    filters = [node["Filter"] for node in _nodes(plan) if "key = ANY" in node.get("Filter", "")]
    for walked in filters:
        # (`NOT (key NOT IN (…))` reads as a hashed look-up of the key; the `NOT (hashed …)` is the claimed ids')
        assert re.search(r"(?<!NOT )\(hashed SubPlan \d+\).*key = ANY", walked), walked
