"""The console script `inventory-service`, black-box: the core and this project installed from their directories into
a fresh virtualenv (their dependencies taken from the running interpreter's), then run as an operator runs it,
against the PostgreSQL and Kafka that `scripts/test` starts (ORDERS_TEST_PG_PORT, ORDERS_TEST_KAFKA)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

EXAMPLE = Path(__file__).resolve().parents[1]
CORE = EXAMPLE.parents[1]  # the checkout this example lives in
PG_SERVER = f"postgres@127.0.0.1:{os.environ.get('ORDERS_TEST_PG_PORT', '55432')}"
KAFKA = os.environ.get("ORDERS_TEST_KAFKA", "127.0.0.1:19092")


def _copy(source: Path, target: Path, names: tuple[str, ...]) -> Path:
    """The files a build needs, copied, so that building leaves nothing in the checkout."""
    for name in names:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (source / name).exists():
            shutil.copy2(source / name, target / name)
    return target


@pytest.fixture(scope="module")
def console_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`inventory-service` in a fresh virtualenv holding the core and this project, both installed without their
    dependencies, which a `.pth` file finds in the running interpreter's site-packages (after the venv's own)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    own = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (own / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    core = _copy(CORE, tmp_path_factory.mktemp("core"), ("pyproject.toml", "README.md", "service", "migrations"))
    example = _copy(EXAMPLE, tmp_path_factory.mktemp("inventory"), ("pyproject.toml", "README.md", "inventory"))
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps"]
    # The build backend both projects name, once, in the venv: the two builds then need no isolated environments.
    subprocess.run([*pip, "setuptools>=77"], check=True, timeout=300)
    subprocess.run([*pip, "--no-build-isolation", str(core), str(example)], check=True, timeout=300)
    return venv / "bin" / "inventory-service"


@pytest.fixture
def warehouse(console_script: Path) -> Iterator[str]:
    """The project's fake stock and warehouse APIs as a process (`python -m inventory.fakes`); their base URL."""
    command = [str(console_script.parent / "python"), "-m", "inventory.fakes"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as server:
        assert server.stdout is not None
        try:
            yield server.stdout.readline().strip()
        finally:
            server.terminate()


def stock(warehouse: str, sku: str, where: str, available: int) -> None:
    """Give the fake warehouse `available` of `sku` at `where` (its control API)."""
    body = json.dumps({"sku": sku, "warehouse": where, "available": available}).encode()
    request = urllib.request.Request(f"{warehouse}/_control/stock", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status in (200, 204)


@pytest.fixture
def database() -> Iterator[str]:
    """An empty database (not migrated), dropped afterwards."""
    name = f"inventory_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"postgresql://{PG_SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(f"postgresql://{PG_SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def source_topic() -> Iterator[str]:
    """A source topic name of this test's own; it and the topics derived from it are deleted afterwards."""
    name = f"inv{uuid.uuid4().hex[:10]}"
    yield name
    asyncio.run(_delete_topics(name))


async def _delete_topics(prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=KAFKA)
    await admin.start()
    try:
        mine = [topic for topic in await admin.list_topics() if topic.startswith(prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


def environment(database: str = "absent", source_topic: str = "absent", **settings: str) -> dict[str, str]:
    """The process's environment: the inventory's variables, and order-service's pointing nowhere (never read)."""
    values = {
        "PATH": os.environ["PATH"],
        "INVENTORY_DATABASE_URL": f"postgresql+asyncpg://{PG_SERVER}/{database}",
        "INVENTORY_KAFKA_BOOTSTRAP_SERVERS": KAFKA,
        "INVENTORY_SOURCE_TOPIC": source_topic,
        "INVENTORY_CONSUMER_NAME": f"{source_topic}-consumer",
        "INVENTORY_METRICS_PORT": "0",
        "ORDERS_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
        "ORDERS_SOURCE_TOPIC": "not-this-one",
    }
    return values | {f"INVENTORY_{name.upper()}": value for name, value in settings.items()}


def run(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One command to its end."""
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something true, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout}s")
        time.sleep(0.1)
    return result


def until_stopped(script: Path, command: str, env: dict[str, str], done: Callable[[], Any]) -> Any:
    """Run a long-running command until `done` returns something true, stop it as an orchestrator does (SIGTERM),
    check that it exited 0, and return what `done` returned."""
    log = script.parent.parent / f"{command}.log"
    with log.open("w") as output:
        process = subprocess.Popen([str(script), command], env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            result = eventually(done)
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    return result


def at_once(script: Path, commands: list[str], env: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Short commands, each a process of its own, run at the same time: each one's exit code and error output."""
    started = {
        command: subprocess.Popen(
            [str(script), *command.split()], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    }
    answers = {}
    for command, process in started.items():
        _, error = process.communicate(timeout=60)
        answers[command] = (process.returncode, error)
    return answers


def loggers(log: Path) -> set[str]:
    """The logger names of a process's JSON log lines."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return {line["logger"] for line in lines if "logger" in line}


def query(database: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows a query returns."""
    with psycopg.connect(f"postgresql://{PG_SERVER}/{database}") as connection:
        return connection.execute(sql).fetchall()


async def produce(topic: str, records: list[tuple[str, bytes]]) -> None:
    """(key, value) records, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=KAFKA)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


def message(**fields: Any) -> bytes:
    """A record value."""
    return json.dumps(fields).encode()


def test_help_and_version_name_the_inventory_service_and_its_variables(console_script: Path) -> None:
    top = run(console_script, "--help", env=environment())
    consume = run(console_script, "consume", "--help", env=environment())
    version = run(console_script, "--version", env=environment())

    assert top.returncode == 0, top.stderr
    assert "Usage: inventory-service" in top.stdout
    assert "INVENTORY_*" in top.stdout
    assert "INVENTORY_STOCK_URL" in consume.stdout.replace("\n", "")
    assert "ORDERS_" not in top.stdout + consume.stdout
    assert version.stdout.split() == ["inventory-service", "0.1.0"]


def test_stock_messages_end_in_reservations_and_terminal_inbox_states(
    console_script: Path, database: str, source_topic: str, warehouse: str
) -> None:
    env = environment(database, source_topic)

    # Given a migrated database (the core's tables and the reservations of the inventory's own branch) and the
    # declared topics
    migrated = run(console_script, "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    plan = run(console_script, "topics", "plan", env=env)
    assert plan.returncode == 0, plan.stderr
    assert source_topic in plan.stdout
    assert run(console_script, "topics", "apply", "--create-source", env=env).returncode == 0
    assert run(console_script, "topics", "plan", "--check", env=env).returncode == 0

    # And a reserve, a reserve and its release, a release of a reservation never made, and bytes that are not JSON
    records = [
        ("r-1", message(schema="stock.reserved.v1", reservation_id="r-1", sku="SKU-1", quantity=2, warehouse="berlin")),
        ("r-2", message(schema="stock.reserved.v1", reservation_id="r-2", sku="SKU-2", quantity=1, warehouse="paris")),
        ("r-2", message(schema="stock.released.v1", reservation_id="r-2", reason="order cancelled")),
        ("r-9", message(schema="stock.released.v1", reservation_id="r-9", reason="order cancelled")),
        ("r-3", b"not json"),
    ]
    asyncio.run(produce(source_topic, records))

    # When `inventory-service consume` runs until every record reached its terminal state, then is stopped
    inbox = until_stopped(
        console_script,
        "consume",
        env,
        lambda: (found := query(database, "SELECT message_id, status FROM inbox")) and len(found) == 5 and found,
    )

    # Then each record has its row and its terminal inbox state, and the process logged under the domain's name
    assert sorted(status for _, status in inbox) == ["processed", "processed", "processed", "quarantined", "rejected"]
    roots = {name.split(".")[0] for name in loggers(console_script.parent.parent / "consume.log")}
    assert "inventory_service" in roots
    assert "order_service" not in roots
    reservations = query(database, "SELECT reservation_id, status FROM reservations ORDER BY reservation_id")
    assert reservations == [("r-1", "reserved"), ("r-2", "released")]
    effects = query(database, "SELECT idempotency_key, state FROM effects ORDER BY idempotency_key")
    assert effects == [
        ("r-1/warehouse.hold", "pending"),
        ("r-2/warehouse.hold", "pending"),
        ("r-2/warehouse.unhold", "pending"),
    ]

    # And `inventory-service run`, given a warehouse that has the stock, holds and releases it and publishes the
    # outbox
    stock(warehouse, "SKU-1", "berlin", 5)
    stock(warehouse, "SKU-2", "paris", 5)
    with_warehouse = env | {"INVENTORY_WAREHOUSE_URL": warehouse}
    until_stopped(
        console_script,
        "run",
        with_warehouse,
        lambda: (
            query(database, "SELECT count(*) FROM effects WHERE state = 'sent'") == [(3,)]
            and query(database, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]
        ),
    )
    holds = query(database, "SELECT reservation_id, hold_status FROM reservations ORDER BY reservation_id")
    assert holds == [("r-1", "held"), ("r-2", "unheld")]
    reconciled = run(console_script, "reconcile", env=with_warehouse)
    assert reconciled.returncode == 0, reconciled.stderr

    # And the operators' read-only commands answer
    listings = ["quarantine list", "effects list", "parked list", "outbox set-aside", "reprocess list"]
    listings.append("topics acls --principal User:inventory-service")
    failed = {listing: out for listing, (code, out) in at_once(console_script, listings, env).items() if code != 0}
    assert failed == {}

    # And the quarantine's stats show the bad bytes, owned by the inventory's producers
    stats = run(console_script, "quarantine", "stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    summary = json.loads(stats.stdout)
    assert summary["open"] == 1
    assert [(group["error_code"], group["owner"]) for group in summary["by_code"]] == [
        ("MALFORMED_PAYLOAD", "inventory-producers")
    ]
