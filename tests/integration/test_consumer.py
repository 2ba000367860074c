"""The idempotent consumer on real Kafka and PostgreSQL: quarantine, blocking retry, duplicates, crashes."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import (
    ServiceProcess,
    Topics,
    eventually,
    produce,
    read_topic,
    rows,
    running,
    scalar,
    settings_for,
)
from tests.support import committed as _committed
from tests.support.orders import placed

ENVELOPE_KEYS = {
    "failureId",
    "messageId",
    "source",
    "consumer",
    "attempt",
    "firstFailedAt",
    "lastFailedAt",
    "errorCode",
    "payloadSchema",
    "traceId",
}


async def test_invalid_input_is_quarantined_at_once_with_a_contract_envelope(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given malformed bytes, an unsupported schema and a missing field
    await produce(
        kafka,
        topics.source,
        [
            ("A-1", b"{not json", {"message-id": "A-1.1/order.placed"}),
            ("A-2", {"schema": "order.teleported.v9", "order_id": "A-2"}, {}),
            ("A-3", {"schema": "order.shipped.v1", "order_id": "A-3", "carrier": "dhl"}, {}),
        ],
        partition=0,
    )
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When the consumer and the relay run
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 3 FROM quarantine"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    quarantined = await rows(engine, "SELECT * FROM quarantine ORDER BY failure_id")
    envelopes = await read_topic(kafka, topics.quarantine, expect=3)

    # Then each is quarantined once, on the first attempt, with its code and an envelope on the topic
    codes = {row["failure_id"]: row["error_code"] for row in quarantined}
    assert codes == {
        f"{topics.source}/0/0": "MALFORMED_PAYLOAD",
        f"{topics.source}/0/1": "SCHEMA_UNSUPPORTED",
        f"{topics.source}/0/2": "INVALID_FIELD",
    }
    assert all(row["attempts"] == 1 and row["status"] == "open" for row in quarantined)
    assert quarantined[0]["payload"] == b"{not json"
    assert len(envelopes) == 3
    for record in envelopes:
        envelope = json.loads(record.value)
        headers = {name: value.decode() for name, value in record.headers}
        assert set(envelope) == ENVELOPE_KEYS
        assert headers == {
            "failure-id": envelope["failureId"],
            "message-id": envelope["messageId"],
            "error-code": envelope["errorCode"],
        }
        assert envelope["consumer"] == settings.consumer_name
        assert record.key.decode() == envelope["source"]["key"]
        assert b"not json" not in record.value
    first = next(json.loads(r.value) for r in envelopes if json.loads(r.value)["source"]["offset"] == 0)
    assert first["messageId"] == "A-1.1/order.placed"
    assert await scalar(engine, "SELECT count(*) FROM inbox WHERE status = 'quarantined'") == 3
    assert downstream.calls("customers.get") == 0


async def test_a_rate_limited_customer_lookup_recovers_inside_the_blocking_budget(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a customer directory that answers 429 (Retry-After: 1) once, then 200
    downstream.fail_next("customers.get", times=1, status=429, retry_after=1)
    await produce(kafka, topics.source, [("B-1", placed("B-1"), {})])
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When the consumer runs
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) FROM inbox"))

    # Then the order is applied once, with one effect, after exactly two lookups
    assert await rows(engine, "SELECT order_id, status, amount_cents FROM orders") == [
        {"order_id": "B-1", "status": "placed", "amount_cents": 2500}
    ]
    assert await rows(engine, "SELECT idempotency_key, state FROM effects") == [
        {"idempotency_key": "B-1/payment.capture", "state": "pending"}
    ]
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
    assert downstream.calls("customers.get", "c-1") == 2


async def test_rejections_are_terminal_and_emit_one_rejected_event(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given an unknown tenant, a blocked customer, a shipment of an unknown order and a double placement
    await produce(
        kafka,
        topics.source,
        [
            ("C-1", placed("C-1", tenant="umbrella"), {}),
            ("C-2", placed("C-2", customer="blocked-7"), {}),
            ("C-3", {"schema": "order.shipped.v1", "order_id": "C-3", "carrier": "ups", "tracking_number": "1Z"}, {}),
            ("C-4", placed("C-4"), {"message-id": "C-4.1/order.placed"}),
            ("C-4", placed("C-4"), {"message-id": "C-4.1b/order.placed"}),
        ],
        partition=1,
    )
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    # When the service runs
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 5 FROM inbox"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))

    # Then each rejection has its code, an inbox row and one event; the valid order is applied
    assert await rows(engine, "SELECT message_id, status, error_code FROM inbox ORDER BY source_offset") == [
        {"message_id": f"{topics.source}/1/0", "status": "rejected", "error_code": "UNKNOWN_TENANT"},
        {"message_id": f"{topics.source}/1/1", "status": "rejected", "error_code": "CUSTOMER_BLOCKED"},
        {"message_id": f"{topics.source}/1/2", "status": "rejected", "error_code": "ORDER_NOT_FOUND"},
        {"message_id": "C-4.1/order.placed", "status": "processed", "error_code": None},
        {"message_id": "C-4.1b/order.placed", "status": "rejected", "error_code": "ORDER_EXISTS"},
    ]
    rejected = [json.loads(r.value) for r in await read_topic(kafka, topics.rejected, expect=4)]
    assert sorted(event["errorCode"] for event in rejected) == [
        "CUSTOMER_BLOCKED",
        "ORDER_EXISTS",
        "ORDER_NOT_FOUND",
        "UNKNOWN_TENANT",
    ]
    events = [json.loads(r.value) for r in await read_topic(kafka, topics.events, expect=1)]
    assert [(event["type"], event["orderId"]) for event in events] == [("order.accepted", "C-4")]
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0


async def test_the_same_record_delivered_twice_has_one_effect(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given one message produced twice (a producer retry)
    record = ("D-1", placed("D-1"), {"message-id": "D-1.1/order.placed"})
    await produce(kafka, topics.source, [record, record], partition=2)
    settings = settings_for(database_url, kafka, topics)

    # When the service consumes both, and later a third copy after a restart
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM inbox"))
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 2, 2))
    await produce(kafka, topics.source, [record], partition=2)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 2, 3))

    # Then there is one order, one effect, one processed inbox row and one event in the outbox
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert await rows(engine, "SELECT message_id, status FROM inbox") == [
        {"message_id": "D-1.1/order.placed", "status": "processed"}
    ]
    assert await scalar(engine, "SELECT count(*) FROM outbox") == 1


async def test_two_consumer_processes_racing_on_one_message_id_apply_it_once(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given two consumer processes in one group, each owning different partitions (logging at debug: a duplicate's
    # line is a debug line)
    settings = settings_for(database_url, kafka, topics, log_level="debug")
    first = ServiceProcess("consume", settings, tmp_path / "first.log")
    second = ServiceProcess("consume", settings, tmp_path / "second.log")
    try:
        owners = await eventually(lambda: _split_assignment(first, second, topics.source), timeout=60)

        # When one message id arrives on a partition of each
        record = ("E-1", placed("E-1"), {"message-id": "E-1.1/order.placed"})
        await produce(kafka, topics.source, [record], partition=owners[0])
        await produce(kafka, topics.source, [record], partition=owners[1])
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, owners[0], 1))
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, owners[1], 1))
    finally:
        assert first.terminate() == 0
        assert second.terminate() == 0

    # Then the business effect happened once
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert await scalar(engine, "SELECT count(*) FROM inbox") == 1
    assert "record_duplicate" in first.log() + second.log()


async def test_a_message_another_consumer_applies_while_this_one_decides_is_not_applied_again(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a placed order whose customer look-up answers only after 1.2 s
    downstream.delay_next("customers.get", seconds=1.2, key="c-race")
    record = ("F-1", placed("F-1", customer="c-race"), {"message-id": "F-1.1/order.placed"})
    await produce(kafka, topics.source, [record], partition=0)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)

    async with running(settings, "consumer_loop") as container:
        # When, while the consumer waits for that answer (its look-up found the message new), another member of
        # its group commits the same message: its inbox row, the order and the order's effect
        await eventually(lambda: _true(downstream.calls("customers.get", "c-race") == 1), interval=0.01)
        async with engine.begin() as connection:
            for statement in _OTHER_MEMBERS_ROWS:
                await connection.execute(text(statement), {"consumer": settings.consumer_name, "topic": topics.source})
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 0, 1))
        metrics = container.metrics().registry

    # Then this consumer's write hit the unique keys, was rolled back and redone (not failed: no attempt spent), and
    # found the message applied: the other member's rows are the only ones, and this consumer wrote no event
    assert metrics.get_sample_value("orders_records_total", {"outcome": "duplicate"}) == 1
    assert metrics.get_sample_value("orders_failures_total", {"error_code": "UNEXPECTED_ERROR"}) is None
    assert await rows(engine, "SELECT message_id, status FROM inbox") == [
        {"message_id": "F-1.1/order.placed", "status": "processed"}
    ]
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert await rows(engine, "SELECT idempotency_key, payload FROM effects") == [
        {"idempotency_key": "F-1/payment.capture", "payload": {"by": "the other member"}}
    ]
    assert await scalar(engine, "SELECT count(*) FROM outbox") == 0
    assert downstream.calls("customers.get", "c-race") == 1


_OTHER_MEMBERS_ROWS = (
    "INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset, aggregate_id,"
    " received_at) VALUES (:consumer, 'F-1.1/order.placed', 'processed', :topic, 0, 0, 'F-1', now())",
    "INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency)"
    " VALUES ('F-1', 'acme', 'c-race', 'placed', 2500, 'EUR')",
    "INSERT INTO effects (idempotency_key, aggregate_id, kind, payload)"
    " VALUES ('F-1/payment.capture', 'F-1', 'payment.capture', '{\"by\": \"the other member\"}')",
)


async def _true(value: bool) -> bool:
    return value


async def test_a_consumer_killed_between_its_commit_and_the_offset_commit_does_not_apply_twice(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a consumer that dies (SIGKILL) right after its business transaction committed
    await produce(kafka, topics.source, [("F-1", placed("F-1"), {})], partition=0)
    settings = settings_for(database_url, kafka, topics)
    doomed = ServiceProcess("consume", settings, tmp_path / "doomed.log", {"ORDERS_FAULT_CRASH_AT": "after-commit"})
    assert doomed.wait() == -9
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert not await _committed(kafka, settings.consumer_name, topics.source, 0, 1)

    # When a healthy consumer takes over and Kafka delivers the record again (logging at debug: a duplicate's line
    # is a debug line)
    healthy = ServiceProcess("consume", settings, tmp_path / "healthy.log", {"ORDERS_LOG_LEVEL": "debug"})
    try:
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 0, 1), timeout=60)
    finally:
        assert healthy.terminate() == 0

    # Then the redelivery is recognised as a duplicate: one order, one effect, one event
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert await scalar(engine, "SELECT count(*) FROM outbox") == 1
    assert "record_duplicate" in healthy.log()


async def _split_assignment(first: ServiceProcess, second: ServiceProcess, topic: str) -> tuple[int, int] | None:
    """One partition owned by each process, once both hold a non-empty share of the topic."""
    mine, theirs = _last_assignment(first.log(), topic), _last_assignment(second.log(), topic)
    if mine and theirs and not mine & theirs and len(mine | theirs) == 3:
        return min(mine), min(theirs)
    return None


def _last_assignment(log: str, topic: str) -> set[int]:
    assigned: set[int] = set()
    for line in log.splitlines():
        if '"partitions_assigned"' in line:
            owned = (p.rsplit("/", 1) for p in json.loads(line)["partitions"])
            assigned = {int(partition) for name, partition in owned if name == topic}
    return assigned


async def test_an_unreachable_database_is_waited_out_with_one_line_per_try_and_nothing_committed(
    kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a record and a consumer whose database does not answer
    await produce(kafka, topics.source, [("H-1", placed("H-1"), {})], partition=0)
    settings = settings_for("postgresql+asyncpg://postgres@127.0.0.1:9/nowhere", kafka, topics)
    consumer = ServiceProcess("consume", settings, tmp_path / "consumer.log")
    try:
        # When it tries to apply the record
        await eventually(lambda: _count_in_log(consumer, '"database_unavailable"', 2), timeout=60)
    finally:
        # Then it stops cleanly on SIGTERM, has said why in plain lines, and committed nothing
        assert consumer.terminate() == 0
    assert "Traceback" not in consumer.log()
    assert not await _committed(kafka, settings.consumer_name, topics.source, 0, 1)


async def _count_in_log(process: ServiceProcess, text: str, at_least: int) -> bool:
    return process.log().count(text) >= at_least


async def test_a_consumer_killed_in_the_middle_of_a_batch_leaves_each_record_with_exactly_one_effect(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given 300 orders over three partitions, applied in shared batches, and a consumer that dies (SIGKILL)
    # with a batch written but not committed
    records = [(f"M-{n}", placed(f"M-{n}"), {"message-id": f"M-{n}.1"}) for n in range(300)]
    await produce(kafka, topics.source, records)
    settings = settings_for(database_url, kafka, topics, batch_size=100)
    doomed = ServiceProcess("consume", settings, tmp_path / "doomed.log", {"ORDERS_FAULT_CRASH_AT": "mid-write"})
    assert doomed.wait() == -9
    assert await scalar(engine, "SELECT count(*) FROM inbox") == 0

    # When a healthy consumer takes over
    healthy = ServiceProcess("consume", settings, tmp_path / "healthy.log")
    try:
        await eventually(lambda: scalar(engine, "SELECT count(*) = 300 FROM inbox"), timeout=60)
    finally:
        assert healthy.terminate() == 0

    # Then every record of the interrupted batch and the rest has exactly one order, one effect, one event
    assert await scalar(engine, "SELECT count(*) FROM orders") == 300
    assert await scalar(engine, "SELECT count(DISTINCT idempotency_key) = count(*) AND count(*) = 300 FROM effects")
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE topic LIKE '%.events'") == 300
