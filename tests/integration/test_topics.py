"""Topics are declared, not auto-created (contract §11): `topics plan`, `topics apply`, `topics acls`, and the start-up
check of long-running and short commands, on the real broker. Each test starts from topics that do not exist."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.support import (
    ServiceProcess,
    Topics,
    cli,
    delete_topics,
    eventually,
    produce,
    scalar,
    settings_for,
)
from tests.support.orders import placed

DAY_MS = 86_400_000
# The topics commands never connect to the database: a URL of nothing proves it.
NO_DATABASE = "postgresql+asyncpg://postgres@127.0.0.1:1/none"


@pytest.fixture
async def fresh(kafka: str) -> AsyncIterator[Topics]:
    """Topic names of which none exists yet; whatever the test makes of them is deleted after it."""
    topics = Topics(f"t{uuid.uuid4().hex[:10]}")
    yield topics
    await delete_topics(kafka, topics)


def _settings(kafka: str, topics: Topics, database_url: str = NO_DATABASE, **values: Any) -> Settings:
    return settings_for(database_url, kafka, topics, **({"retry_tiers": "1s"} | values))


async def _create(kafka: str, *topics: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        response = await admin.create_topics(list(topics))
    finally:
        await admin.close()
    assert [code for _, code, *_ in response.topic_errors] == [0] * len(topics)


async def _described(kafka: str, name: str) -> tuple[int, dict[str, str]]:
    """A topic's partition count and the configs set on it (not the broker's defaults)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        (metadata,) = [topic for topic in await admin.describe_topics([name]) if topic["topic"] == name]
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    finally:
        await admin.close()
    (resource,) = response.resources
    return len(metadata["partitions"]), {entry[0]: entry[1] for entry in resource[4] if entry[3] == 1}


def _deleted_after_days(days: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(days * DAY_MS)}


async def _plan(settings: Settings) -> dict[str, Any]:
    return json.loads((await cli(settings, "topics", "plan", "--json")).stdout)  # type: ignore[no-any-return]


async def test_plan_shows_every_missing_topic_and_check_fails_until_apply_created_them(
    kafka: str, fresh: Topics
) -> None:
    # Given a source topic of 4 partitions that its producers made, and none of the derived topics
    await _create(kafka, NewTopic(fresh.source, 4, 1))
    settings = _settings(kafka, fresh)

    # When the plan is asked for
    plan = await _plan(settings)
    checked = await cli(settings, "topics", "plan", "--check", check=False)

    # Then every derived topic is missing and would be created like the source, and --check fails
    derived = [fresh.retry("1s"), fresh.quarantine, fresh.reprocess, fresh.rejected, fresh.events]
    assert plan["missing"] == derived
    assert [(t["topic"], t["exists"], t["action"], t["declared_partitions"]) for t in plan["topics"]] == [
        (fresh.source, True, "none", 4),
        *((name, False, "create", 4) for name in derived),
    ]
    assert checked.returncode == 1
    assert "missing: " in checked.stdout

    # When apply runs, twice
    first = await cli(settings, "topics", "apply")
    second = await cli(settings, "topics", "apply")

    # Then it created them with the source's partitions and the declared configs, and the second run did nothing
    assert first.stdout.count("created ") == len(derived)
    assert second.stdout.strip() == "every declared topic exists as declared; nothing to do"
    assert await _described(kafka, fresh.quarantine) == (
        4,
        {"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
    )
    assert await _described(kafka, fresh.retry("1s")) == (
        4,
        {"cleanup.policy": "delete", "retention.ms": str(8 * DAY_MS)},
    )
    assert await _described(kafka, fresh.events) == (4, {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)})
    assert (await cli(settings, "topics", "plan", "--check")).returncode == 0


async def test_apply_creates_the_source_only_with_create_source(kafka: str, fresh: Topics) -> None:
    # Given no topic at all, and ORDERS_TOPIC_PARTITIONS=2 with the broker's default replication factor
    settings = _settings(kafka, fresh, topic_partitions=2)

    # When apply runs without --create-source
    without = await cli(settings, "topics", "apply")

    # Then the derived topics exist, the source does not, and apply says why
    plan = await _plan(settings)
    assert plan["missing"] == [fresh.source]
    assert f"left {fresh.source}: it does not exist; its producers own it (--create-source creates it)" in (
        without.stdout.splitlines()
    )

    # When it runs with --create-source
    await cli(settings, "topics", "apply", "--create-source")

    # Then the source exists too, with the declared partitions and no configs of the service's
    assert (await _plan(settings))["missing"] == []
    assert await _described(kafka, fresh.source) == (2, {})
    assert [topic["replication_factor"] for topic in (await _plan(settings))["topics"]] == [1] * 6


async def test_a_topic_with_other_configs_is_reported_and_changed_only_with_alter(kafka: str, fresh: Topics) -> None:
    # Given every topic, the quarantine topic kept one day and with a size limit its platform team set
    settings = _settings(kafka, fresh)
    await _create(
        kafka,
        NewTopic(fresh.source, 1, 1),
        NewTopic(fresh.quarantine, 1, 1, topic_configs={"retention.ms": str(DAY_MS), "max.message.bytes": "2000000"}),
    )
    await cli(settings, "topics", "apply")

    # When plan and apply run
    plan = await _plan(settings)
    checked = await cli(settings, "topics", "plan", "--check", check=False)
    applied = await cli(settings, "topics", "apply")

    # Then plan reports the difference, --check fails, and apply leaves it as it is
    (quarantine,) = [topic for topic in plan["topics"] if topic["topic"] == fresh.quarantine]
    assert (quarantine["action"], quarantine["apply_flag"]) == ("alter", "--alter")
    assert {"name": "retention.ms", "current": str(DAY_MS), "declared": str(30 * DAY_MS)} in quarantine["configs"]
    assert plan["drifted"] == [fresh.quarantine]
    assert checked.returncode == 1
    assert applied.stdout.strip() == (
        f"left {fresh.quarantine}: retention.ms is {DAY_MS}, declared {30 * DAY_MS} (--alter changes it)"
    )
    assert (await _described(kafka, fresh.quarantine))[1]["retention.ms"] == str(DAY_MS)

    # When apply runs with --alter
    altered = await cli(settings, "topics", "apply", "--alter")

    # Then the declared configs are set and the topic's own other config is kept
    assert altered.stdout.strip() == f"altered {fresh.quarantine}: retention.ms {DAY_MS} -> {30 * DAY_MS}"
    assert await _described(kafka, fresh.quarantine) == (
        1,
        {"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS), "max.message.bytes": "2000000"},
    )
    assert (await cli(settings, "topics", "plan", "--check")).returncode == 0


async def test_a_topic_with_more_partitions_than_declared_is_never_lowered(kafka: str, fresh: Topics) -> None:
    # Given a retry tier topic of 8 partitions, and ORDERS_TOPIC_PARTITIONS=2
    settings = _settings(kafka, fresh, topic_partitions=2)
    tier = fresh.retry("1s")
    await _create(kafka, NewTopic(tier, 8, 1, topic_configs={"retention.ms": str(8 * DAY_MS)}))

    # When apply runs, with every flag
    applied = await cli(settings, "topics", "apply", "--create-source", "--alter")

    # Then the others are created with 2 partitions and the tier keeps its 8, with a note that says so
    assert (await _described(kafka, tier))[0] == 8
    assert (await _described(kafka, fresh.events))[0] == 2
    assert f"note: {tier} has 8 partitions, declared 2: apply never changes a partition count" in (
        applied.stdout.splitlines()
    )
    assert (await cli(settings, "topics", "plan", "--check")).returncode == 0


async def test_acls_prints_exactly_the_contracts_bindings(kafka: str, fresh: Topics) -> None:
    settings = _settings(kafka, fresh, consumer_name="billing")

    shown = json.loads((await cli(settings, "topics", "acls", "--principal", "User:svc", "--json")).stdout)
    lines = (await cli(settings, "topics", "acls", "--principal", "User:svc")).stdout.splitlines()
    refused = await cli(settings, "topics", "acls", "--principal", "svc", check=False)

    expected = [
        ("READ", "TOPIC", fresh.source, "LITERAL"),
        ("WRITE", "TOPIC", fresh.source, "LITERAL"),
        ("DESCRIBE", "TOPIC", fresh.source, "LITERAL"),
        ("DESCRIBE_CONFIGS", "TOPIC", fresh.source, "LITERAL"),
        ("READ", "TOPIC", f"{fresh.source}.", "PREFIXED"),
        ("WRITE", "TOPIC", f"{fresh.source}.", "PREFIXED"),
        ("DESCRIBE", "TOPIC", f"{fresh.source}.", "PREFIXED"),
        ("DESCRIBE_CONFIGS", "TOPIC", f"{fresh.source}.", "PREFIXED"),
        ("READ", "GROUP", "billing", "LITERAL"),
        ("DESCRIBE", "GROUP", "billing", "LITERAL"),
    ]
    assert [
        (b["operation"], b["resource_type"], b["resource_name"], b["pattern_type"], b["principal"], b["permission"])
        for b in shown["bindings"]
    ] == [(*binding, "User:svc", "ALLOW") for binding in expected]
    assert lines[1:] == [
        f"ALLOW\tUser:svc\t*\t{operation}\t{kind}\t{pattern}\t{name}" for operation, kind, name, pattern in expected
    ]
    assert refused.returncode == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _ready(port: int) -> int:
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code
    except httpx.TransportError:
        return 0


def _lines(process: ServiceProcess, event: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, _json_lines(process)) if line.get("event") == event]


def _json_lines(process: ServiceProcess) -> list[str]:
    return [line for line in process.log().splitlines() if line.startswith("{")]


async def test_consume_started_before_apply_says_what_is_missing_is_not_ready_and_works_once_applied(
    engine: AsyncEngine, database_url: str, kafka: str, fresh: Topics, tmp_path: Path
) -> None:
    # Given the source topic its producers made, with a record on it, and none of the derived topics
    await _create(kafka, NewTopic(fresh.source, 1, 1))
    await produce(kafka, fresh.source, [("P-1", placed("P-1"), {})])
    port = _free_port()
    settings = _settings(kafka, fresh, database_url, metrics_port=port)

    # When consume starts before `topics apply`
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    try:

        async def said_twice() -> bool:
            return len(_lines(consumer, "topics_missing")) >= 2

        await eventually(said_twice, timeout=60)

        # Then it says which topics it reads are missing and what to run, once per backoff step, and is not ready
        said = _lines(consumer, "topics_missing")
        assert [line["missing"] for line in said[:2]] == [[fresh.retry("1s"), fresh.reprocess]] * 2
        assert [line["retry_in_seconds"] for line in said[:2]] == [1.0, 2.0]
        assert "order-service topics apply" in said[0]["fix"]
        assert await _ready(port) == 503
        assert consumer.process.poll() is None

        # When the topics are applied
        await cli(settings, "topics", "apply")

        # Then it starts working: the record is processed, and it is ready
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM inbox WHERE status = 'processed'"))

        async def ready() -> bool:
            return await _ready(port) == 200

        await eventually(ready)
    finally:
        assert consumer.terminate() == 0
    assert "Traceback" not in consumer.log()


async def test_a_reprocess_run_whose_topic_is_missing_exits_1_with_one_line(
    engine: AsyncEngine, database_url: str, kafka: str, fresh: Topics
) -> None:
    # Given a broker without the reprocess topic
    settings = _settings(kafka, fresh, database_url)

    # When an operator starts a reprocess run
    finished = await cli(
        settings, "reprocess", "--error-code", "MALFORMED_PAYLOAD", "--reason", "fixed", "--yes", check=False
    )

    # Then it exits 1 with one line naming the topic and `topics apply`, and starts no run
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert finished.stderr.strip() == (
        f"order-service reprocess: topic {fresh.reprocess} does not exist: run `order-service topics apply`"
    )
    assert await scalar(engine, "SELECT count(*) FROM reprocess_runs") == 0
