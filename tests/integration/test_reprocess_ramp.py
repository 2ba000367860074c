"""A ramped reprocess on real Kafka and PostgreSQL: batches of 1, 2, 5, 20, … each sent once the one before is
verified, and the first failure stops the run with the rest untouched."""

from __future__ import annotations

import itertools
import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.integration.test_reprocess import settings_for
from tests.support import Topics, cli, eventually, produce, rows, running, scalar
from tests.support.orders import placed

RAMP = ["--error-code", "DOWNSTREAM_UNAVAILABLE_EXHAUSTED", "--ramp", "--rate", "50", "--yes", "--json"]


async def _thirty_quarantined(engine: AsyncEngine, kafka: str, topics: Topics, downstream: Downstream) -> None:
    """Thirty placed orders quarantined while their customer directory was down (R-4's customer is c-x, the
    others' c-q), first failed in the order of their numbers (so a run takes them in that order)."""
    for customer in ("c-q", "c-x"):
        downstream.fail_next("customers.get", times=1000, status=503, key=customer)
    records = [
        (f"R-{k}", placed(f"R-{k}", customer="c-x" if k == 4 else "c-q"), {"message-id": f"R-{k}.1/placed"})
        for k in range(30)
    ]
    await produce(kafka, topics.source, records, partition=0)
    await eventually(lambda: scalar(engine, "SELECT count(*) = 30 FROM quarantine"), timeout=90)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE quarantine SET first_failed_at = now() - interval '1 hour' "
                "+ CAST(substring(ordering_key from 3) AS int) * interval '1 second'"
            )
        )


async def _batches(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await rows(
        engine,
        """
        SELECT stage, count(*) AS size, min(published_at) AS first_sent, max(verified_at) AS last_verified,
               array_agg(outcome ORDER BY outcome) AS outcomes
        FROM reprocess_items GROUP BY stage ORDER BY min(published_at)
        """,
    )


async def test_a_ramp_sends_batches_of_1_2_5_20_and_the_rest_each_after_the_one_before_is_verified(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given thirty quarantined orders and the directory back up
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await _thirty_quarantined(engine, kafka, topics, downstream)
    downstream.clear_faults()
    # (a consumer started now: the one that saw the outage keeps its breaker open for a while, and a copy refused
    # by it would fail again at once, its elapsed budget counted from its first failure an hour ago)
    async with running(settings, "consumer_loop", "relay"):
        # When they are reprocessed with a ramp
        report = json.loads((await cli(settings, "reprocess", *RAMP, "--reason", "directory fixed")).stdout)

    # Then every record was applied once, in batches of 1, 2, 5, 20 and the 2 left
    assert (report["outcome"], report["reprocessed"], report["failed_again"]) == ("completed", 30, 0)
    batches = await _batches(engine)
    assert [(b["stage"], b["size"]) for b in batches] == [
        ("ramp 1", 1),
        ("ramp 2", 2),
        ("ramp 3", 5),
        ("ramp 4", 20),
        ("ramp 5", 2),
    ]
    assert all(set(b["outcomes"]) == {"reprocessed"} for b in batches)
    # And each batch was sent only after every item of the one before was verified
    assert all(later["first_sent"] >= earlier["last_verified"] for earlier, later in itertools.pairwise(batches))
    assert await scalar(engine, "SELECT count(*) FROM orders") == 30
    [run] = await rows(engine, "SELECT options FROM reprocess_runs")
    assert run["options"]["ramp"] is True


async def test_a_failure_in_the_third_batch_stops_the_ramp_and_leaves_the_later_records_untouched(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given thirty quarantined orders, and the directory back up for all but R-4's customer (R-4 is 5th in line)
    settings = settings_for(database_url, kafka, topics, downstream)
    async with running(settings, "consumer_loop", "relay"):
        await _thirty_quarantined(engine, kafka, topics, downstream)
    downstream.clear_faults()
    downstream.fail_next("customers.get", times=1000, status=503, key="c-x")
    async with running(settings, "consumer_loop", "relay"):  # with closed breakers (as in the test above)
        # When they are reprocessed with a ramp
        result = await cli(settings, "reprocess", *RAMP, "--reason", "directory fixed", check=False)

    # Then the run stopped after the third batch (5 records), naming the batch and the record that failed
    report = json.loads(result.stdout)
    assert result.returncode == 3, result.stderr
    assert report["outcome"] == "stopped"
    failure_id = await scalar(engine, "SELECT failure_id FROM quarantine WHERE ordering_key = 'R-4'")
    assert report["stop_reason"].startswith(f"ramp batch 3 of 5 (5 records): {failure_id} failed again")
    [run] = await rows(engine, "SELECT outcome, stop_reason FROM reprocess_runs")
    assert run == {"outcome": "stopped", "stop_reason": report["stop_reason"]}
    assert [(b["stage"], b["size"]) for b in await _batches(engine)] == [("ramp 1", 1), ("ramp 2", 2), ("ramp 3", 5)]
    # And the 22 records after it were never sent: still open, never reprocessed
    untouched = await rows(
        engine,
        """
        SELECT q.ordering_key FROM quarantine q
        WHERE q.status = 'open' AND q.repeat_failures = 0
          AND NOT EXISTS (SELECT 1 FROM reprocess_items i WHERE i.failure_id = q.failure_id)
        """,
    )
    assert sorted(int(row["ordering_key"][2:]) for row in untouched) == list(range(8, 30))
    assert await scalar(engine, "SELECT count(*) FROM orders") == 7
