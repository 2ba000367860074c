"""A database that refuses a record's quarantine (and its last resort) for other than an outage: the record holds
its partition, as any record not yet terminal does, and is tried again after a growing wait, not at once for ever."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support import ServiceProcess, Topics, committed, eventually, produce, scalar, settings_for
from tests.support.orders import placed

REFUSED = "last_resort_quarantine_failed"


async def test_a_refused_quarantine_is_tried_again_after_a_growing_wait_until_the_database_takes_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a database that refuses every quarantine row (a constraint an operator added, say)
    async with engine.begin() as connection:
        await connection.execute(text("ALTER TABLE quarantine ADD CONSTRAINT refuse_all CHECK (false) NOT VALID"))
    # and a malformed record, then a good order of another key on the same partition
    await produce(kafka, topics.source, [("M-1", b"{not json", {}), ("G-1", placed("G-1"), {})], partition=0)

    # When a consumer reads them
    settings = settings_for(database_url, kafka, topics)
    consumer = ServiceProcess("consume", settings, tmp_path / "consume.log")
    try:
        # Then the good order is applied, while the malformed record's quarantine keeps failing, each time later
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM orders WHERE order_id = 'G-1'"), timeout=60)
        # (1 s, then 2 s, then 4 s …)
        await eventually(lambda: _refused(consumer, 3), timeout=60)
        times = [_seconds(line["timestamp"]) for line in _lines(consumer) if line["event"] == REFUSED][:3]
        assert times[2] - times[0] >= 3.0, times  # at once, for ever: milliseconds apart
        waits = [line["retry_in_seconds"] for line in _lines(consumer) if line["event"] == "record_failed"][:2]
        assert waits == [1.0, 2.0], waits
        assert consumer.process.poll() is None
        assert not await committed(kafka, settings.consumer_name, topics.source, 0, 1)

        # When the database takes quarantine rows again
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE quarantine DROP CONSTRAINT refuse_all"))

        # Then the record is quarantined at its next try, and the partition's offset moves past both records
        await eventually(lambda: committed(kafka, settings.consumer_name, topics.source, 0, 2), timeout=60)
    finally:
        assert consumer.terminate() == 0
    assert await scalar(engine, "SELECT error_code FROM quarantine") == "MALFORMED_PAYLOAD"
    assert await scalar(engine, "SELECT status FROM inbox WHERE message_id LIKE '%/0/0'") == "quarantined"
    assert "Traceback" not in consumer.log()


async def _refused(consumer: ServiceProcess, times: int) -> bool:
    return sum(line["event"] == REFUSED for line in _lines(consumer)) >= times


def _lines(consumer: ServiceProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in consumer.log().splitlines() if line.startswith("{")]


def _seconds(stamp: object) -> float:
    return datetime.fromisoformat(str(stamp)).timestamp()
