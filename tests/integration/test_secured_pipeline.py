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
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import CUSTOMERS_GET, Downstream
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
    # And orders produced by the producers (placed, then shipped), one of them a customer the directory does not know,
    # one whose look-ups fail until its attempts are spent
    records = [(f"P-{n}", placed(f"P-{n}", customer=f"c-{n}")) for n in range(ORDERS)]
    records += [(f"P-{n}", shipped(f"P-{n}")) for n in range(ORDERS // 2)]
    records.append(("P-X", placed("P-X", customer="missing-1")))
    records.append(("P-Q", placed("P-Q", customer="c-q")))
    downstream.fail_next(CUSTOMERS_GET, times=3, key="c-q")
    await produce_as_admin(secured_kafka, topics.source, records)
    token = "operator-" + "t" * 32
    (tmp_path / "console-tokens").write_text(f"ann:operator:{token}\n")
    console_port = _free_port()
    console_env = env | {
        "ORDERS_CONSOLE_TOKENS_FILE": str(tmp_path / "console-tokens"),
        "ORDERS_CONSOLE_BIND": f"127.0.0.1:{console_port}",
    }

    # When consume, relay and effects run as the service's principal, over TLS to the database
    processes = [
        ServiceProcess.with_env(role, env, tmp_path / f"{role}.log") for role in ("consume", "relay", "effects")
    ]
    processes.append(ServiceProcess.with_env("console", console_env, tmp_path / "console.log"))
    try:
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM inbox", len(records) - 1), timeout=90)
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM quarantine WHERE status = 'open'", 1))
        # And the console shows the quarantined record, read over the same TLS
        quarantined = await eventually(lambda: _console_quarantine(console_port, token), timeout=30)
        assert len(quarantined) == 1, quarantined
        assert "P-Q" in json.dumps(quarantined), quarantined
        # And the CLI reprocesses it through the secured broker
        code, printed = await cli(
            env, "reprocess", "--error-code", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED", "--reason", "directory back", "--yes"
        )
        assert code == 0, printed
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM inbox", len(records)), timeout=90)
        await eventually(
            lambda: _count_is(engine, "SELECT count(*) FROM effects WHERE state = 'sent'", ORDERS + 1 + ORDERS // 2),
            timeout=90,
        )
        await eventually(lambda: _count_is(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL", 0))
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
    assert await scalar(engine, "SELECT status FROM quarantine") == "reprocessed"
    assert len(downstream.payments()) == ORDERS + 1
    published = await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.events}'")
    assert published >= ORDERS + 1  # a captured payment per order, at least
    assert await count_as_admin(secured_kafka, topics.events) == published
    assert await count_as_admin(secured_kafka, topics.rejected) == 1
    # And nothing anyone printed holds a secret
    printed_all = "".join(process.log() for process in processes)
    for secret in _secrets(secured_kafka, pg_tls):
        assert secret not in printed_all


async def _owned(admin: SecuredAdmin, topics: Topics) -> list[str]:
    return [name for name in await admin.topic_names() if topics.owns(name)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _console_quarantine(port: int, token: str) -> list[dict[str, Any]] | None:
    """The console API's open quarantine, or None while the console is not up."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            answer = await client.get(
                f"http://127.0.0.1:{port}/api/quarantine", headers={"Authorization": f"Bearer {token}"}
            )
    except httpx.TransportError:
        return None
    if answer.status_code != 200:
        return None
    items: list[dict[str, Any]] = answer.json()["items"]
    return items or None


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
