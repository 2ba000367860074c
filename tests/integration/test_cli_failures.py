"""Every CLI command against each failure condition, as a real subprocess: one line on stderr, no stack trace,
the documented exit code (README, Commands; contract §10). Issue 14."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.codes import ErrorCode
from service.config import Settings
from service.policy.delivery import RetryState
from service.policy.records import SourceRecord
from tests.support import ServiceProcess, Topics, cli, eventually, order_service, rows, running, settings_for

# Commands that read or change the store and end on their own.
SHORT = [
    ("quarantine", "list"),
    ("quarantine", "show", "orders/0/1"),
    ("quarantine", "stats"),
    ("quarantine", "annotate", "orders/0/1", "--note", "n", "--author", "me"),
    ("quarantine", "resolve", "orders/0/1", "--reason", "r"),
    ("parked", "list"),
    ("parked", "release", "K-1"),
    ("effects", "list"),
    ("effects", "show", "A-1/payment.capture"),
    ("effects", "retry", "A-1/payment.capture", "--reason", "r"),
    ("quarantine", "annotate", "--error-code", "INVALID_FIELD", "--note", "n", "--dry-run"),
    ("reprocess", "list"),
    ("reprocess", "show", "R-1"),
    ("outbox", "set-aside"),
    ("outbox", "put-back", "1"),
    ("reconcile",),
    ("reprocess", "--reason", "r", "--error-code", "INVALID_FIELD", "--dry-run"),
]
LONG = ["consume", "relay", "effects", "run"]


def _url(settings: Settings, database: str) -> str:
    return settings.database_url.get_secret_value().rsplit("/", 1)[0] + f"/{database}"


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def base(database_url: str, kafka: str, topics: Topics) -> Settings:
    return settings_for(database_url, kafka, topics, metrics_port=0)


@pytest.fixture
async def unmigrated(engine: AsyncEngine, base: Settings) -> AsyncIterator[Settings]:
    name = f"empty_{uuid.uuid4().hex[:10]}"
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield base.model_copy(update={"database_url": _url(base, name)})
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.mark.parametrize("command", [*SHORT, *((name,) for name in LONG)], ids=" ".join)
async def test_a_database_that_does_not_exist_is_one_line_and_exit_1(base: Settings, command: tuple[str, ...]) -> None:
    settings = base.model_copy(update={"database_url": _url(base, "no_such_database")})
    finished = await cli(settings, *command, check=False)
    line = _one_line(finished.stderr)
    assert finished.returncode == 1, finished.stderr
    assert 'database "no_such_database" does not exist' in line
    assert line.startswith("order-service ")


@pytest.mark.parametrize("command", [*SHORT, *((name,) for name in LONG)], ids=" ".join)
async def test_a_database_that_is_not_migrated_says_run_migrate_and_exit_1(
    unmigrated: Settings, command: tuple[str, ...]
) -> None:
    finished = await cli(unmigrated, *command, check=False)
    line = _one_line(finished.stderr)
    assert finished.returncode == 1, finished.stderr
    assert "run `order-service migrate`" in line


@pytest.mark.parametrize("command", SHORT, ids=" ".join)
async def test_an_unreachable_database_is_one_line_and_exit_1(base: Settings, command: tuple[str, ...]) -> None:
    settings = base.model_copy(update={"database_url": "postgresql+asyncpg://postgres@127.0.0.1:1/orders"})
    finished = await cli(settings, *command, check=False)
    line = _one_line(finished.stderr)
    assert finished.returncode == 1, finished.stderr
    assert "unreachable" in line


@pytest.mark.parametrize("command", LONG)
async def test_a_long_running_command_waits_for_an_unreachable_database_and_stops_cleanly(
    base: Settings, command: str, tmp_path: Path
) -> None:
    settings = base.model_copy(update={"database_url": "postgresql+asyncpg://postgres@127.0.0.1:1/orders"})
    process = ServiceProcess(command, settings, tmp_path / "out.log")
    try:
        await eventually(lambda: _true("database_unavailable" in process.log()), timeout=30)
        assert process.process.poll() is None
    finally:
        code = process.terminate()
    assert code == 0
    assert "Traceback" not in process.log()


@pytest.mark.parametrize("command", LONG)
async def test_a_metrics_port_in_use_names_the_variable_and_exit_1(base: Settings, command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = await cli(base.model_copy(update={"metrics_port": port}), command, check=False)
    line = _one_line(finished.stderr.replace("\r", ""))
    assert finished.returncode == 1, finished.stderr
    assert f"port {port} is already in use" in line
    assert "ORDERS_METRICS_PORT" in line


@pytest.mark.parametrize(
    "command",
    [
        ("quarantine", "list", "--status", "bogus"),
        ("quarantine", "list", "--error-code", "NOPE"),
        ("quarantine", "list", "--limit", "0"),
        ("quarantine", "list", "--older-than", "soon"),
        ("quarantine", "list", "--since", "yesterday"),
        ("effects", "list", "--state", "bogus"),
        ("effects", "retry", "A-1/payment.capture"),
        ("quarantine", "annotate", "--error-code", "NOPE", "--note", "n"),
        ("quarantine", "annotate", "orders/0/1"),
        ("reprocess", "list", "--limit", "0"),
        ("reprocess", "--reason", "r"),
        ("reprocess", "--reason", "r", "--since", "yesterday"),
        ("reconcile", "--max-seconds", "0"),
    ],
    ids=" ".join,
)
async def test_a_bad_flag_is_exit_2_without_a_stack_trace(base: Settings, command: tuple[str, ...]) -> None:
    finished = await cli(base, *command, check=False)
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert "Traceback" not in finished.stderr


async def _true(value: bool) -> bool:
    await asyncio.sleep(0)
    return value


@pytest.mark.parametrize("command", ["consume", "relay", "run"])
async def test_a_long_running_command_waits_for_an_unreachable_broker_and_stops_cleanly(
    base: Settings, command: str, tmp_path: Path
) -> None:
    settings = base.model_copy(update={"kafka_bootstrap_servers": "127.0.0.1:1"})
    process = ServiceProcess(command, settings, tmp_path / "out.log")
    try:
        await eventually(lambda: _true("kafka_unavailable" in process.log()), timeout=30)
        assert process.process.poll() is None
    finally:
        code = process.terminate()
    assert code == 0
    assert "Traceback" not in process.log()
    assert "Unclosed" not in process.log()


async def test_a_reprocess_run_that_cannot_reach_kafka_ends_failed_in_its_audit_row(
    engine: AsyncEngine, base: Settings, topics: Topics
) -> None:
    # Given a record quarantined after its retries (its bytes still decode), and a broker that cannot be reached
    placed = (
        b'{"schema": "order.placed.v1", "order_id": "R-1", "tenant": "acme", "customer_id": "c-1",'
        b' "currency": "EUR", "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 100}]}'
    )
    async with running(base) as container:
        processor = await container.processor()
        pending = processor.pending(SourceRecord(topics.source, 0, 0, 0, b"R-1", placed))
        exhausted = RetryState(verdict=ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)
        assert len((await processor.attempt_round({pending: exhausted}, asyncio.Event())).left) == 1
    settings = base.model_copy(update={"kafka_bootstrap_servers": "127.0.0.1:1"})

    # When an operator reprocesses it
    finished = await cli(
        settings, "reprocess", "--failure-id", f"{topics.source}/0/0", "--reason", "fixed", "--yes", check=False
    )

    # Then the command says so in one line, and the run's audit row says failed, with the reason
    assert finished.returncode == 1, finished.stderr
    assert "Kafka is unreachable" in finished.stderr.splitlines()[-1]
    assert "Traceback" not in finished.stderr
    [run] = await rows(engine, "SELECT outcome, stop_reason FROM reprocess_runs")
    assert run["outcome"] == "failed"
    assert "Kafka is unreachable" in run["stop_reason"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ORDERS_PAYMENTS_URL", "http://127.0.0.1:474010"),
        ("ORDERS_CUSTOMERS_URL", "http://orders:s3cret-pw@customers.internal/"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", ""),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1"),
        ("ORDERS_DATABASE_URL", "postgresql+asyncpg://orders:s3cret-pw@127.0.0.1:5743a/orders"),
    ],
)
def test_an_address_that_cannot_be_connected_to_is_one_line_and_exit_2(variable: str, value: str) -> None:
    # Given an address setting no connection can be made to (a port out of range, credentials in a downstream's URL,
    # no broker, a broker without its port), When the consumer starts
    finished = order_service("consume", env={variable: value})

    # Then it stops at once in one line naming the variable, without the URL's password, instead of waiting for ever
    line = _one_line(finished.stderr)
    assert finished.returncode == 2, finished.stderr
    assert line.startswith(f"invalid configuration: {variable}: ")
    assert "s3cret-pw" not in finished.stderr
