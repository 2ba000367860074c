"""Bulk operations on the quarantine queue: a selection, a dry run first, a confirmation (issue 14)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from service.policy.records import SourceRecord
from tests.support import (
    ServiceProcess,
    Topics,
    cli,
    eventually,
    quarantine_directly,
    rows,
    running,
    scalar,
    settings_for,
)


async def test_a_selection_is_resolved_only_after_a_dry_run_and_a_confirmation(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given three malformed records and one of another code in quarantine
    records = [SourceRecord(topics.source, 0, n, 0, f"B-{n}".encode(), b"nope") for n in range(3)]
    records.append(SourceRecord(topics.source, 0, 3, 0, b"B-3", b'{"schema": "order.x.v1"}'))
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, records)

    # When an operator asks for a dry run of resolving the malformed ones
    dry = await cli(
        settings, "quarantine", "resolve", "--error-code", "MALFORMED_PAYLOAD", "--reason", "bad producer", "--dry-run"
    )
    # Then it says how many and which, and changes nothing
    assert dry.stdout.startswith("quarantine resolve: 3 records selected: ")
    assert f"{topics.source}/0/0" in dry.stdout
    assert await rows(engine, "SELECT DISTINCT status FROM quarantine") == [{"status": "open"}]

    # And without a terminal or --yes it refuses to go on
    refused = await cli(
        settings, "quarantine", "resolve", "--error-code", "MALFORMED_PAYLOAD", "--reason", "bad producer", check=False
    )
    assert refused.returncode == 1
    assert "not confirmed" in refused.stderr
    assert await rows(engine, "SELECT DISTINCT status FROM quarantine") == [{"status": "open"}]

    # When it is confirmed, exactly the selection is resolved, with its author and reason
    done = await cli(
        settings,
        "quarantine",
        "resolve",
        "--error-code",
        "MALFORMED_PAYLOAD",
        "--reason",
        "bad producer",
        "--author",
        "oncall-1",
        "--yes",
        "--json",
    )
    assert sorted(json.loads(done.stdout)["resolved"]) == [f"{topics.source}/0/{n}" for n in range(3)]
    found = await rows(engine, "SELECT failure_id, status, resolved_by FROM quarantine ORDER BY failure_id")
    assert [(row["status"], row["resolved_by"]) for row in found] == [("resolved", "oncall-1")] * 3 + [("open", None)]


async def test_failure_ids_can_come_from_a_file(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: object
) -> None:
    records = [SourceRecord(topics.source, 1, n, 0, f"F-{n}".encode(), b"nope") for n in range(2)]
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, records)
    listing = tmp_path / "ids.txt"  # type: ignore[operator]
    listing.write_text(f"{topics.source}/1/1\n\n")

    await cli(settings, "quarantine", "resolve", "--from-file", str(listing), "--reason", "duplicate")

    found = await rows(engine, "SELECT failure_id, status FROM quarantine ORDER BY failure_id")
    assert [row["status"] for row in found] == ["open", "resolved"]


async def test_the_queue_is_searched_by_time_range_and_message_id(
    database_url: str, kafka: str, topics: Topics
) -> None:
    records = [
        SourceRecord(topics.source, 2, n, 0, f"T-{n}".encode(), b"nope", (("message-id", f"T-{n}/m".encode()),))
        for n in range(2)
    ]
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, records)

    async def listed(*flags: str) -> list[str]:
        found = await cli(settings, "quarantine", "list", *flags, "--json")
        return [row["message_id"] for row in json.loads(found.stdout)]

    assert await listed("--since", "2000-01-01T00:00:00Z") == ["T-0/m", "T-1/m"]
    assert await listed("--since", "2999-01-01T00:00:00Z") == []
    assert await listed("--until", "2000-01-01T00:00:00Z") == []
    assert await listed("--message-id", "T-1/m") == ["T-1/m"]
    piped = await cli(settings, "quarantine", "list")
    assert piped.stdout.splitlines()[0].split("\t")[:2] == ["failure id", "message id"]
    assert f"{topics.source}/2/0\tT-0/m" in piped.stdout  # full ids, tab-separated when piped
    assert "2 of 2 shown" in piped.stderr


async def test_a_selection_exports_as_csv(database_url: str, kafka: str, topics: Topics) -> None:
    records = [SourceRecord(topics.source, 0, n, 0, f"C-{n}".encode(), b"nope") for n in range(2)]
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, records)

    exported = await cli(settings, "quarantine", "list", "--error-code", "MALFORMED_PAYLOAD", "--csv")

    lines = list(csv.reader(io.StringIO(exported.stdout)))
    assert lines[0][:3] == ["failure_id", "message_id", "error_code"]
    assert [line[0] for line in lines[1:]] == [f"{topics.source}/0/0", f"{topics.source}/0/1"]
    assert {line[2] for line in lines[1:]} == {"MALFORMED_PAYLOAD"}


async def test_an_unset_payments_url_leaves_the_capture_pending_and_effects_list_says_why(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given an order whose capture is pending, and no ORDERS_PAYMENTS_URL
    settings = settings_for(database_url, kafka, topics, payments_url=None, emails_url=None)
    placed = json.dumps(
        {
            "schema": "order.placed.v1",
            "order_id": "E-1",
            "tenant": "acme",
            "customer_id": "c-1",
            "currency": "EUR",
            "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 100}],
        }
    ).encode()
    async with running(settings) as container:
        processor = await container.processor()
        record = SourceRecord(topics.source, 0, 0, 0, b"E-1", placed)
        await processor.attempt([processor.pending(record)], asyncio.Event())

    # When an effect worker runs
    worker = ServiceProcess("effects", settings, tmp_path / "effects.log")
    try:
        await eventually(lambda: _true("provider_not_configured" in worker.log()), timeout=30)
    finally:
        assert worker.terminate() == 0

    # Then the capture is untouched: pending, no attempt, no payment.failed; and the CLI says why it waits
    shown = json.loads((await cli(settings, "effects", "show", "E-1/payment.capture", "--json")).stdout)
    assert (shown["state"], shown["attempts"], shown["last_error_code"]) == ("pending", 0, None)
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE payload::text LIKE '%payment.failed%'") == 0
    listed = await cli(settings, "effects", "list")
    assert "E-1/payment.capture\tpayment.capture\tpending\t0\tprovider not configured" in listed.stdout


async def _true(value: bool) -> bool:
    await asyncio.sleep(0)
    return value
