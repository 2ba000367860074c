"""Two consumer names reading one source topic keep their quarantines apart (issue 43, contract §7): each quarantines
a bad record under its own `(consumer_name, failure_id)` row, which operators list, show, note, resolve and
reprocess apart; a failure id both hold is refused unless the consumer is named (CLI exit 2, API 409); and each
consumer applies only its own retry-tier and reprocess copies, committing past the other's.

Real PostgreSQL and Kafka; the consumers run in this process, the CLI as a process, the console's API in-process.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.codes import ErrorCode
from service.config import Settings
from service.console.app import create_app
from service.console.web import Wiring
from service.orders.domain import DOMAIN
from service.policy.records import SourceRecord
from service.policy.redelivery import tier_headers
from service.policy.retry import AttemptHistory
from service.worker.reprocess_run import Options, Progress, Report, Selection
from tests.support import (
    Topics,
    cli,
    committed,
    eventually,
    produce,
    produce_raw,
    quarantine_as,
    rows,
    running,
    scalar,
    settings_for,
)
from tests.support.orders import placed, quarantined_placement

TOKEN = "viewer-token-" + "c0ffee00" * 5


def consumers(database_url: str, kafka: str, topics: Topics) -> tuple[Settings, Settings]:
    """Two consumer names on the test's source topic (and its one-second retry tier)."""
    return tuple(  # type: ignore[return-value]
        settings_for(database_url, kafka, topics, consumer_name=f"{topics.source}-{name}", retry_tiers="1s")
        for name in ("billing", "shipping")
    )


@contextlib.asynccontextmanager
async def console_api(settings: Settings, engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """The console's JSON API on this database, for a viewer's token."""

    async def never(owner: Settings, selection: Selection, options: Options, progress: Progress) -> Report:
        raise AssertionError("the API reprocesses nothing")

    configured = settings_for(
        settings.database_url, "127.0.0.1:1", Topics("console"), console_tokens=f"vic:viewer:{TOKEN}"
    )
    app = create_app(Wiring(configured, engine, (), lambda _: None, never, DOMAIN.error_codes))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test", headers=headers) as client:
            yield client


async def test_each_consumer_keeps_its_own_record_of_one_bad_record_and_operators_act_on_each_apart(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two consumer names reading one source topic, and a record that is not JSON
    billing, shipping = consumers(database_url, kafka, topics)
    await produce(kafka, topics.source, [("B-1", b"\xff not json", {})], partition=0)
    failure_id = f"{topics.source}/0/0"

    # When both run until each has quarantined it
    async with running(billing, "consumer_loop"), running(shipping, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM quarantine"), timeout=60)

    # Then each consumer has its own record of it, listed apart
    listed = json.loads((await cli(billing, "quarantine", "list", "--json")).stdout)
    assert sorted((row["consumer_name"], row["failure_id"]) for row in listed) == [
        (billing.consumer_name, failure_id),
        (shipping.consumer_name, failure_id),
    ]
    only = json.loads((await cli(billing, "quarantine", "list", "--consumer", shipping.consumer_name, "--json")).stdout)
    assert [row["consumer_name"] for row in only] == [shipping.consumer_name]

    # And naming the failure id alone is refused, naming the flag that says whose, before anything changes
    for command in (
        ("quarantine", "show", failure_id),
        ("quarantine", "resolve", failure_id, "--reason", "r", "--author", "eve"),
        ("quarantine", "annotate", failure_id, "--note", "n", "--author", "eve"),
        ("reprocess", "--failure-id", failure_id, "--reason", "r", "--yes"),
    ):
        refused = await cli(billing, *command, check=False)
        assert refused.returncode == 2, (command, refused.stderr)
        [line] = refused.stderr.strip().splitlines()
        assert "several consumers" in line, line
        assert "--consumer" in line, line

    # When an operator resolves billing's record and notes shipping's, each by its consumer
    await cli(
        billing, "quarantine", "resolve", failure_id, "--consumer", billing.consumer_name, "--reason", "known", "--yes"
    )
    await cli(
        billing, "quarantine", "annotate", failure_id, "--consumer", shipping.consumer_name, "--note", "asked producer"
    )

    # Then each record changed alone, and each shows its own timeline
    shown = {
        consumer.consumer_name: json.loads(
            (
                await cli(billing, "quarantine", "show", failure_id, "--consumer", consumer.consumer_name, "--json")
            ).stdout
        )
        for consumer in (billing, shipping)
    }
    assert (shown[billing.consumer_name]["status"], shown[shipping.consumer_name]["status"]) == ("resolved", "open")
    assert [note["note"] for note in shown[shipping.consumer_name]["annotations"]] == ["asked producer"]
    assert shown[billing.consumer_name]["annotations"] == []
    assert [event["event"] for event in shown[billing.consumer_name]["timeline"]] == [
        "failed",
        "quarantined",
        "resolved",
    ]
    assert [event["event"] for event in shown[shipping.consumer_name]["timeline"]] == [
        "failed",
        "quarantined",
        "annotated",
    ]

    # And the API answers 409 for the failure id alone, and each record by its consumer
    async with console_api(billing, engine) as api:
        ambiguous = await api.get(f"/api/quarantine/{failure_id}")
        named = await api.get(f"/api/quarantine/{failure_id}", params={"consumer": shipping.consumer_name})
        listed_by_api = await api.get("/api/quarantine", params={"consumer": billing.consumer_name})
    assert ambiguous.status_code == 409
    assert list(ambiguous.json()) == ["error"]
    assert "several consumers" in ambiguous.json()["error"]
    assert "\n" not in ambiguous.json()["error"]
    assert named.status_code == 200
    assert (named.json()["consumer_name"], named.json()["status"]) == (shipping.consumer_name, "open")
    assert [item["status"] for item in listed_by_api.json()["items"]] == ["resolved"]


async def test_each_consumer_applies_only_its_own_copies_and_commits_past_the_others(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two consumer names on one topic that both quarantined placement X (its look-ups ran out), and both sent
    # placement M to the one-second tier: only shipping's copy of M is there yet, due now
    billing, shipping = consumers(database_url, kafka, topics)
    failure_id = f"{topics.source}/1/0"
    now = datetime.now(UTC)
    for consumer in (billing, shipping):
        await quarantine_as(engine, consumer.consumer_name, [quarantined_placement(failure_id, "X", now)])
        await _retrying(engine, consumer.consumer_name, "M.1/placed", f"{topics.source}/2/0", now)
    original = SourceRecord(topics.source, 2, 0, 0, b"M", b"{}", ())
    history = AttemptHistory(2, now - timedelta(seconds=2), now - timedelta(seconds=1), tier_step=1)
    headers = tier_headers(
        original,
        "M.1/placed",
        original.coordinates,
        0,
        history,
        now,
        ErrorCode.DOWNSTREAM_UNAVAILABLE,
        consumer=shipping.consumer_name,
    )
    await produce_raw(kafka, topics.retry("1s"), [(b"M", json.dumps(placed("M")).encode(), headers)], partition=0)

    async with running(billing, "consumer_loop"), running(shipping, "consumer_loop", "relay"):
        # When both consumers read the tier, and an operator reprocesses shipping's record of X
        for consumer in (billing, shipping):
            await eventually(partial(committed, kafka, consumer.consumer_name, topics.retry("1s"), 0, 1), timeout=60)
        run = await cli(
            shipping,
            "reprocess",
            "--failure-id",
            failure_id,
            "--consumer",
            shipping.consumer_name,
            "--reason",
            "directory back",
            "--yes",
            "--json",
        )
        # (billing reads the reprocess topic too: once it committed past shipping's copy, it has decided on it)
        await eventually(lambda: committed(kafka, billing.consumer_name, topics.reprocess, 0, 1), timeout=60)

    # Then shipping applied its copies, and billing committed past both without applying either: its M still
    # waits for its own copy (its retry row is there), its X is still quarantined
    assert await rows(engine, "SELECT consumer_name, message_id, status FROM inbox ORDER BY 1, 2") == [
        {"consumer_name": billing.consumer_name, "message_id": "X.1/placed", "status": "quarantined"},
        {"consumer_name": shipping.consumer_name, "message_id": "M.1/placed", "status": "processed"},
        {"consumer_name": shipping.consumer_name, "message_id": "X.1/placed", "status": "processed"},
    ]
    assert await rows(engine, "SELECT consumer_name FROM retries") == [{"consumer_name": billing.consumer_name}]
    # And the run reprocessed shipping's record alone; billing's record of X stays open
    assert json.loads(run.stdout)["reprocessed"] == 1
    assert await rows(engine, "SELECT consumer_name, status FROM quarantine ORDER BY 1") == [
        {"consumer_name": billing.consumer_name, "status": "open"},
        {"consumer_name": shipping.consumer_name, "status": "reprocessed"},
    ]
    assert await rows(engine, "SELECT order_id FROM orders ORDER BY 1") == [{"order_id": "M"}, {"order_id": "X"}]


async def _retrying(engine: AsyncEngine, consumer: str, message_id: str, failure_id: str, now: datetime) -> None:
    """A consumer's record in the one-second tier, at its first step (its copy sent, or on its way)."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO retries (consumer_name, message_id, ordering_key, failure_id, attempts, tier_step,
                                     first_failed_at, last_failed_at, due_at, error_code)
                VALUES (:consumer, :message_id, 'M', :failure_id, 2, 1, :now, :now, :now, 'DOWNSTREAM_UNAVAILABLE')
                """
            ),
            {"consumer": consumer, "message_id": message_id, "failure_id": failure_id, "now": now},
        )
