"""Edit and retry, the second operator's approval and every attempt in a record's timeline, on real Kafka and
PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.support import Topics, cli, committed, eventually, produce, rows, running, scalar
from tests.support import settings_for as base_settings
from tests.support.orders import placed


def settings_for(database_url: str, kafka: str, topics: Topics, downstream: Downstream, **extra: Any) -> Settings:
    values: dict[str, Any] = {"customers_url": downstream.url, "retry_tiers": ""}
    return base_settings(database_url, kafka, topics, **(values | extra))


def with_quantity(order_id: str, quantity: int) -> dict[str, Any]:
    """A placement whose one item has `quantity` (0 breaks the schema: INVALID_FIELD)."""
    order = placed(order_id)
    order["items"][0]["quantity"] = quantity
    return order


async def _quarantine_invalid(engine: AsyncEngine, kafka: str, topics: Topics, count: int) -> list[str]:
    """`count` placements quarantined as INVALID_FIELD (a zero quantity); their failure ids."""
    records = [(f"E-{k}", with_quantity(f"E-{k}", 0), {"message-id": f"E-{k}.1/placed"}) for k in range(count)]
    await produce(kafka, topics.source, records, partition=0)
    await eventually(lambda: scalar(engine, f"SELECT count(*) = {count} FROM quarantine"), timeout=60)
    return [f"{topics.source}/0/{k}" for k in range(count)]


def corrected(tmp_path: Path, order_id: str, quantity: int = 2) -> str:
    path = tmp_path / f"{order_id}-{quantity}.json"
    path.write_text(json.dumps(with_quantity(order_id, quantity)))
    return str(path)


async def test_a_valid_edit_is_sent_once_and_applied_once_even_when_submitted_twice_or_reprocessed_after(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop"):
        # Given a placement quarantined for a zero quantity
        [failure_id] = await _quarantine_invalid(engine, kafka, topics, 1)
        original = await scalar(engine, "SELECT payload FROM quarantine")
        fixed = corrected(tmp_path, "E-0")

        # When an operator previews the corrected payload, then submits it twice (no relay yet: the first copy
        # still waits in the outbox when the second comes)
        preview = await cli(settings, "quarantine", "edit", failure_id, "--payload-file", fixed, "--dry-run")
        first = await cli(
            settings, "quarantine", "edit", failure_id, "--payload-file", fixed, "--actor", "alice", "--json"
        )
        second = await cli(
            settings, "quarantine", "edit", failure_id, "--payload-file", fixed, "--actor", "alice", check=False
        )
        copies_before_the_relay = await rows(engine, "SELECT headers FROM outbox WHERE topic = :t", t=topics.reprocess)
        async with running(settings, "relay"):
            await eventually(
                lambda: scalar(engine, "SELECT count(*) = 1 FROM orders WHERE order_id = 'E-0'"), timeout=60
            )
            # and the same copy is sent a second time (as a relay that crashed before marking it published would)
            async with engine.begin() as connection:
                await connection.execute(
                    text(
                        "INSERT INTO outbox (topic, key, headers, payload, kafka_key) SELECT topic, key, headers,"
                        " payload, kafka_key FROM outbox WHERE topic = :topic"
                    ),
                    {"topic": topics.reprocess},
                )
            await eventually(lambda: committed(kafka, settings.consumer_name, topics.reprocess, 0, 2), timeout=60)
            # and a third edit is submitted after it was applied, and a reprocess of the record's original bytes
            third = await cli(
                settings, "quarantine", "edit", failure_id, "--payload-file", fixed, "--actor", "bob", check=False
            )
            again = await cli(settings, "reprocess", "--failure-id", failure_id, "--reason", "again", "--yes", "--json")

    # Then the preview showed the diff and the verdict and wrote nothing
    assert '-      "quantity": 0,' in preview.stdout
    assert '+      "quantity": 2,' in preview.stdout
    assert "validation: valid" in preview.stdout
    assert "dry run: nothing written" in preview.stdout
    # and the first submission was sent, the second refused, one copy in the outbox, under the original id
    sent = json.loads(first.stdout)
    assert (sent["state"], sent["valid"], sent["failure_id"]) == ("sent", True, failure_id)
    assert second.returncode == 1
    assert "one edit at a time" in second.stderr
    assert third.returncode == 1
    assert "is reprocessed, not open: nothing to edit" in third.stderr
    assert len(copies_before_the_relay) == 1
    assert ["message-id", "E-0.1/placed"] in copies_before_the_relay[0]["headers"]
    assert ["reprocess-edit-id", str(sent["edit_id"])] in copies_before_the_relay[0]["headers"]
    # and the order was applied once: one inbox row, the record reprocessed, the second copy a duplicate
    assert await rows(engine, "SELECT message_id, status FROM inbox") == [
        {"message_id": "E-0.1/placed", "status": "processed"}
    ]
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert json.loads(again.stdout)["undecodable"] == [failure_id]  # the original still breaks the schema
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert await scalar(engine, "SELECT status FROM quarantine") == "reprocessed"
    # and the original bytes stay in the record, the edit beside them, audited
    assert await scalar(engine, "SELECT payload FROM quarantine") == original
    edit = (await rows(engine, "SELECT actor, state, payload_before, diff FROM quarantine_edits"))[0]
    assert (edit["actor"], edit["state"], edit["payload_before"]) == ("alice", "sent", original)
    assert await scalar(engine, "SELECT count(*) FROM audit_log WHERE action = 'quarantine.edit'") == 1
    shown = json.loads((await cli(settings, "quarantine", "show", failure_id, "--json")).stdout)
    events = [event["event"] for event in shown["timeline"]]
    assert events.index("edited") < events.index("reprocessed")
    assert [(e["id"], e["actor"], e["state"]) for e in shown["edits"]] == [(sent["edit_id"], "alice", "sent")]


async def test_an_invalid_edit_is_refused_with_the_reason_and_nothing_is_written_or_sent(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop"):
        # Given a placement quarantined for a zero quantity
        [failure_id] = await _quarantine_invalid(engine, kafka, topics, 1)
    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"schema": "order.placed.v1", ')
    negative = corrected(tmp_path, "E-0", quantity=-3)

    # When an operator submits a payload that still breaks the schema, and one that is not JSON
    still_invalid = await cli(settings, "quarantine", "edit", failure_id, "--payload-file", negative, check=False)
    not_json = await cli(settings, "quarantine", "edit", failure_id, "--payload-file", malformed, check=False)
    previewed = await cli(
        settings, "quarantine", "edit", failure_id, "--payload-file", negative, "--dry-run", "--json", check=False
    )
    reserved = await cli(settings, "quarantine", "edit", failure_id, "--set-header", "message-id=other", check=False)

    # Then each is refused with the reason, exit 1, and nothing is kept or put in the outbox
    assert still_invalid.returncode == 1
    assert "would be quarantined again as INVALID_FIELD (field items.0.quantity" in still_invalid.stderr
    assert not_json.returncode == 1
    assert "MALFORMED_PAYLOAD" in not_json.stderr
    assert previewed.returncode == 1
    assert json.loads(previewed.stdout)["valid"] is False
    assert reserved.returncode == 1
    assert "'message-id' is the service's own" in reserved.stderr
    assert await scalar(engine, "SELECT count(*) FROM quarantine_edits") == 0
    assert await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.reprocess}'") == 0
    assert await scalar(engine, "SELECT status FROM quarantine") == "open"


async def test_with_approvals_on_an_edit_waits_for_another_operator_and_its_author_cannot_approve_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    settings = settings_for(database_url, kafka, topics, downstream, console_edit_approval=True)
    async with running(settings, "consumer_loop", "relay"):
        # Given a placement quarantined for a zero quantity, and alice's corrected payload waiting for approval
        [failure_id] = await _quarantine_invalid(engine, kafka, topics, 1)
        proposed = json.loads(
            (
                await cli(
                    settings,
                    "quarantine",
                    "edit",
                    failure_id,
                    "--payload-file",
                    corrected(tmp_path, "E-0"),
                    "--set-header",
                    "fixed-by=alice",
                    "--actor",
                    "alice",
                    "--json",
                )
            ).stdout
        )
        edit_id = str(proposed["edit_id"])
        waiting = await scalar(engine, f"SELECT count(*) FROM outbox WHERE topic = '{topics.reprocess}'")

        # When alice approves her own edit, then bob approves it
        own = await cli(settings, "quarantine", "approve-edit", edit_id, "--actor", "alice", check=False)
        approved = await cli(settings, "quarantine", "approve-edit", edit_id, "--actor", "bob", "--json")
        twice = await cli(settings, "quarantine", "approve-edit", edit_id, "--actor", "carol", check=False)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM orders WHERE order_id = 'E-0'"), timeout=60)

    # Then nothing was sent while it waited, alice's approval was refused, and bob's sent it once
    assert proposed["state"] == "pending_approval"
    assert waiting == 0
    assert "header fixed-by: added" in proposed["diff"]
    assert own.returncode == 1
    assert "alice's own: another operator approves it" in own.stderr
    assert json.loads(approved.stdout)["state"] == "sent"
    assert json.loads(approved.stdout)["decided_by"] == "bob"
    assert twice.returncode == 1
    assert "is sent, not pending approval" in twice.stderr
    copies = await rows(engine, f"SELECT headers FROM outbox WHERE topic = '{topics.reprocess}'")
    assert len(copies) == 1
    assert ["fixed-by", "alice"] in copies[0]["headers"]
    assert await scalar(engine, "SELECT status FROM inbox") == "processed"
    actions = await rows(engine, "SELECT actor, action FROM audit_log WHERE action LIKE '%edit' ORDER BY id")
    assert actions == [
        {"actor": "alice", "action": "quarantine.edit"},
        {"actor": "bob", "action": "quarantine.approve_edit"},
    ]


async def test_the_timeline_lists_every_attempt_of_a_record_that_went_through_the_retry_tiers(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a placement whose customer look-up always fails, two blocking attempts and two tiers
    downstream.fail_next("customers.get", times=1000, status=503, key="c-down")
    settings = settings_for(
        database_url,
        kafka,
        topics,
        downstream,
        retry_tiers="1s,1s",
        blocking_attempts=2,
        blocking_elapsed="2s",
        max_attempts=None,
        max_elapsed="60s",
    )
    await produce(kafka, topics.source, [("T-1", placed("T-1", customer="c-down"), {})], partition=0)

    # When it runs through every tier into the quarantine
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=90)
    shown = json.loads((await cli(settings, "quarantine", "show", f"{topics.source}/0/0", "--json")).stdout)

    # Then its timeline lists each attempt, in order, with where it failed and its code
    failed = [event for event in shown["timeline"] if event["event"] == "failed"]
    assert [event["attempts"] for event in failed] == list(range(1, shown["attempts"] + 1))
    assert shown["attempts"] == 4
    assert [event["detail"] for event in failed[1:3]] == ["to retry tier 1", "to retry tier 2"]
    assert [event["error_code"] for event in failed[1:]] == [
        "DOWNSTREAM_UNAVAILABLE",
        "DOWNSTREAM_UNAVAILABLE",
        "DOWNSTREAM_UNAVAILABLE_EXHAUSTED",
    ]
