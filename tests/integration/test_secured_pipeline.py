"""The whole pipeline on secured infrastructure (contract §11): a broker that takes only SCRAM over TLS, mutual TLS or
OAUTHBEARER, with its authorizer on and no automatic topic creation, and a database role that may log in only over
TLS. The topics are declared by `topics apply` as the privileged principal; the service's own principal holds exactly
the bindings `topics acls` prints; every secret comes from a file; the database is reached with sslmode=verify-full.
Then the negative cases: each one line, its exit code, and no secret in anything printed.

Real processes (`python -m service …`), the secured broker of scripts/kafka-local-secured, the TLS role of
scripts/pg-local, the fault-injection server for the downstreams.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import ROOT, ServiceProcess, Topics, eventually, rows, scalar
from tests.support.orders import placed, shipped
from tests.support.secured import LISTENERS, Acl, Listener, PgTls, SecuredAdmin, SecuredKafka

pytestmark = pytest.mark.slow

ORDERS = 12


def service_env(
    kafka: SecuredKafka, listener: Listener, pg: PgTls, dbname: str, topics: Topics, downstream: Downstream
) -> dict[str, str]:
    """The service's environment: its principal on `listener`, the TLS database role, every secret from a file."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    return (
        env
        | kafka.kafka_env(listener, "service", secrets_in_files=True)
        | {
            "ORDERS_DATABASE_URL": pg.database_url(dbname, with_password=False),
            "ORDERS_DATABASE_PASSWORD_FILE": pg.password_file,
            "ORDERS_SOURCE_TOPIC": topics.source,
            "ORDERS_CONSUMER_NAME": f"{topics.source}-svc",
            "ORDERS_RETRY_TIERS": "1s",
            "ORDERS_MAX_ATTEMPTS": "3",
            "ORDERS_MAX_ELAPSED": "20s",
            "ORDERS_METRICS_PORT": "0",
            "ORDERS_CUSTOMERS_URL": downstream.url,
            "ORDERS_PAYMENTS_URL": downstream.url,
            "ORDERS_EMAILS_URL": downstream.url,
        }
    )


async def cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    """A short command: its exit code and everything it printed."""
    import asyncio
    import sys

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode() + err.decode()


async def produce_as_admin(kafka: SecuredKafka, topic: str, records: list[tuple[str, dict[str, Any]]]) -> None:
    """The producers own the source topic: here, the super user writes it."""
    producer = AIOKafkaProducer(**kafka.client_options("scram", "admin"), enable_idempotence=True)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, json.dumps(value).encode(), key=key.encode())
    finally:
        await producer.stop()


async def count_as_admin(kafka: SecuredKafka, topic: str) -> int:
    """How many records a topic holds (end offsets), read as the super user."""
    consumer = AIOKafkaConsumer(**kafka.client_options("scram", "admin"), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(await consumer._client._wait_on_metadata(topic))]
        ends = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


@pytest.mark.parametrize("listener", LISTENERS)
async def test_the_pipeline_runs_over_each_secured_listener_with_exactly_the_contracts_acls(
    listener: Listener,
    secured_kafka: SecuredKafka,
    secured_admin: SecuredAdmin,
    pg_tls: PgTls,
    tls_database_url: str,
    engine: AsyncEngine,
    downstream: Downstream,
    tmp_path: Path,
) -> None:
    topics = Topics(f"s{uuid.uuid4().hex[:10]}")
    dbname = make_url(tls_database_url).database or ""
    env = service_env(secured_kafka, listener, pg_tls, dbname, topics, downstream)

    # Given the topics declared by `topics apply` as the privileged principal (the service's may not create them)
    admin_env = env | secured_kafka.kafka_env(listener, "admin", secrets_in_files=True)
    code, printed = await cli(admin_env, "topics", "apply", "--create-source")
    secured_admin.track(await _owned(secured_admin, topics))
    assert code == 0, printed
    # And the service's principal holding exactly the bindings `topics acls` prints, nothing more
    code, printed = await cli(env, "topics", "acls", "--principal", "User:service", "--json")
    assert code == 0, printed
    bindings = [
        Acl(b["principal"], b["resource_type"], b["resource_name"], b["operation"], b["pattern_type"])
        for b in json.loads(printed[printed.index("{") :])["bindings"]
    ]
    await secured_admin.grant(*bindings)
    # And orders produced by the producers (placed, then shipped), one of them a customer the directory does not know
    records = [(f"P-{n}", placed(f"P-{n}", customer=f"c-{n}")) for n in range(ORDERS)]
    records += [(f"P-{n}", shipped(f"P-{n}")) for n in range(ORDERS // 2)]
    records.append(("P-X", placed("P-X", customer="missing-1")))
    await produce_as_admin(secured_kafka, topics.source, records)

    # When consume, relay and effects run as the service's principal, over TLS to the database
    processes = [
        ServiceProcess.with_env(role, env, tmp_path / f"{role}.log") for role in ("consume", "relay", "effects")
    ]
    try:
        await eventually(lambda: scalar(engine, "SELECT count(*) FROM inbox"), timeout=90)
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM inbox", len(records)), timeout=90)
        await eventually(
            lambda: _count_is(engine, "SELECT count(*) FROM effects WHERE state = 'sent'", ORDERS + ORDERS // 2),
            timeout=90,
        )
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL", 0))
        # And the CLI and the console read it over the same TLS
        code, printed = await cli(env, "quarantine", "stats", "--json")
        assert code == 0, printed
        for process in processes:
            assert process.process.poll() is None, process.log()[-3000:]
    finally:
        for process in processes:
            if process.process.poll() is None:
                process.terminate()

    # Then every record is terminal, each effect happened once, and the events are on the events topic
    assert await rows(engine, "SELECT status, count(*) AS n FROM inbox GROUP BY status ORDER BY status") == [
        {"status": "processed", "n": len(records) - 1},
        {"status": "rejected", "n": 1},
    ]
    assert len(downstream.payments()) == ORDERS
    published = await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.events}'")
    assert published >= ORDERS  # a captured payment per order, at least
    assert await count_as_admin(secured_kafka, topics.events) == published
    assert await count_as_admin(secured_kafka, topics.rejected) == 1
    # And nothing anyone printed holds a secret
    printed_all = "".join(process.log() for process in processes)
    for secret in _secrets(secured_kafka, pg_tls):
        assert secret not in printed_all


async def _owned(admin: SecuredAdmin, topics: Topics) -> list[str]:
    return [name for name in await admin.topic_names() if topics.owns(name)]


async def _count_is(engine: AsyncEngine, sql: str, expected: int) -> bool:
    return bool(await scalar(engine, sql) == expected)


def _secrets(kafka: SecuredKafka, pg: PgTls) -> list[str]:
    return [
        kafka.password("service"),
        kafka.password("admin"),
        kafka.client_secret("service"),
        kafka.client_secret("admin"),
        pg.password,
    ]
