"""Fixtures shared by every test: a migrated template database (a fresh copy per test), the local Kafka
broker, unique topics per test, the downstream test server, and Jaeger for tracing tests.

`scripts/test` starts PostgreSQL (scripts/pg-local) and Kafka (scripts/kafka-local) and passes their
addresses in ORDERS_TEST_PG_PORT and ORDERS_TEST_KAFKA; the `jaeger` fixture starts Jaeger (scripts/jaeger-local)
itself, once per session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_postgresql import factories
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import Topics, create_topics, delete_topics, kafka_reachable, make_engine
from tests.support.jaeger import Jaeger, JaegerUnavailable, start_jaeger

# The secured broker and the TLS PostgreSQL role (contract §11): fixtures secured_kafka, secured_admin,
# secured_topics, pg_tls, tls_database_url.
pytest_plugins = ["tests.support.secured"]

ROOT = Path(__file__).resolve().parent.parent
PG_HOST = "127.0.0.1"
PG_PORT = int(os.environ.get("ORDERS_TEST_PG_PORT", "55432"))
KAFKA = os.environ.get("ORDERS_TEST_KAFKA", "127.0.0.1:19092")


def migrate(host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any) -> None:
    """Load the template database with `alembic upgrade heads` (the core's and the order domain's branch), exactly
    as `order-service migrate` does."""
    from service.orders.domain import DOMAIN
    from service.store.schema import upgrade_to_head

    upgrade_to_head(f"postgresql+asyncpg://{user}@{host}:{port}/{dbname}", DOMAIN.migrations)


def migrate_core(host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any) -> None:
    """Load the template database with the core's history alone, as a service of another domain starts from."""
    from service.store.schema import upgrade_to_head

    upgrade_to_head(f"postgresql+asyncpg://{user}@{host}:{port}/{dbname}")


DBNAME = os.environ.get("ORDERS_TEST_DBNAME", "order_service_test")
postgresql_noproc = factories.postgresql_noproc(
    host=PG_HOST, port=PG_PORT, user="postgres", dbname=DBNAME, load=[migrate]
)
postgresql = factories.postgresql("postgresql_noproc", dbname=DBNAME)
core_postgresql_noproc = factories.postgresql_noproc(
    host=PG_HOST, port=PG_PORT, user="postgres", dbname=f"{DBNAME}_core", load=[migrate_core]
)
core_postgresql = factories.postgresql("core_postgresql_noproc", dbname=f"{DBNAME}_core")


@pytest.fixture
def database_url(postgresql: Any) -> str:
    """The SQLAlchemy URL of this test's fresh, migrated database."""
    info = postgresql.info
    return f"postgresql+asyncpg://{info.user}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture
def core_database_url(core_postgresql: Any) -> str:
    """The SQLAlchemy URL of this test's fresh database migrated by the core's history alone (no domain's branch)."""
    info = core_postgresql.info
    return f"postgresql+asyncpg://{info.user}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on this test's database."""
    engine = make_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def kafka() -> str:
    """The bootstrap address of the local broker; the suite fails, not skips, when it is not running."""
    if not kafka_reachable(KAFKA):
        pytest.fail(f"no Kafka broker at {KAFKA}: run scripts/kafka-local start (scripts/test does)")
    return KAFKA


@pytest.fixture
async def topics(kafka: str) -> AsyncIterator[Topics]:
    """Fresh topic names for this test (source with 3 partitions), created on the broker and deleted after it.

    Deleted, because a broker keeps every partition's state in its heap: left there run after run, a suite's
    topics filled the local broker's (docs/performance.md, "The machine")."""
    topics = Topics(f"t{uuid.uuid4().hex[:10]}")
    await create_topics(kafka, topics)
    yield topics
    await delete_topics(kafka, topics)


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    """The fault-injecting downstream test server (customers, payments, emails)."""
    with Downstream() as server:
        yield server


@pytest.fixture(scope="session")
def jaeger() -> Jaeger:
    """Jaeger all-in-one with in-memory storage (scripts/jaeger-local, built once into the user's cache); the tests
    that need it fail, not skip, when it cannot be built or started."""
    try:
        return start_jaeger()
    except JaegerUnavailable as exc:
        reason = str(exc)
    pytest.fail(reason, pytrace=False)  # outside the except: the script's words alone, not a chain of tracebacks
