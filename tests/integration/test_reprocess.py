"""Quarantine as an operational queue and controlled reprocessing, on real Kafka and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.support import Topics, cli, eventually, produce, read_topic, rows, running, scalar
from tests.support import settings_for as base_settings
from tests.support.orders import placed


def settings_for(database_url: str, kafka: str, topics: Topics, downstream: Downstream, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "customers_url": downstream.url,
        "retry_tiers": "",
        "blocking_attempts": 2,
        "blocking_elapsed": "2s",
        "max_attempts": 2,
        "max_elapsed": "2s",
    }
    return base_settings(database_url, kafka, topics, **(values | extra))


async def _quarantined_orders(engine: AsyncEngine, kafka: str, topics: Topics, downstream: Downstream, n: int) -> None:
    """Quarantine `n` placed orders: their customer's look-up fails until their budget is spent. (One customer for
    all: one request failing again and again opens no breaker, so their budgets are spent on attempts, and the
    reprocessed copies find the directory's breaker closed.)"""
    downstream.fail_next("customers.get", times=1000, status=503, key="c-q")
    records = [(f"Q-{k}", placed(f"Q-{k}", customer="c-q"), {"message-id": f"Q-{k}.1/placed"}) for k in range(n)]
    await produce(kafka, topics.source, records, partition=0)


async def test_reprocessing_one_sample_twice_has_one_business_effect_and_the_second_run_is_a_no_op(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given three orders quarantined while their customer directory was down, and the directory back up
    await _quarantined_orders(engine, kafka, topics, downstream, 3)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM quarantine"), timeout=60)
        downstream.clear_faults()
        ids = [f"{topics.source}/0/{offset}" for offset in (0, 1)]
        selection = [arg for failure_id in ids for arg in ("--failure-id", failure_id)]

        # When the same two records are reprocessed twice
        first = json.loads(
            (await cli(settings, "reprocess", *selection, "--reason", "directory fixed", "--yes", "--json")).stdout
        )
        second = json.loads(
            (await cli(settings, "reprocess", *selection, "--reason", "again", "--yes", "--json")).stdout
        )

    # Then the first run applied each once, and the second found each already applied
    assert (first["outcome"], first["reprocessed"], first["noop"], first["failed_again"]) == ("completed", 2, 0, 0)
    assert (second["outcome"], second["reprocessed"], second["noop"], second["failed_again"]) == ("completed", 0, 2, 0)
    assert await rows(engine, "SELECT order_id FROM orders ORDER BY 1") == [{"order_id": "Q-0"}, {"order_id": "Q-1"}]
    assert await scalar(engine, "SELECT count(*) FROM effects") == 2
    statuses = await rows(engine, "SELECT message_id, status FROM inbox ORDER BY message_id")
    assert statuses == [
        {"message_id": "Q-0.1/placed", "status": "processed"},
        {"message_id": "Q-1.1/placed", "status": "processed"},
        {"message_id": "Q-2.1/placed", "status": "quarantined"},
    ]
    assert await rows(engine, "SELECT failure_id, status FROM quarantine ORDER BY 1") == [
        {"failure_id": f"{topics.source}/0/0", "status": "reprocessed"},
        {"failure_id": f"{topics.source}/0/1", "status": "reprocessed"},
        {"failure_id": f"{topics.source}/0/2", "status": "open"},
    ]
    events = [json.loads(r.value) for r in await read_topic(kafka, topics.events, expect=2, timeout=10)]
    assert sorted(e["orderId"] for e in events if e["type"] == "order.accepted") == ["Q-0", "Q-1"]
    copies = await read_topic(kafka, topics.reprocess, expect=4, timeout=10)
    headers = [{k: v.decode() for k, v in record.headers} for record in copies]
    assert sorted(h["reprocess-attempt"] for h in headers if h["failure-id"].endswith("/0/0")) == ["1", "2"]
    assert all(h["message-id"] in ("Q-0.1/placed", "Q-1.1/placed") for h in headers)
    assert sorted(record.key.decode() for record in copies) == ["Q-0", "Q-0", "Q-1", "Q-1"]


async def test_a_no_op_is_confirmed_only_once_its_copy_was_published_and_read(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given an order quarantined, then reprocessed, and the relay not running
    await _quarantined_orders(engine, kafka, topics, downstream, 1)
    settings = settings_for(database_url, kafka, topics, downstream)
    failure = ["--failure-id", f"{topics.source}/0/0"]
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        downstream.clear_faults()
        await cli(settings, "reprocess", *failure, "--reason", "directory fixed", "--yes", "--json")
    async with running(settings, "consumer_loop"):
        # When it is reprocessed again while its copy cannot leave the outbox
        options = ["--reason", "again", "--verify-timeout", "1", "--yes", "--json"]
        stuck = await cli(settings, "reprocess", *failure, *options, check=False)
    # And once more with the relay back
    async with running(settings, "consumer_loop", "relay"):
        again = json.loads((await cli(settings, "reprocess", *failure, "--reason", "again", "--yes", "--json")).stdout)

    # Then the copy that was never published is unverified, not an already-applied no-op (the consumer's lag
    # was zero all along), and the one that was published and read is the no-op
    report = json.loads(stuck.stdout)
    assert (report["published"], report["noop"], report["unverified"]) == (1, 0, 1)
    assert (again["published"], again["noop"], again["unverified"]) == (1, 1, 0)
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    outcomes = await rows(engine, "SELECT attempt, outcome FROM reprocess_items ORDER BY attempt")
    assert outcomes == [
        {"attempt": 1, "outcome": "reprocessed"},
        {"attempt": 2, "outcome": "unverified"},
        {"attempt": 3, "outcome": "noop"},
    ]


async def test_a_sample_against_a_consumer_that_still_fails_stops_on_the_failure_rate_and_requarantines(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given four quarantined orders whose customer directory is still down
    await _quarantined_orders(engine, kafka, topics, downstream, 4)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 4 FROM quarantine"), timeout=60)

        # When a sample of two is reprocessed
        result = await cli(
            settings,
            "reprocess",
            "--error-code",
            "DOWNSTREAM_UNAVAILABLE_EXHAUSTED",
            "--sample",
            "2",
            "--reason",
            "try it",
            "--yes",
            "--json",
            check=False,
        )

    # Then the run stops on the failure rate, before the rest, and the sample is back in quarantine
    report = json.loads(result.stdout)
    assert result.returncode == 3
    assert report["outcome"] == "stopped"
    assert report["stop_reason"].startswith("failure rate 100% is over the threshold 20%")
    assert (report["published"], report["failed_again"]) == (2, 2)
    again = await rows(engine, "SELECT status, repeat_failures FROM quarantine WHERE repeat_failures > 0")
    assert again == [{"status": "open", "repeat_failures": 1}] * 2
    assert await scalar(engine, "SELECT count(*) FROM orders") == 0
    run = (await rows(engine, "SELECT outcome, stop_reason FROM reprocess_runs"))[0]
    assert run["outcome"] == "stopped"
    assert await scalar(engine, "SELECT count(*) FROM reprocess_items WHERE outcome = 'failed_again'") == 2


async def test_the_publish_rate_stays_within_the_limit(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given ten quarantined orders and the directory back up
    await _quarantined_orders(engine, kafka, topics, downstream, 10)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 10 FROM quarantine"), timeout=60)
        downstream.clear_faults()

        # When they are reprocessed at 5 records per second
        report = json.loads(
            (
                await cli(
                    settings,
                    "reprocess",
                    "--error-code",
                    "DOWNSTREAM_UNAVAILABLE_EXHAUSTED",
                    "--rate",
                    "5",
                    "--reason",
                    "rate check",
                    "--json",
                )
            ).stdout
        )

    # Then the publish timestamps on the reprocess topic span at least (10 - 1) / 5 s, within a tolerance
    assert report["reprocessed"] == 10
    published = await read_topic(kafka, topics.reprocess, expect=10)
    stamps = sorted(record.timestamp for record in published)
    seconds = (stamps[-1] - stamps[0]) / 1000
    assert len(stamps) == 10
    assert seconds >= 9 / 5 * 0.8
    assert (len(stamps) - 1) / seconds <= 5 * 1.25


async def test_the_audit_is_complete_and_a_dry_run_writes_nothing(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given two quarantined orders (one with a payload that no longer decodes) and the directory back up
    await _quarantined_orders(engine, kafka, topics, downstream, 1)
    await produce(kafka, topics.source, [("BAD", b"not json at all", {})], partition=0)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM quarantine"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
        downstream.clear_faults()
        outbox_before = await scalar(engine, "SELECT count(*) FROM outbox")

        # When an operator first looks with a dry run, then runs it
        dry = await cli(settings, "reprocess", "--since", "2000-01-01T00:00:00Z", "--reason", "look", "--dry-run")
        dry_rows = await scalar(engine, "SELECT count(*) FROM reprocess_runs")
        dry_outbox = await scalar(engine, "SELECT count(*) FROM outbox")
        real = json.loads(
            (
                await cli(
                    settings,
                    "reprocess",
                    "--since",
                    "2000-01-01T00:00:00Z",
                    "--reason",
                    "directory fixed",
                    "--actor",
                    "alice",
                    "--json",
                )
            ).stdout
        )

    # Then the dry run printed the selection and wrote nothing
    assert "(dry run)" in dry.stdout
    assert f"selected: {topics.source}/0/0" in dry.stdout
    assert f"skipped (does not decode with today's schemas): {topics.source}/0/1" in dry.stdout
    assert (dry_rows, dry_outbox) == (0, outbox_before)
    # And the run left a complete audit row and one row per published item
    [run] = await rows(engine, "SELECT * FROM reprocess_runs")
    assert run["id"] == real["run_id"]
    assert (run["actor"], run["reason"], run["outcome"]) == ("alice", "directory fixed", "completed")
    assert run["selection"]["since"] == "2000-01-01T00:00:00+00:00"
    assert run["counts"]["reprocessed"] == 1
    assert run["counts"]["undecodable"] == [f"{topics.source}/0/1"]
    assert run["started_at"] <= run["finished_at"]
    [item] = await rows(engine, "SELECT * FROM reprocess_items")
    assert (item["failure_id"], item["message_id"], item["outcome"], item["attempt"]) == (
        f"{topics.source}/0/0",
        "Q-0.1/placed",
        "reprocessed",
        1,
    )
    assert item["published_at"] <= item["verified_at"]


async def test_records_of_a_key_released_by_reprocessing_keep_their_order(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given K's placement quarantined from the last tier, with K's shipment and cancellation parked behind it
    downstream.fail_next("customers.get", times=1000, status=503, key="c-k")
    shipped = {"schema": "order.shipped.v1", "order_id": "K", "carrier": "dhl", "tracking_number": "1"}
    records = [("K", placed("K", customer="c-k"), {"message-id": "K.1"}), ("K", shipped, {"message-id": "K.2"})]
    await produce(kafka, topics.source, records, partition=1)
    settings = settings_for(
        database_url, kafka, topics, downstream, retry_tiers="1s", max_attempts=None, max_elapsed="30s"
    )
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM key_blocks"), timeout=60)
        assert await scalar(engine, "SELECT count(*) FROM parked WHERE ordering_key = 'K'") == 1

        # When the directory is back and the head is reprocessed
        downstream.clear_faults()
        await cli(settings, "reprocess", "--failure-id", f"{topics.source}/1/0", "--reason", "fixed", "--yes")
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM inbox WHERE status = 'processed'"))

    # Then the head was applied first and the parked shipment after it: K is shipped, nothing is held
    applied = await rows(engine, "SELECT message_id FROM inbox ORDER BY processed_at")
    assert [row["message_id"] for row in applied] == ["K.1", "K.2"]
    assert await scalar(engine, "SELECT status FROM orders WHERE order_id = 'K'") == "shipped"
    assert (
        await scalar(engine, "SELECT count(*) FROM parked") + await scalar(engine, "SELECT count(*) FROM key_blocks")
        == 0
    )


async def test_annotations_are_append_only_and_resolve_closes_a_record_and_frees_its_key(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given one quarantined record
    await produce(kafka, topics.source, [("N", b"\xff", {})], partition=0)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"))
    failure_id = f"{topics.source}/0/0"

    # When an operator annotates it twice and resolves it
    await cli(settings, "quarantine", "annotate", failure_id, "--note", "producer bug #42", "--author", "bob")
    await cli(settings, "quarantine", "annotate", failure_id, "--note", "fixed upstream", "--author", "eve")
    await cli(settings, "quarantine", "resolve", failure_id, "--reason", "dropped by agreement", "--author", "eve")
    again = await cli(settings, "quarantine", "resolve", failure_id, "--reason", "twice", check=False)
    shown = json.loads((await cli(settings, "quarantine", "show", failure_id, "--json")).stdout)
    tampering = await cli(settings, "quarantine", "annotate", "nope/0/0", "--note", "x", "--author", "y", check=False)

    # Then the notes are kept in order, the record is resolved once, and its timeline tells the story
    assert [(n["author"], n["note"]) for n in shown["annotations"]] == [
        ("bob", "producer bug #42"),
        ("eve", "fixed upstream"),
    ]
    assert (shown["status"], shown["resolution"], shown["resolved_by"]) == ("resolved", "dropped by agreement", "eve")
    assert [(e["event"], e["actor"], e["detail"]) for e in shown["timeline"]] == [
        ("failed", None, None),
        ("quarantined", None, None),
        ("annotated", "bob", "producer bug #42"),
        ("annotated", "eve", "fixed upstream"),
        ("resolved", "eve", "dropped by agreement"),
    ]
    assert again.returncode == 1
    assert "is resolved, not open" in again.stderr
    assert tampering.returncode == 1
    async with engine.connect() as connection:
        from sqlalchemy import text
        from sqlalchemy.exc import DBAPIError

        try:
            await connection.execute(text("DELETE FROM quarantine_annotations"))
            deleted = True
        except DBAPIError as error:
            deleted = "append-only" not in str(error)
    assert not deleted
    assert await scalar(engine, "SELECT count(*) FROM quarantine_annotations") == 2


async def test_reprocess_list_and_show_give_each_run_its_actor_outcome_and_items(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a reprocess run over two orders quarantined while their customer directory was down
    await _quarantined_orders(engine, kafka, topics, downstream, 2)
    ids = [f"{topics.source}/0/{offset}" for offset in (0, 1)]
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM quarantine"), timeout=60)
        downstream.clear_faults()
        await cli(
            settings,
            "reprocess",
            "--error-code",
            "DOWNSTREAM_UNAVAILABLE_EXHAUSTED",
            "--reason",
            "INC-9",
            "--actor",
            "kim",
            "--yes",
            check=False,
        )
    [run_id] = [row["id"] for row in await rows(engine, "SELECT id FROM reprocess_runs")]

    # When the operator lists the runs and shows this one
    listed = json.loads((await cli(settings, "reprocess", "list", "--json")).stdout)
    piped = await cli(settings, "reprocess", "list")
    shown = json.loads((await cli(settings, "reprocess", "show", run_id, "--json")).stdout)
    missing = await cli(settings, "reprocess", "show", "no-such-run", check=False)

    # Then the run is there with who ran it and why, and its items with their outcomes
    assert [(r["id"], r["actor"], r["reason"]) for r in listed] == [(run_id, "kim", "INC-9")]
    assert run_id in piped.stdout
    assert "1 of 1 shown" in piped.stderr
    assert sorted(item["failure_id"] for item in shown["items"]) == sorted(ids)
    assert [item["outcome"] for item in shown["items"]] == ["reprocessed", "reprocessed"]
    assert missing.returncode == 1
    assert "no reprocess run no-such-run" in missing.stderr
    # And each record's timeline shows the run
    record = json.loads((await cli(settings, "quarantine", "show", ids[0], "--json")).stdout)
    assert [event["event"] for event in record["timeline"]][-3:] == [
        "reprocess sent",
        "reprocessed",
        "reprocess reprocessed",
    ]
