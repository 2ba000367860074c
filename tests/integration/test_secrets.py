"""What a downstream says in an error body never leaves the process: not on a topic, not in a header, not in logs."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import ServiceProcess, Topics, eventually, produce, read_topic, rows, scalar, settings_for
from tests.support.orders import placed

BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig"
CARD = "4111111111111111"


async def test_a_secret_in_a_downstream_error_body_appears_nowhere(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a customer directory whose errors carry a bearer token and a card number
    body = {"error": f"upstream said {BEARER}", "card": CARD, "detail": f"Authorization: {BEARER}"}
    downstream.fail_next("customers.get", times=1, status=400, body=body)
    downstream.fail_next("customers.get", times=50, status=503, body=body)
    await produce(kafka, topics.source, [("S-1", placed("S-1"), {}), ("S-2", placed("S-2", customer="c-2"), {})])
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, max_attempts=2, max_elapsed="3s")

    # When the service retries, gives up and quarantines, with the relay publishing
    service = ServiceProcess("run", settings, tmp_path / "service.log")
    try:
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM quarantine"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    finally:
        assert service.terminate() == 0

    # Then the failures are recorded by code only
    quarantined = await rows(engine, "SELECT error_code, envelope::text AS envelope FROM quarantine")
    assert {row["error_code"] for row in quarantined} <= {
        "DOWNSTREAM_UNAVAILABLE_EXHAUSTED",
        "UNEXPECTED_ERROR_EXHAUSTED",
    }
    # And neither secret is on any topic, in any header, in the envelopes or in the process log
    published = []
    for topic in (topics.quarantine, topics.events, topics.rejected):
        published += await read_topic(kafka, topic, expect=2 if topic == topics.quarantine else 0, timeout=10)
    assert len(published) == 2
    everything = [record.value for record in published]
    everything += [value for record in published for _, value in record.headers]
    everything += [row["envelope"].encode() for row in quarantined]
    everything.append(service.log().encode())
    for blob in everything:
        for secret in (CARD, "eyJhbGciOiJIUzI1NiJ9", "Bearer"):
            assert secret.encode() not in blob
    assert '"record_failed"' in service.log()
