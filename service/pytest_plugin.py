"""Fixtures for a domain's tests on real PostgreSQL and Kafka: a pytest plugin (the core's `pytest11` entry point),
so that a project built on the core tests its domain with the core's machinery and none of its own.

The project's conftest provides `domain` (its `Domain` value). The fixtures read where the infrastructure is from
the domain's variables: `<PREFIX>TEST_PG_HOST` (127.0.0.1), `<PREFIX>TEST_PG_PORT` (5432), `<PREFIX>TEST_PG_USER`
(postgres), `<PREFIX>TEST_DBNAME` (the program's name: the session's template database is named after it) and
`<PREFIX>TEST_KAFKA` (127.0.0.1:9092). A test gets a fresh copy of a database that the domain's migrations (the
core's history and the domain's branch) loaded once per session, and topic names no other test uses, deleted
after it. The helpers below (`service_env`, `produce`, `read_topic`, `fetch`, `eventually`) are plain functions,
so that a domain's tests need no event loop of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import UnknownTopicOrPartitionError
from pydantic import SecretStr

from service.ports import Domain
from service.store import schema

T = TypeVar("T")


@dataclass(frozen=True)
class Infrastructure:
    """Where the tests' PostgreSQL and Kafka are, as the domain's `<PREFIX>TEST_*` variables say."""

    pg_host: str
    pg_port: int
    pg_user: str
    dbname: str
    kafka: str

    def url(self, dbname: str) -> str:
        """The SQLAlchemy URL of a database on the tests' server."""
        return f"postgresql+asyncpg://{self.pg_user}@{self.pg_host}:{self.pg_port}/{dbname}"

    def dsn(self, dbname: str) -> str:
        """The same database as asyncpg names it."""
        return f"postgresql://{self.pg_user}@{self.pg_host}:{self.pg_port}/{dbname}"


@pytest.fixture(scope="session")
def domain() -> Domain:
    """The domain under test: a project's conftest returns its `DOMAIN`."""
    raise pytest.UsageError("define a session fixture `domain` in conftest.py that returns your DOMAIN")


@pytest.fixture(scope="session")
def infrastructure(domain: Domain) -> Infrastructure:
    """The tests' PostgreSQL and Kafka, from `<PREFIX>TEST_*`."""
    prefix = f"{domain.env_prefix}TEST_"
    return Infrastructure(
        pg_host=os.environ.get(f"{prefix}PG_HOST", "127.0.0.1"),
        pg_port=int(os.environ.get(f"{prefix}PG_PORT", "5432")),
        pg_user=os.environ.get(f"{prefix}PG_USER", "postgres"),
        dbname=os.environ.get(f"{prefix}DBNAME", domain.program.replace("-", "_") + "_test"),
        kafka=os.environ.get(f"{prefix}KAFKA", "127.0.0.1:9092"),
    )


@pytest.fixture(scope="session")
def migrated_template(domain: Domain, infrastructure: Infrastructure) -> Iterator[str]:
    """A database that `migrate` loaded (every head: the core's and the domain's), made once per session."""
    name = f"{infrastructure.dbname}_template"
    asyncio.run(_recreate(infrastructure, name, template=None))
    schema.upgrade_to_head(infrastructure.url(name), domain.migrations)
    yield name
    asyncio.run(_drop(infrastructure, name))


@pytest.fixture
def database_url(infrastructure: Infrastructure, migrated_template: str) -> Iterator[str]:
    """The SQLAlchemy URL of a fresh copy of the migrated database, dropped after the test."""
    name = f"{infrastructure.dbname}_{uuid.uuid4().hex[:10]}"
    asyncio.run(_recreate(infrastructure, name, template=migrated_template))
    yield infrastructure.url(name)
    asyncio.run(_drop(infrastructure, name))


@pytest.fixture(scope="session")
def kafka(infrastructure: Infrastructure) -> str:
    """The broker's bootstrap address; the test fails, not skips, when no broker answers there."""
    host, _, port = infrastructure.kafka.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            pass
    except OSError:
        pytest.fail(f"no Kafka broker at {infrastructure.kafka}")
    return infrastructure.kafka


@pytest.fixture
def source_topic(kafka: str) -> Iterator[str]:
    """A source topic name of this test's own; it and every `<source>.*` topic are deleted after the test (the
    service's `topics apply --create-source` creates them)."""
    source = f"t{uuid.uuid4().hex[:10]}"
    yield source
    asyncio.run(_delete_topics(kafka, source))


def service_env(domain: Domain, **settings: Any) -> dict[str, str]:
    """This process's environment without the domain's variables, and `settings` as them (for a service process)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(domain.env_prefix)}
    for name, value in settings.items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, timedelta):
            value = f"{value.total_seconds()}s"
        env[domain.variable(name)] = str(value)
    return env


def produce(bootstrap: str, topic: str, records: Iterable[tuple[str, bytes]]) -> None:
    """Send (key, value) records to the topic and wait until the broker has them."""

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic, value, key=key.encode())
        finally:
            await producer.stop()

    asyncio.run(send())


def read_topic(bootstrap: str, topic: str, *, expect: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The topic's first `expect` records' JSON values, read from the beginning; fails at the deadline."""

    async def read() -> list[dict[str, Any]]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        try:
            while len(found) < expect:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topic}: {len(found)} of {expect} records within {timeout}s")
                batches = await consumer.getmany(timeout_ms=200)
                found += [json.loads(record.value) for batch in batches.values() for record in batch]
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())


def fetch(database_url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The rows a query returns (asyncpg's `$1` parameters)."""

    async def query() -> list[dict[str, Any]]:
        connection = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [dict(row) for row in await connection.fetch(sql, *args)]
        finally:
            await connection.close()

    return asyncio.run(query())


def eventually(check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll `check` until it returns a truthy value, or fail at the deadline with its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(interval)
        value = check()
    return value


async def _recreate(infrastructure: Infrastructure, name: str, template: str | None) -> None:
    """Drop the database if it is there, then create it (as a copy of `template`)."""
    connection = await asyncpg.connect(infrastructure.dsn("postgres"))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        copy = f' TEMPLATE "{template}"' if template else ""
        await connection.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await connection.close()


async def _drop(infrastructure: Infrastructure, name: str) -> None:
    """Drop the database, with whoever is still connected to it."""
    connection = await asyncpg.connect(infrastructure.dsn("postgres"))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


async def _delete_topics(bootstrap: str, source: str) -> None:
    """Delete the source topic and every `<source>.*` topic; one gone meanwhile is no error."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if name == source or name.startswith(f"{source}.")]
        response = await admin.delete_topics(names) if names else None
    finally:
        await admin.close()
    gone = UnknownTopicOrPartitionError.errno
    refused = [(name, code) for name, code in response.topic_error_codes if code not in (0, gone)] if response else []
    if refused:
        raise AssertionError(f"the broker did not delete these topics (name, error code): {refused}")
