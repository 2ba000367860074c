"""The effects ledger on real Kafka, PostgreSQL and HTTP: the effect worker, the reconciler and the dedup window.

Effects are created the way production creates them, by consuming order records. The provider is the
fault-injecting downstream test server; every test asserts on what the provider holds (payments, emails,
calls) as well as on the effect rows, the events and the counts. Outcomes are awaited by polling.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.config import Settings
from service.containers import Container
from service.errors import InfrastructureUnavailable
from service.orders import store as order_store
from service.orders.domain import DOMAIN
from service.orders.fakes import Downstream
from service.orders.model import Order, OrderStatus, capture_of
from service.policy.effects import EffectDecision
from service.store import effects as effect_store
from service.store.effects import EffectRow
from service.store.uow import UnitOfWork
from service.worker import effects as effects_worker
from service.worker.effects import record_outcomes
from tests.support import (
    ServiceProcess,
    Topics,
    eventually,
    order_service,
    produce,
    read_topic,
    rows,
    running,
    scalar,
)
from tests.support import committed as _committed
from tests.support.effects import (
    LOCK_MESSAGE,
    called,
    effect,
    effect_settings,
    events_in_outbox,
    finish,
    payment_status,
    reconcile,
    start_reconcile,
    state_is,
)
from tests.support.orders import cancelled, placed, shipped


async def test_a_worker_killed_during_a_capture_call_leaves_one_payment_after_restart_and_reconcile(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # a. The worker is killed (SIGKILL) while a capture call is in flight: after a restart of the worker and
    # one reconcile (after the lease expired), the provider holds exactly one payment and the effect is sent.

    # Given a placed order whose capture the provider applies but answers only after 10 s
    key = "A-1/payment.capture"
    downstream.delay_next("payments.post", seconds=10, key=key)
    settings = effect_settings(database_url, kafka, topics, downstream, http_timeout="2s", effect_lease="5s")
    await produce(kafka, topics.source, [("A-1", placed("A-1"), {})], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: state_is(engine, key, "pending"))

    # When the worker process is killed while that call is in flight
    doomed = ServiceProcess("effects", settings, tmp_path / "doomed.log")
    await eventually(lambda: called(downstream, "payments.post", 1, key))
    doomed.kill()
    assert (await effect(engine, key))["state"] == "in_flight"

    # And a new worker starts, and reconcile runs once the dead worker's lease has expired
    restarted = ServiceProcess("effects", settings, tmp_path / "restarted.log")
    try:
        lease_expired = "SELECT lease_until < now() FROM effects WHERE idempotency_key = :key"
        await eventually(lambda: scalar(engine, lease_expired, key=key))
        run = await reconcile(settings)
        await eventually(lambda: state_is(engine, key, "sent"))
    finally:
        assert restarted.terminate() == 0

    # Then the provider holds one payment, the effect is sent with its id, and it was never paid twice
    assert run.stdout.startswith("reconcile: 1 expired leases taken back; uncertain effects: 1 sent, ")
    payments = downstream.payments()
    assert list(payments) == [key]
    row = await effect(engine, key)
    assert (row["state"], row["provider_ref"], row["attempts"]) == ("sent", payments[key]["payment_id"], 1)
    assert row["lease_owner"] is None
    assert downstream.calls("payments.post", key) == 1
    assert downstream.calls("payments.get", key) == 1
    assert len(await events_in_outbox(engine, topics, "payment.captured")) == 1
    assert await payment_status(engine, "A-1") == "captured"
    assert await scalar(engine, "SELECT count(*) FROM reconcile_runs") == 1


async def test_b_a_capture_that_timed_out_after_the_provider_recorded_it_is_reconciled_to_sent(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # b. The provider records a payment then times out (delay longer than ORDERS_HTTP_TIMEOUT): the effect
    # becomes uncertain; reconcile makes it sent with the provider's payment id; one payment; one POST.

    # Given a provider that records the capture but answers after 3 s, with an HTTP timeout of 1 s
    key = "B-1/payment.capture"
    downstream.delay_next("payments.post", seconds=3, key=key)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("B-1", placed("B-1"), {})], partition=0)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When the worker's call times out
        await eventually(lambda: state_is(engine, key, "uncertain"))
        uncertain = await effect(engine, key)
        # And reconcile runs
        run = await reconcile(settings)

    # Then the effect was uncertain, and reconcile found the payment and marked it sent with its id
    assert (uncertain["last_error_code"], uncertain["provider_ref"]) == ("DOWNSTREAM_TIMEOUT", None)
    assert run.stdout.startswith("reconcile: 0 expired leases taken back; uncertain effects: 1 sent, ")
    payments = downstream.payments()
    assert list(payments) == [key]
    row = await effect(engine, key)
    assert (row["state"], row["provider_ref"], row["attempts"]) == ("sent", payments[key]["payment_id"], 1)
    assert downstream.calls("payments.post", key) == 1
    assert downstream.calls("payments.get", key) == 1
    assert len(await events_in_outbox(engine, topics, "payment.captured")) == 1
    assert await payment_status(engine, "B-1") == "captured"


async def test_c_an_email_sent_before_a_timeout_is_found_by_its_ref_and_never_sent_again(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # c. The email provider sends then times out: reconcile finds the ref and marks sent (one email for the ref).

    # Given a shipped order whose email the provider sends but acknowledges after 3 s (HTTP timeout 1 s)
    ref = "C-1/email.shipped"
    downstream.delay_next("emails.post", seconds=3, key=ref)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("C-1", placed("C-1"), {}), ("C-1", shipped("C-1"), {})], partition=0)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When the send times out, and reconcile runs
        await eventually(lambda: state_is(engine, ref, "uncertain"))
        run = await reconcile(settings)

    # Then reconcile found the email by its ref: sent with its id, and exactly one email exists
    assert "uncertain effects: 1 sent, 0 back to pending" in run.stdout
    [email] = downstream.emails(ref)
    row = await effect(engine, ref)
    assert (row["state"], row["provider_ref"], row["attempts"]) == ("sent", email["email_id"], 1)
    assert downstream.calls("emails.post", ref) == 1
    assert downstream.calls("emails.get", ref) == 1


async def test_c_an_email_the_provider_sends_only_after_our_timeout_is_found_not_sent_again(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # c. The provider takes the email but acts on it only 4 s later, after our timeout (1 s): a look-up soon
    # after the timeout finds nothing (a reconcile process starts within about 1.5 s). The resend's own look-up must
    # wait for the provider to settle (the 6 s lease), else it too finds nothing and the ref gets a second email.

    # Given a shipped order whose email request the provider holds 4 s before it sends the email
    ref = "C-3/email.shipped"
    downstream.set_latency("emails.post", 4.0)
    settings = effect_settings(database_url, kafka, topics, downstream, effect_lease="6s")
    await produce(kafka, topics.source, [("C-3", placed("C-3"), {}), ("C-3", shipped("C-3"), {})], partition=0)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When the send times out, reconcile runs at once (the provider has not sent it yet), and the provider
        # is quick again for anything sent after that
        await eventually(lambda: state_is(engine, ref, "uncertain"))
        run = await reconcile(settings)
        downstream.set_latency("emails.post", 0.0)
        await eventually(lambda: state_is(engine, ref, "sent"))

    # Then reconcile found nothing and sent the effect back; the worker looked it up again once the provider had
    # settled, found the email, and never posted a second one
    assert "uncertain effects: 0 sent, 1 back to pending" in run.stdout
    [email] = downstream.emails(ref)
    row = await effect(engine, ref)
    assert (row["state"], row["provider_ref"]) == ("sent", email["email_id"])
    assert downstream.calls("emails.post", ref) == 1


async def test_c_an_email_cut_before_the_provider_sent_it_is_sent_exactly_once_after_reconcile(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # c. When the provider did NOT send (connection cut before applying → uncertain), reconcile sends it back
    # to pending and the worker sends it exactly once.

    # Given a shipped order whose email request is cut before the provider sent anything
    ref = "C-2/email.shipped"
    downstream.cut_next("emails.post", after_apply=False, key=ref)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("C-2", placed("C-2"), {}), ("C-2", shipped("C-2"), {})], partition=0)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When the worker cannot tell whether the email went out
        await eventually(lambda: state_is(engine, ref, "uncertain"))
        uncertain = await effect(engine, ref)
        assert downstream.emails(ref) == []
        # And reconcile runs, with the worker still running
        run = await reconcile(settings)
        await eventually(lambda: state_is(engine, ref, "sent"))

    # Then reconcile found no email and sent the effect back; the worker checked again and sent it once
    assert uncertain["last_error_code"] == "DOWNSTREAM_UNREACHABLE"
    assert "uncertain effects: 0 sent, 1 back to pending" in run.stdout
    [email] = downstream.emails(ref)
    row = await effect(engine, ref)
    assert (row["state"], row["provider_ref"]) == ("sent", email["email_id"])
    assert (row["attempts"], row["reconcile_count"]) == (2, 1)
    assert downstream.calls("emails.post", ref) == 2  # the cut one, then the one that was sent
    assert downstream.calls("emails.get", ref) == 2  # reconcile's look-up, then the worker's before resending


async def test_d_a_declined_capture_fails_the_effect_and_emits_one_payment_failed_event(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # d. A 402 decline: effect failed (PAYMENT_DECLINED), order payment_status failed, exactly one
    # payment.failed event on <source>.events.

    # Given an order whose card the provider declines
    key = "D-1/payment.capture"
    downstream.decline_order("D-1")
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("D-1", placed("D-1"), {})], partition=0)

    # When the service runs with its relay
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "failed"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    events = [
        (record.key.decode(), json.loads(record.value)) for record in await read_topic(kafka, topics.events, expect=2)
    ]

    # Then the effect failed at once with the decline, the order says so, and one payment.failed event is out
    row = await effect(engine, key)
    assert (row["state"], row["last_error_code"], row["attempts"], row["provider_ref"]) == (
        "failed",
        "PAYMENT_DECLINED",
        1,
        None,
    )
    assert await payment_status(engine, "D-1") == "failed"
    assert downstream.payments() == {}
    assert downstream.calls("payments.post", key) == 1
    assert sorted(event["type"] for _, event in events) == ["order.accepted", "payment.failed"]
    [(record_key, failed)] = [(k, event) for k, event in events if event["type"] == "payment.failed"]
    assert record_key == "D-1"
    assert failed == {
        "type": "payment.failed",
        "orderId": "D-1",
        "orderVersion": 2,  # placed is 1; the payment outcome changed the order
        "effect": key,
        "kind": "payment.capture",
        "errorCode": "PAYMENT_DECLINED",
    }


async def test_a_capture_answered_200_with_a_failed_status_is_declined_not_sent(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a provider that answers the capture 200 with a payment whose status says it failed
    key = "D-2/payment.capture"
    downstream.fail_next("payments.post", status=200, body={"payment_id": "pay-9", "status": "failed"}, key=key)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("D-2", placed("D-2"), {})], partition=0)

    # When the service runs with its relay
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "failed"))
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
    events = [json.loads(record.value) for record in await read_topic(kafka, topics.events, expect=2)]

    # Then the capture failed as with a 402: no reference, the order says so, and payment.failed is out, not captured
    row = await effect(engine, key)
    assert (row["state"], row["last_error_code"], row["provider_ref"]) == ("failed", "PAYMENT_DECLINED", None)
    assert await payment_status(engine, "D-2") == "failed"
    assert sorted(event["type"] for event in events) == ["order.accepted", "payment.failed"]


async def test_a_capture_whose_endpoint_answers_404_waits_for_the_url_to_be_fixed_and_spends_no_attempt(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a payments URL whose endpoint answers 404 (a wrong path prefix, a proxy routing elsewhere)
    key = "M-1/payment.capture"
    downstream.fail_next("payments.post", status=404, key=key)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("M-1", placed("M-1"), {})], partition=0)

    # When the service runs
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: scalar(engine, f"SELECT last_error_code FROM effects WHERE idempotency_key = '{key}'"))

    # Then the capture waits, pending, with no attempt spent: not failed, no payment.failed for a configuration error
    row = await effect(engine, key)
    assert (row["state"], row["last_error_code"], row["attempts"]) == ("pending", "PROVIDER_MISCONFIGURED", 0)
    assert await payment_status(engine, "M-1") != "failed"


async def test_e_of_two_reconcilers_started_together_one_does_the_work_and_the_other_exits_0_at_once(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # e. Two reconcilers started together: the second exits 0 printing the lock message; the first exits 0
    # printing a summary and did the work; exactly one reconcile_runs row.

    # Given an uncertain capture (the provider recorded it, then cut the connection)
    key = "E-1/payment.capture"
    downstream.cut_next("payments.post", after_apply=True, key=key)
    settings = effect_settings(database_url, kafka, topics, downstream, http_timeout="5s", effect_lease="11s")
    await produce(kafka, topics.source, [("E-1", placed("E-1"), {})], partition=0)
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(lambda: state_is(engine, key, "uncertain"))
    # And a provider look-up that takes 4 s, so the first reconciler holds its lock that long
    downstream.delay_next("payments.get", seconds=4, key=key)

    # When a first reconciler is inside its pass (it made its look-up call) and a second one starts
    first = await start_reconcile(settings)
    await eventually(lambda: called(downstream, "payments.get", 1))
    second = await finish(await start_reconcile(settings))
    first_still_running = first.returncode is None
    first_run = await finish(first)

    # Then the second gave up at once with exit 0 and the lock message, while the first was still working
    assert (second.code, second.stdout.splitlines()) == (0, [LOCK_MESSAGE]), second.stderr
    assert first_still_running
    # And the first finished with exit 0 and its summary, having resolved the effect
    assert first_run.code == 0, first_run.stderr
    [summary] = first_run.stdout.splitlines()
    assert summary.startswith("reconcile: 0 expired leases taken back; uncertain effects: 1 sent, ")
    assert (await effect(engine, key))["provider_ref"] == downstream.payments()[key]["payment_id"]
    assert await state_is(engine, key, "sent")
    assert downstream.calls("payments.get", key) == 1
    assert downstream.calls("payments.post", key) == 1
    assert await rows(engine, "SELECT outcome, summary->>'resolved_sent' AS sent FROM reconcile_runs") == [
        {"outcome": "complete", "sent": "1"}
    ]


async def test_f_the_purge_removes_only_expired_rows_and_a_fresh_message_is_still_a_duplicate(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # f. The purge removes only expired inbox rows (dedup window 1d); a duplicate of a fresh message is
    # still recognised as a duplicate (one order, one effect).

    # Given a dedup window of one day, a message processed now, and older inbox and outbox rows
    settings = effect_settings(database_url, kafka, topics, downstream, dedup_window="1d")
    record = ("F-1", placed("F-1"), {"message-id": "F-1.1/order.placed"})
    await produce(kafka, topics.source, [record], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 0, 1))
    for message_id, hours_ago in (("old-1", 48), ("old-2", 25), ("recent", 23)):
        await _insert_inbox_row(engine, settings, message_id, hours_ago)
    for name, published_hours_ago in (("published-old", 48), ("published-recent", 23), ("unpublished", None)):
        await _insert_outbox_row(engine, name, created_hours_ago=48, published_hours_ago=published_hours_ago)

    # When reconcile runs
    run = await reconcile(settings)

    # Then only the inbox rows and the published outbox row older than the window are gone
    assert "purged 2 inbox and 1 outbox rows" in run.stdout
    assert await rows(engine, "SELECT message_id FROM inbox ORDER BY message_id") == [
        {"message_id": "F-1.1/order.placed"},
        {"message_id": "recent"},
    ]
    kept = await rows(engine, "SELECT key FROM outbox WHERE topic = 'purge-test' ORDER BY key")
    assert kept == [{"key": "published-recent"}, {"key": "unpublished"}]
    outbox_before = await scalar(engine, "SELECT count(*) FROM outbox")

    # When the fresh message is delivered again
    await produce(kafka, topics.source, [record], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: _committed(kafka, settings.consumer_name, topics.source, 0, 2))

    # Then it is still recognised as a duplicate: one order, one effect, no new event
    assert await scalar(engine, "SELECT count(*) FROM orders") == 1
    assert await scalar(engine, "SELECT count(*) FROM effects") == 1
    assert await scalar(engine, "SELECT count(*) FROM inbox WHERE message_id = 'F-1.1/order.placed'") == 1
    assert await scalar(engine, "SELECT count(*) FROM outbox") == outbox_before
    assert await scalar(engine, "SELECT summary->>'inbox_purged' FROM reconcile_runs") == "2"


async def _insert_inbox_row(engine: AsyncEngine, settings: Settings, message_id: str, hours_ago: int) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                                   received_at, processed_at)
                VALUES (:consumer, :message_id, 'processed', :topic, 0, 1000,
                        now() - make_interval(hours => :hours), now() - make_interval(hours => :hours))
                """
            ),
            {
                "consumer": settings.consumer_name,
                "message_id": message_id,
                "topic": settings.source_topic,
                "hours": hours_ago,
            },
        )


async def _insert_outbox_row(
    engine: AsyncEngine, key: str, *, created_hours_ago: int, published_hours_ago: int | None
) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO outbox (topic, key, payload, created_at, published_at)
                VALUES ('purge-test', :key, :payload, now() - make_interval(hours => :created),
                        now() - make_interval(hours => CAST(:published AS integer)))
                """
            ),
            {"key": key, "payload": b"{}", "created": created_hours_ago, "published": published_hours_ago},
        )


async def test_a_refund_is_called_only_after_its_capture_succeeded(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Also: a refund waits for its capture: placed + cancelled while the capture fails with 503 a few times;
    # the refund's payments.post happens only after the capture's succeeded.

    # Given an order placed and cancelled, whose capture the provider refuses twice with 503
    capture, refund = "R-1/payment.capture", "R-1/payment.refund"
    downstream.fail_next("payments.post", times=2, status=503, key=capture)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("R-1", placed("R-1"), {}), ("R-1", cancelled("R-1"), {})], partition=0)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When the capture is still being retried, the refund has not been tried at all
        await eventually(lambda: called(downstream, "payments.post", 2, capture))
        assert await rows(engine, "SELECT state, attempts FROM effects WHERE idempotency_key = :k", k=refund) == [
            {"state": "pending", "attempts": 0}
        ]
        assert downstream.calls("payments.post", refund) == 0
        # And once the capture succeeds, the refund follows
        await eventually(lambda: state_is(engine, refund, "sent"))

    # Then the refund was made once, after the capture: the provider numbered the capture first
    payments = downstream.payments()
    assert (payments[capture]["kind"], payments[refund]["kind"]) == ("capture", "refund")
    assert _sequence(payments[capture]["payment_id"]) < _sequence(payments[refund]["payment_id"])
    assert downstream.calls("payments.post", capture) == 3
    assert downstream.calls("payments.post", refund) == 1
    assert await rows(engine, "SELECT idempotency_key, state, attempts FROM effects ORDER BY idempotency_key") == [
        {"idempotency_key": capture, "state": "sent", "attempts": 3},
        {"idempotency_key": refund, "state": "sent", "attempts": 1},
    ]
    assert await payment_status(engine, "R-1") == "refunded"


def _sequence(payment_id: str) -> int:
    """The provider's running number of a payment id (`pay_7` → 7): the order it recorded payments in."""
    return int(payment_id.removeprefix("pay_"))


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"ORDERS_DEDUP_WINDOW": "19s"}, "between 20s and 7d"),
        ({"ORDERS_DEDUP_WINDOW": "8d"}, "between 20s and 7d"),
        ({"ORDERS_DEDUP_WINDOW": "20s"}, "shorter than the retry horizon"),
    ],
    ids=["below-20s", "above-7d", "shorter-than-the-default-tiers"],
)
def test_g_a_dedup_window_out_of_bounds_or_shorter_than_the_retry_horizon_stops_with_exit_2(
    environment: dict[str, str], expected: str
) -> None:
    # g. ORDERS_DEDUP_WINDOW=19s and 8d → exit 2, one stderr line naming the variable and "between 20s and 7d";
    # 20s with the default tiers → exit 2, one line "shorter than the retry horizon".

    # Given a database nobody listens on: configuration is checked before anything connects
    env = {"ORDERS_DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:9/nowhere", **environment}

    # When an operator runs a command with that window
    result = order_service("quarantine", "stats", "--json", env=env)

    # Then it stops with exit code 2 and one line naming the variable and the problem
    assert (result.returncode, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    assert "ORDERS_DEDUP_WINDOW" in line
    assert expected in line
    assert "Traceback" not in result.stderr


def test_g_a_20s_dedup_window_is_accepted_without_retry_tiers(database_url: str) -> None:
    # g. 20s with ORDERS_RETRY_TIERS= (empty) → accepted.

    # Given the shortest window, and no retry tiers (the retry horizon is the 5 s blocking budget)
    env = {"ORDERS_DATABASE_URL": database_url, "ORDERS_DEDUP_WINDOW": "20s", "ORDERS_RETRY_TIERS": ""}

    # When an operator runs a command
    result = order_service("quarantine", "stats", "--json", env=env)

    # Then the configuration is accepted and the command answers
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["open"] == 0


async def test_no_ref_gets_a_second_email_when_claims_queue_behind_the_worker_and_reconcilers_run(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given 33 shipment emails, more than one worker calls at once, and an email provider that applies the
    # first 32 sends but answers only after the HTTP timeout (so they become uncertain)
    settings = effect_settings(
        database_url, kafka, topics, downstream, payments_url="", http_timeout="1s", effect_lease="2500ms"
    )
    records = []
    for n in range(33):
        records += [(f"L-{n}", placed(f"L-{n}"), {}), (f"L-{n}", shipped(f"L-{n}"), {})]
    await produce(kafka, topics.source, records, partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 33 FROM effects WHERE kind = 'email.shipped'"))
    downstream.delay_next("emails.post", times=32, seconds=3)

    # When two workers run and a reconciler passes again and again until every email is resolved
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        reconciler = await container.reconciler()

        async def all_sent() -> bool:
            await reconciler.run_once(10)
            return bool(
                await scalar(engine, "SELECT bool_and(state = 'sent') FROM effects WHERE kind = 'email.shipped'")
            )

        async with running(settings, "effect_worker"), running(settings, "effect_worker"):
            await eventually(all_sent, timeout=60, interval=0.3)
    finally:
        await container.shutdown_resources()

    # Then every ref has exactly one email: no call outlived its lease, no look-up raced a live call
    refs = [email["ref"] for email in downstream.emails()]
    assert sorted(refs) == sorted(f"L-{n}/email.shipped" for n in range(33))


async def test_a_refund_whose_capture_failed_on_our_side_looks_the_capture_up_and_refunds_what_was_taken(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a capture the provider made (an earlier call, a lost answer), while our own call of it was refused
    # with a 4xx that is not 402: the capture effect failed PROVIDER_REJECTED
    body = {"order_id": "RF-1", "amount_cents": 2500, "currency": "EUR", "kind": "capture"}
    async with httpx.AsyncClient() as client:
        made = await client.post(
            f"{downstream.url}/payments", json=body, headers={"Idempotency-Key": "RF-1/payment.capture"}
        )
    assert made.status_code in (200, 201)
    downstream.fail_next("payments.post", times=1, status=410, key="RF-1/payment.capture")
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("RF-1", placed("RF-1"), {})], partition=0)
    async with running(settings, "consumer_loop", "effect_worker"):
        await eventually(
            lambda: scalar(engine, "SELECT last_error_code FROM effects WHERE kind = 'payment.capture'"), timeout=30
        )
        assert await scalar(engine, "SELECT state FROM effects WHERE kind = 'payment.capture'") == "failed"

        # When the order is cancelled
        await produce(kafka, topics.source, [("RF-1", cancelled("RF-1"), {})], partition=0)

        # Then the refund asks the provider about the capture first, finds it, and refunds it
        await eventually(
            lambda: scalar(engine, "SELECT state = 'sent' FROM effects WHERE kind = 'payment.refund'"), timeout=30
        )
    assert downstream.calls("payments.get", key="RF-1/payment.capture") >= 1
    assert downstream.payments()["RF-1/payment.refund"]["kind"] == "refund"


async def place_and_ship(kafka: str, topics: Topics, ids: list[str]) -> None:
    """Orders placed, then shipped: a capture and an email each."""
    records = [(order, placed(order), {}) for order in ids] + [(order, shipped(order), {}) for order in ids]
    await produce(kafka, topics.source, records, partition=0)


async def test_a_slow_provider_holds_back_only_its_own_effects(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a payment provider that takes 2 s a call, two calls at a time (ORDERS_EFFECT_CONCURRENCY=2), and a
    # fast email provider; eight orders placed and shipped (a capture and an email each)
    downstream.set_latency("payments.post", 2.0)
    settings = effect_settings(
        database_url, kafka, topics, downstream, effect_concurrency=2, http_timeout="5s", effect_lease="30s"
    )
    ids = [f"S-{n}" for n in range(8)]
    await place_and_ship(kafka, topics, ids)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When every email has been sent
        async def emails_sent() -> bool:
            sent = await scalar(engine, "SELECT count(*) FROM effects WHERE kind = 'email.shipped' AND state = 'sent'")
            return bool(sent == len(ids))

        await eventually(emails_sent)
        # Then the captures were still going, two at a time: the emails did not wait for them
        captured = await scalar(
            engine, "SELECT count(*) FROM effects WHERE kind = 'payment.capture' AND state = 'sent'"
        )
        assert captured <= len(ids) // 2
        # And the captures all end sent, each made once
        for order in ids:
            await eventually(lambda order=order: state_is(engine, f"{order}/payment.capture", "sent"))
    assert all(downstream.calls("payments.post", f"{order}/payment.capture") == 1 for order in ids)


async def test_a_rate_limiting_provider_holds_back_only_its_own_effects(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a payment provider that answers 429 (Retry-After: 60) to every capture, and a working email provider;
    # eight orders placed and shipped
    ids = [f"L-{n}" for n in range(8)]
    for order in ids:
        downstream.fail_next("payments.post", status=429, retry_after=60, key=f"{order}/payment.capture")
    settings = effect_settings(database_url, kafka, topics, downstream)
    await place_and_ship(kafka, topics, ids)

    async with running(settings, "consumer_loop", "effect_worker"):
        # When every capture has been refused once for its rate
        async def refused() -> bool:
            return all(downstream.calls("payments.post", f"{order}/payment.capture") == 1 for order in ids)

        await eventually(refused)
        # Then every email is sent all the same, and each capture waits, pending, for the minute it was asked to
        for order in ids:
            await eventually(lambda order=order: state_is(engine, f"{order}/email.shipped", "sent"))
        waiting = await rows(
            engine,
            "SELECT state, last_error_code, next_attempt_at > now() + interval '50 seconds' AS later"
            " FROM effects WHERE kind = 'payment.capture'",
        )
    assert waiting == [{"state": "pending", "last_error_code": "RATE_LIMITED", "later": True}] * len(ids)
    assert all(downstream.calls("emails.post", f"{order}/email.shipped") == 1 for order in ids)


async def test_outcomes_the_database_refuses_are_written_once_it_takes_them_again(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a placed order whose capture is pending, and a database that refuses the outcomes' write seven times
    # in a row (more than the redos a deadlock gets) before it takes it, well within the lease
    settings = effect_settings(database_url, kafka, topics, downstream, effect_lease="30s")
    await produce(kafka, topics.source, [("W-1", placed("W-1"), {})], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: state_is(engine, "W-1/payment.capture", "pending"))
    refusals = 7

    async def refusing(*args: Any, **kwargs: Any) -> set[str]:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise InfrastructureUnavailable("the database is restarting")
        return await record_outcomes(*args, **kwargs)

    monkeypatch.setattr(effects_worker, "record_outcomes", refusing)

    # When the worker makes the capture and writes its outcome
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        worker = await container.effect_worker()
        attempted = await worker.work_once("payment.capture")
    finally:
        await container.shutdown_resources()

    # Then the outcome is written once the database takes it: sent, the call made once, the event in the outbox
    assert (attempted, refusals) == (1, 0)
    assert (await effect(engine, "W-1/payment.capture"))["state"] == "sent"
    assert downstream.calls("payments.post", "W-1/payment.capture") == 1
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE headers->>'event-type' = 'payment.captured'") == 1


async def test_a_batchs_outcomes_read_effects_and_orders_by_key_on_a_ledger_never_analyzed(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a new database (no ANALYZE yet, as at a deployment's start or under a sudden load) holding 3,000 placed
    # orders whose captures are all in flight, 200 of them leased to this worker
    orders = [placed_order(f"K-{number}") for number in range(3_000)]
    captures = [capture_of(order) for order in orders]
    batch = [capture.idempotency_key for capture in captures[1_000:1_200]]
    async with UnitOfWork(engine) as uow:
        await never_analyzed(uow.connection)
        await uow.connection.execute(
            text(order_store.CREATE_ROWS), {"created_aggregates": order_store.COLUMNS.encode(orders)}
        )
        await uow.connection.execute(
            text(effect_store.ADD_ROWS),
            {"effect_rows": effect_store.COLUMNS.encode([effect_store.NewEffect.of(c, None) for c in captures])},
        )
        await uow.connection.execute(
            text(
                "UPDATE effects SET state = 'in_flight', attempts = 1,"
                " lease_owner = CASE WHEN idempotency_key = ANY(:batch) THEN 'me' ELSE 'other' END"
            ),
            {"batch": batch},
        )
        await uow.commit()
    settings = effect_settings(database_url, kafka, topics, downstream)
    leased = {
        capture.idempotency_key: EffectRow(
            capture.idempotency_key, capture.aggregate_id, capture.kind, capture.payload, 1, 0, None
        )
        for capture in captures[1_000:1_200]
    }
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        kinds = await container.effect_kinds()

        # When their outcomes are written, in one transaction
        async with UnitOfWork(engine) as uow:
            assert await unanalyzed_tables(uow.connection) == {"effects", "orders"}
            before = await table_reads(uow.connection)
            kept = await record_outcomes(
                uow.connection,
                settings.topics,
                kinds,
                [(leased[key], EffectDecision("sent", reference=f"pay-{key}")) for key in batch],
                from_state="in_flight",
                owner="me",
            )
            after = await table_reads(uow.connection)
            await uow.commit()
    finally:
        await container.shutdown_resources()

    # Then all 200 are written, and neither table was read whole nor walked by state: each row was found by its key,
    # at most three times (to lock it, to check it, to update it)
    assert kept == set(batch)
    scans = {table: (after[table][0] - before[table][0], after[table][1] - before[table][1]) for table in after}
    assert (scans["effects"][0], scans["orders"][0]) == (0, 0)
    assert scans["effects"][1] <= 3 * len(batch)
    assert scans["orders"][1] <= 3 * len(batch)
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'sent'") == len(batch)
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE headers->>'event-type' = 'payment.captured'") == 200


async def test_a_claim_of_a_kind_with_nothing_pending_reads_no_pending_effect_of_other_kinds(
    engine: AsyncEngine,
) -> None:
    # Given a new database with a backlog of 3,000 pending captures and no pending refund
    captures = [capture_of(placed_order(f"B-{number}")) for number in range(3_000)]
    async with UnitOfWork(engine) as uow:
        await never_analyzed(uow.connection)
        await uow.connection.execute(
            text(effect_store.ADD_ROWS),
            {"effect_rows": effect_store.COLUMNS.encode([effect_store.NewEffect.of(c, None) for c in captures])},
        )
        await uow.commit()

    # When a refund lane claims, and then a capture lane
    async with UnitOfWork(engine) as uow:
        assert "effects" in await unanalyzed_tables(uow.connection)
        before = await table_reads(uow.connection)
        refunds = await effect_store.claim(uow.connection, "me", timedelta(seconds=30), 500, "payment.refund")
        after_refunds = await table_reads(uow.connection)
        taken = await effect_store.claim(uow.connection, "me", timedelta(seconds=30), 100, "payment.capture")
        after_captures = await table_reads(uow.connection)
        await uow.commit()

    # Then the refund lane finds nothing without reading one capture (its kind is in the index it walks), and the
    # capture lane takes 100 in due order, reading a few rows for each it takes, not the whole backlog
    assert refunds == []
    assert after_refunds["effects"] == before["effects"]
    assert len({effect.idempotency_key for effect in taken}) == 100
    assert after_captures["effects"][0] == before["effects"][0]
    assert after_captures["effects"][1] - after_refunds["effects"][1] <= 8 * 100


async def never_analyzed(connection: AsyncConnection) -> None:
    """Keep autovacuum from analyzing `orders` and `effects` while the test runs (it could, a minute in)."""
    await connection.execute(text("ALTER TABLE orders SET (autovacuum_enabled = off)"))
    await connection.execute(text("ALTER TABLE effects SET (autovacuum_enabled = off)"))


async def unanalyzed_tables(connection: AsyncConnection) -> set[str]:
    """Which of `orders` and `effects` have never been analyzed (the planner knows nothing of their rows)."""
    found = await connection.execute(
        text("SELECT relname FROM pg_class WHERE relname IN ('orders', 'effects') AND reltuples < 0")
    )
    return set(found.scalars())


async def table_reads(connection: AsyncConnection) -> dict[str, tuple[int, int]]:
    """Sequential scans of `orders` and `effects`, and rows fetched through their indexes, this backend has not
    reported yet (this transaction's, and those of earlier transactions on the same connection)."""
    reads = await connection.execute(
        text(
            "SELECT relname, seq_scan, coalesce(idx_tup_fetch, 0) AS fetched FROM pg_stat_xact_user_tables"
            " WHERE relname IN ('orders', 'effects')"
        )
    )
    return {row.relname: (row.seq_scan, row.fetched) for row in reads}


def placed_order(order_id: str) -> Order:
    """An order as the consumer creates it from its `order.placed` record."""
    return Order(order_id, "acme", "C-1", OrderStatus.PLACED, 1_000, "EUR", 1)


async def test_the_outcome_of_a_claim_whose_lease_ran_out_does_not_land_on_the_same_workers_next_claim(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a capture claimed by one of a worker's lanes, whose lease ran out before its outcome came; the reconciler
    # took it back and sent it to pending, and another lane of the same worker (the same owner) claimed it again
    key = "S-1/payment.capture"
    settings = effect_settings(database_url, kafka, topics, downstream, payments_url="")
    await produce(kafka, topics.source, [("S-1", placed("S-1"), {})], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: state_is(engine, key, "pending"))
    async with UnitOfWork(engine) as uow:
        [first] = await effect_store.claim(uow.connection, "worker-1", timedelta(seconds=30), 10, "payment.capture")
        await uow.commit()
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(
            text(
                "UPDATE effects SET state = 'pending', lease_owner = NULL, lease_until = NULL"
                " WHERE idempotency_key = :k"
            ),
            {"k": key},
        )
        [second] = await effect_store.claim(uow.connection, "worker-1", timedelta(seconds=30), 10, "payment.capture")
        await uow.commit()
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        kinds = await container.effect_kinds()

        # When the first claim's outcome comes at last, then the second's
        outcomes = []
        for claimed, reference in ((first, "pay-late"), (second, "pay-live")):
            async with UnitOfWork(engine) as uow:
                decision = EffectDecision("sent", reference=reference)
                outcomes.append(
                    await record_outcomes(
                        uow.connection,
                        settings.topics,
                        kinds,
                        [(claimed, decision)],
                        from_state="in_flight",
                        owner="worker-1",
                    )
                )
                await uow.commit()
    finally:
        await container.shutdown_resources()

    # Then the late one is left out: the live claim's outcome is the one written
    assert (first.attempts, second.attempts) == (1, 2)
    assert outcomes == [set(), {key}]
    row = await effect(engine, key)
    assert (row["state"], row["provider_ref"]) == ("sent", "pay-live")


async def _dripping_provider(interval: float) -> tuple[asyncio.AbstractServer, str]:
    """An HTTP server whose every answer promises 100 KB and sends one byte every `interval` seconds."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(interval)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_look_up_whose_answer_drips_ends_with_the_pass_and_leaves_the_effect_uncertain(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given an uncertain capture, and a payments provider whose look-up answer drips a byte every 0.3 s (the HTTP
    # client's timeout, 1 s, restarts with every byte)
    key = "D-1/payment.capture"
    settings = effect_settings(database_url, kafka, topics, downstream, payments_url="")
    await produce(kafka, topics.source, [("D-1", placed("D-1"), {})], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: state_is(engine, key, "pending"))
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(
            text("UPDATE effects SET state = 'uncertain' WHERE idempotency_key = :k"), {"k": key}
        )
        await uow.commit()
    server, url = await _dripping_provider(0.3)
    container = Container(
        settings=effect_settings(database_url, kafka, topics, downstream, payments_url=url), domain=DOMAIN
    )
    await container.init_resources()
    try:
        reconciler = await container.reconciler()

        # When a reconcile pass with a budget of 2 s runs
        summary = await asyncio.wait_for(reconciler.run_once(2), timeout=10)
    finally:
        await container.shutdown_resources()
        server.close()

    # Then it ended within its budget and left the effect uncertain for the next pass (and released the lock)
    assert summary is not None
    assert summary.still_uncertain == 1
    assert summary.seconds < 5
    assert (await effect(engine, key))["state"] == "uncertain"


async def test_a_provider_whose_look_ups_fail_does_not_hold_back_the_other_providers_uncertain_effects(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given five uncertain captures: the payments provider answers 503 to the look-ups of the three oldest and knows
    # nothing of the two newer ones; and a newer uncertain email, whose provider knows nothing of it either
    orders = [f"H-{number}" for number in range(5)]
    settings = effect_settings(database_url, kafka, topics, downstream, payments_url="", emails_url="")
    records = [(order, placed(order), {}) for order in orders] + [
        ("H-E", placed("H-E"), {}),
        ("H-E", shipped("H-E"), {}),
    ]
    await produce(kafka, topics.source, records, partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 7 FROM effects"))
    async with UnitOfWork(engine) as uow:
        for order, age in (("H-0", 3), ("H-1", 3), ("H-2", 3), ("H-3", 2), ("H-4", 2), ("H-E", 1)):
            await uow.connection.execute(
                text(
                    "UPDATE effects SET state = 'uncertain', updated_at = now() - make_interval(hours => :age)"
                    " WHERE aggregate_id = :order AND kind IN ('payment.capture', 'email.shipped')"
                    " AND (aggregate_id <> 'H-E' OR kind = 'email.shipped')"
                ),
                {"order": order, "age": age},
            )
        await uow.commit()
    for order in orders[:3]:
        downstream.fail_next("payments.get", status=503, key=f"{order}/payment.capture")
    container = Container(settings=effect_settings(database_url, kafka, topics, downstream), domain=DOMAIN)
    await container.init_resources()
    try:
        reconciler = await container.reconciler()

        # When one reconcile pass runs
        summary = await reconciler.run_once(30)
    finally:
        await container.shutdown_resources()

    # Then after the three failures in a row the email was looked up, and then the newer captures: those the
    # providers answered for went back to pending, and only the three the provider failed on are still uncertain
    assert summary is not None
    assert (summary.sent_back_to_pending, summary.still_uncertain) == (3, 3)
    assert (downstream.calls("payments.get"), downstream.calls("emails.get")) == (5, 1)
    # And the pass's summary line names the kind whose look-ups failed
    assert summary.failing_kinds == ["payment.capture"]
    assert summary.line().endswith("; look-ups failing for payment.capture")
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'uncertain'") == 3


async def test_a_provider_whose_look_ups_time_out_does_not_spend_the_pass_the_other_providers_need(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given six old uncertain captures whose look-ups time out (the provider holds each 3 s, the timeout is 1 s),
    # and a newer uncertain email, whose provider answers at once
    orders = [f"T-{number}" for number in range(6)]
    settings = effect_settings(database_url, kafka, topics, downstream, payments_url="", emails_url="")
    records = [(order, placed(order), {}) for order in orders] + [
        ("T-E", placed("T-E"), {}),
        ("T-E", shipped("T-E"), {}),
    ]
    await produce(kafka, topics.source, records, partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 8 FROM effects"))
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(
            text(
                "UPDATE effects SET state = 'uncertain', updated_at = now() - interval '1 hour'"
                " WHERE kind = 'payment.capture' AND aggregate_id <> 'T-E'"
            )
        )
        await uow.connection.execute(text("UPDATE effects SET state = 'uncertain' WHERE kind = 'email.shipped'"))
        await uow.commit()
    for order in orders:
        downstream.delay_next("payments.get", seconds=3, key=f"{order}/payment.capture")
    container = Container(settings=effect_settings(database_url, kafka, topics, downstream), domain=DOMAIN)
    await container.init_resources()
    try:
        reconciler = await container.reconciler()

        # When one reconcile pass runs with a budget of 5 s (five look-ups that time out)
        summary = await reconciler.run_once(5)
    finally:
        await container.shutdown_resources()

    # Then the email was looked up after the third capture's look-up failed, within the budget
    assert summary is not None
    assert downstream.calls("emails.get") == 1
    assert summary.sent_back_to_pending == 1
