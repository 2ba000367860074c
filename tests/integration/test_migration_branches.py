"""The core's history and the order domain's branch (`orders`): a database the previous release migrated keeps every
row on the way to both heads, a fresh one gets every table (the order domain's from its branch), and the previous
release keeps consuming while the new schema is applied under it (expand, then contract).

The previous release is the commit before the branch was added, taken from git and run from its own directory.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders import tables as order_tables  # noqa: F401 (the domain's tables join the metadata)
from service.orders.domain import DOMAIN
from service.orders.migrations import LOCATION
from service.policy.traces import derived_trace_id
from service.store import schema
from service.store.tables import metadata
from tests.support import ROOT, Topics, env_for, eventually, produce, rows, scalar, settings_for
from tests.support.orders import placed, shipped

MIGRATIONS = DOMAIN.migrations

# The revision file that starts the order domain's branch: the release before the commit that added it (under any
# name: git follows renames) is the previous release, whose schema is the core's 0015 with the orders table in it.
BRANCH_ROOT = (LOCATION / "orders_0001_orders.py").relative_to(ROOT).as_posix()
PREVIOUS_HEAD = "0015"

# One row in every table of the previous release's schema, as that release writes them (the quarantine's rows also
# write its history, quarantine_events, through their triggers).
PREVIOUS_ROWS = (
    "INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence, details, version)"
    " VALUES ('A-1', 'acme', 'c-1', 'shipped', 2500, 'EUR', 2, '{\"items\": 1}', 2)",
    "INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,"
    " aggregate_id, received_at) VALUES ('svc', 'A-1.1/placed', 'processed', 'orders', 0, 7, 'A-1', now())",
    "INSERT INTO outbox (topic, key, payload) VALUES ('orders.events', 'A-1', '\\x7b7d')",
    "INSERT INTO effects (idempotency_key, aggregate_id, kind, payload) VALUES"
    " ('A-1/payment.capture', 'A-1', 'payment.capture', '{\"amount_cents\": 2500}')",
    "INSERT INTO quarantine (failure_id, consumer_name, message_id, error_code, owner, ordering_key, envelope,"
    " attempts, first_failed_at, last_failed_at) VALUES ('orders/0/9', 'svc', 'm-9', 'MALFORMED_PAYLOAD', 'team',"
    " 'A-9', '{}', 1, now(), now())",
    "INSERT INTO quarantine_annotations (consumer_name, failure_id, author, note) VALUES ('svc', 'orders/0/9', 'bob',"
    " 'seen')",
    "INSERT INTO reprocess_runs (id, actor, reason, selection, options, outcome) VALUES ('rp-1', 'eve', 'why', '{}',"
    " '{}', 'completed')",
    "INSERT INTO reprocess_items (run_id, consumer_name, failure_id, message_id, stage, attempt, outcome) VALUES"
    " ('rp-1', 'svc', 'orders/0/9', 'm-9', 'main', 1, 'published')",
    "INSERT INTO audit_log (actor, action, selection, result) VALUES ('eve', 'reprocess', '{}', '{}')",
    "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason) VALUES ('svc', 'A-2', 'orders/1/3',"
    " 'retrying')",
    "INSERT INTO parked (consumer_name, ordering_key, message_id, source_topic, source_partition, source_offset,"
    " timestamp_ms) VALUES ('svc', 'A-2', 'A-2.2/shipped', 'orders', 1, 4, 1700000000000)",
    "INSERT INTO retries (consumer_name, message_id, ordering_key, failure_id, attempts, tier_step, first_failed_at,"
    " last_failed_at, due_at, error_code) VALUES ('svc', 'A-2.1/placed', 'A-2', 'orders/1/3', 2, 1, now(), now(),"
    " now(), 'DOWNSTREAM_UNAVAILABLE')",
    "INSERT INTO reconcile_runs (started_at, finished_at, outcome, summary) VALUES (now(), now(), 'ok', '{}')",
)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's service and migrations, extracted from git into a directory of their own."""
    added = _git("log", "--follow", "--diff-filter=A", "--format=%H", "--", BRANCH_ROOT).split()
    assert added, f"{BRANCH_ROOT} is not in this checkout's git history"
    directory = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(
        ["git", "archive", f"{added[-1]}^", "service", "migrations"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    # The installed project maps `service.migrations` to this checkout's `migrations/`; the release's own comes first.
    (directory / "service" / "migrations").symlink_to(directory / "migrations", target_is_directory=True)
    return directory


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _previous(release: Path, env: dict[str, str], *args: str, output: int | IO[bytes]) -> subprocess.Popen[bytes]:
    """Start the previous release's command line from its own directory (its `service` package comes first), its
    output (both streams) to `output`."""
    return subprocess.Popen(
        [sys.executable, "-m", "service", *args], cwd=release, env=env, stdout=output, stderr=subprocess.STDOUT
    )


def _migrate_with_the_previous_release(release: Path, database_url: str) -> None:
    """Empty the database, then let the previous release's `migrate` bring it to its head."""
    with schema.alembic_config(database_url, DOMAIN.migrations) as config:
        command.downgrade(config, "base")
    env = env_for(settings_for(database_url, "127.0.0.1:9", Topics("unused")))
    migrate = _previous(release, env, "migrate", output=subprocess.PIPE)
    out, _ = migrate.communicate(timeout=120)
    assert migrate.returncode == 0, out.decode()
    assert asyncio.run(schema.current_heads(database_url)) == (PREVIOUS_HEAD,)


async def _tables(engine: AsyncEngine) -> dict[str, list[str]]:
    """Every table of the schema (the version table aside), with its rows as text, in a stable order: each row as
    its JSON object without null values, so that a column a later revision adds (null in the rows it finds) keeps
    a row the same."""
    names = [
        row["tablename"]
        for row in await rows(engine, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        if row["tablename"] != "alembic_version"
    ]
    line = "SELECT jsonb_strip_nulls(to_jsonb(t))::text AS line FROM {} t ORDER BY 1"
    return {name: [row["line"] for row in await rows(engine, line.format(name))] for name in names}


async def test_a_database_the_previous_release_migrated_keeps_every_row_on_the_way_to_both_heads(
    previous_release: Path, database_url: str, engine: AsyncEngine
) -> None:
    # Given a database the previous release migrated, with rows in every table
    await asyncio.to_thread(_migrate_with_the_previous_release, previous_release, database_url)
    async with engine.begin() as connection:
        for statement in PREVIOUS_ROWS:
            await connection.execute(text(statement))
    before = await _tables(engine)
    assert [name for name, lines in before.items() if not lines] == []
    assert "orders" in before

    # When this version migrates it to the core's head and the order domain's branch
    heads = await asyncio.to_thread(schema.upgrade_to_head, database_url, DOMAIN.migrations)

    # Then every table holds the same rows, the orders table is the branch's, and the schema is current
    assert heads == "0021, orders_0001"
    after = await _tables(engine)
    # (an envelope without a trace id gains the one the service derives from its consumer and message id)
    found = await rows(engine, "SELECT consumer_name, message_id, envelope->>'traceId' AS trace_id FROM quarantine")
    assert found
    assert [row["trace_id"] for row in found] == [derived_trace_id(r["consumer_name"], r["message_id"]) for r in found]
    after["quarantine"] = [
        row["line"]
        for row in await rows(
            engine,
            "SELECT jsonb_strip_nulls(to_jsonb(t) || jsonb_build_object('envelope', t.envelope - 'traceId'))::text"
            " AS line FROM quarantine t ORDER BY 1",
        )
    ]
    assert {name: after.get(name) for name in before} == before
    assert [name for name in after.keys() - before.keys() if after[name]] == []  # tables this version adds start empty
    assert set(await schema.current_heads(database_url)) == {"0021", "orders_0001"}
    await schema.require_head(database_url, DOMAIN.migrations)


async def test_a_fresh_database_gets_the_cores_tables_from_the_core_and_the_orders_table_from_its_branch(
    database_url: str, engine: AsyncEngine
) -> None:
    # Given an empty database
    def empty() -> None:
        with schema.alembic_config(database_url, DOMAIN.migrations) as config:
            command.downgrade(config, "base")

    await asyncio.to_thread(empty)
    assert await _tables(engine) == {}

    # When the core's history alone is applied, then the order domain's branch too
    await asyncio.to_thread(schema.upgrade_to_head, database_url)
    core = set(await _tables(engine))
    await asyncio.to_thread(schema.upgrade_to_head, database_url, DOMAIN.migrations)
    both = set(await _tables(engine))

    # Then the core made every table but the domain's, and the branch made the domain's: every table of the models
    assert both == set(metadata.tables)
    assert both - core == {"orders"}
    await schema.require_head(database_url, DOMAIN.migrations)


async def test_the_previous_release_keeps_consuming_while_this_version_migrates_the_database_under_it(
    previous_release: Path, database_url: str, engine: AsyncEngine, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given the previous release's schema and its consumer running on it, which has looked an order up in the
    # empty orders table (a shipment for an order it does not know is rejected)
    await asyncio.to_thread(_migrate_with_the_previous_release, previous_release, database_url)
    settings = settings_for(database_url, kafka, topics)
    log = tmp_path / "consume.log"
    with log.open("wb") as output:
        consumer = _previous(previous_release, env_for(settings), "consume", output=output)
    try:
        await produce(kafka, topics.source, [("B-0", shipped("B-0"), {})])
        await eventually(lambda: _inbox(engine, "rejected"), timeout=60)

        # When this version migrates the database under it: the empty table is dropped and the branch creates it
        assert await asyncio.to_thread(schema.upgrade_to_head, database_url, DOMAIN.migrations) == "0021, orders_0001"

        # Then the previous release goes on: new orders are placed, each with its inbox row
        await produce(kafka, topics.source, [(f"B-{n}", placed(f"B-{n}"), {}) for n in (1, 2, 3)])
        await eventually(lambda: _inbox(engine, "processed", count=3), timeout=60)
        assert await scalar(engine, "SELECT count(*) FROM orders WHERE status = 'placed'") == 3
    finally:
        consumer.send_signal(signal.SIGTERM)
        await asyncio.to_thread(consumer.wait, timeout=60)
    # And it stops cleanly, as it always did
    assert consumer.returncode == 0, log.read_text()[-2000:]


async def _inbox(engine: AsyncEngine, status: str, count: int = 1) -> bool:
    return bool(await scalar(engine, "SELECT count(*) = :n FROM inbox WHERE status = :s", n=count, s=status))
