"""Nothing healthy is lost to an outage or a misconfiguration of a downstream: its circuit breaker holds the records
and effects that need it without spending their attempts (README, Backpressure). Real PostgreSQL and Kafka, the
fault-injection server; each test's outage is the fault server's, of a set length.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from dependency_injector import providers
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.breakers import Breakers
from service.adapters.http import HttpClient
from service.config import Settings
from service.errors import DownstreamError
from service.orders.customers import CustomersClient
from service.orders.fakes import Downstream
from service.orders.model import CustomerStatus
from service.policy.breaker import BreakerPolicy, State
from service.policy.effects import EffectPolicy
from tests.support import Topics, eventually, produce, read_topic, rows, running, scalar
from tests.support import settings_for as base_settings
from tests.support.orders import placed, shipped

pytestmark = pytest.mark.slow

ORDERS = 300


def settings_for(database_url: str, kafka: str, topics: Topics, **overrides: Any) -> Settings:
    """Tight budgets (the issue's): 3 attempts, 1 of them blocking, a 1 s tier, 20 s in all, 1 s per call."""
    values: dict[str, Any] = {
        "max_attempts": 3,
        "blocking_attempts": 1,
        "retry_tiers": "1s",
        "max_elapsed": "20s",
        "http_timeout": "1s",
        "batch_size": 50,
    }
    return base_settings(database_url, kafka, topics, **(values | overrides))


async def outcomes(engine: AsyncEngine) -> dict[str, int]:
    """Inbox rows by status."""
    found = await rows(engine, "SELECT status, count(*) AS n FROM inbox GROUP BY status")
    return {row["status"]: row["n"] for row in found}


async def all_terminal(engine: AsyncEngine, expected: int) -> bool:
    return bool(await scalar(engine, "SELECT count(*) >= :n FROM inbox", n=expected))


@pytest.mark.parametrize(
    ("status", "hang_every"),
    [(503, 7), (429, 0)],
    ids=["503s and timeouts", "a 429 storm"],
)
async def test_a_ten_second_outage_of_the_directory_quarantines_none_of_hundreds_of_healthy_orders(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    status: int,
    hang_every: int,
) -> None:
    # Given a customer directory down for 10 s (503s with every 7th call hanging past the 1 s timeout, or 429s
    # asking to come back in a second), and several hundred healthy orders arriving as it goes down
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    downstream.outage("customers.get", 10.0, status, hang_every=hang_every, hang=1.5)
    await produce(kafka, topics.source, [(f"H-{n}", placed(f"H-{n}", customer=f"c-{n}"), {}) for n in range(ORDERS)])

    # When the service works through them
    async with running(settings, "consumer_loop", "relay") as container:
        breakers: Breakers = container.breakers()
        await eventually(lambda: all_terminal(engine, ORDERS), timeout=90)
        opened = breakers["customers"].breaker

    # Then every one was applied once the directory came back: none quarantined, none rejected
    assert await outcomes(engine) == {"processed": ORDERS}
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
    assert await scalar(engine, "SELECT count(*) FROM orders") == ORDERS
    assert downstream.outage_left("customers.get") == 0
    assert opened.state is State.CLOSED  # it opened, and closed on a successful probe
    # And the outage was answered by the breaker, not by spending attempts: far fewer calls than records x attempts
    assert downstream.calls("customers.get") < ORDERS * 2


async def test_a_ten_second_outage_quarantines_none_of_one_customers_hundred_orders(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a hundred healthy orders of one customer (one look-up a round for all of them: one request failing, which
    # opens no breaker) arriving as the directory goes down for 10 s (503s, every 7th call hanging past the timeout)
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    downstream.outage("customers.get", 10.0, 503, hang_every=7, hang=1.5)
    await produce(kafka, topics.source, [(f"O-{n}", placed(f"O-{n}", customer="c-1"), {}) for n in range(100)])

    # When the service works through them
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: all_terminal(engine, 100), timeout=90)

    # Then each failed look-up was charged to one of them, not to all: every order was applied once it came back
    assert await outcomes(engine) == {"processed": 100}
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
    assert downstream.outage_left("customers.get") == 0


async def test_an_outage_longer_than_the_elapsed_budget_quarantines_each_waiting_record_once_naming_the_breaker(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a directory down for longer than the records' elapsed budget (4 s), and no tiers
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, max_elapsed="4s", retry_tiers="")
    downstream.outage("customers.get", 30.0)
    await produce(kafka, topics.source, [(f"W-{n}", placed(f"W-{n}", customer=f"c-{n}"), {}) for n in range(20)])

    # When the service waits for it
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: all_terminal(engine, 20), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"))
        calls = downstream.calls("customers.get")

    # Then each record was quarantined once, its budget spent on the breaker, which its envelope names
    quarantined = await rows(engine, "SELECT error_code, attempts, envelope FROM quarantine")
    assert len(quarantined) == 20
    assert {row["error_code"] for row in quarantined} == {"DOWNSTREAM_UNAVAILABLE_EXHAUSTED"}
    assert {row["envelope"]["breaker"] for row in quarantined} == {"customers"}
    assert all(row["attempts"] < settings.max_attempts for row in quarantined if settings.max_attempts)
    envelopes = await read_topic(kafka, topics.quarantine, expect=20, timeout=10)
    assert sorted(json.loads(record.value)["failureId"] for record in envelopes) == sorted(
        row["envelope"]["failureId"] for row in quarantined
    )
    # And while it was open the directory saw a handful of probes, not a call per record and retry
    assert calls < 40


@pytest.mark.parametrize(
    "answer",
    [
        {"status": 404, "body": b"<html><body>Not Found</body></html>"},
        {"status": 308, "headers": [("Location", "https://directory.example/customers/c-1")]},
        {"status": 204, "content_type": None},
        {"status": 401, "body": b"<html>Sign in</html>"},
        {"status": 200, "body": b"[]", "content_type": "application/json"},
    ],
    ids=["html-404", "redirect", "204", "401", "not-a-customer"],
)
async def test_an_answer_that_is_not_the_directorys_own_rejects_and_quarantines_nothing(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, answer: dict[str, Any]
) -> None:
    # Given a directory that answers what its API never answers (a proxy's page, a redirect, a login), twice
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    downstream.answer_next("customers.get", times=2, **answer)
    await produce(kafka, topics.source, [(f"M-{n}", placed(f"M-{n}", customer=f"c-{n}"), {}) for n in range(10)])

    # When the service runs
    async with running(settings, "consumer_loop", "relay") as container:
        guard = container.breakers()["customers"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.misconfigured or guard.breaker.openings > 0))
        await eventually(lambda: all_terminal(engine, 10), timeout=60)

    # Then its breaker opened as for a misconfiguration, and nothing was rejected or quarantined: every order was
    # applied once the directory answered as itself
    assert await outcomes(engine) == {"processed": 10}
    assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0
    assert len(await read_topic(kafka, topics.rejected, expect=0, timeout=2)) == 0


async def test_a_wrong_directory_path_waits_for_the_fix_and_then_everything_flows(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given the directory's URL with a typo in its path: the server answers its own HTML 404 page
    wrong = settings_for(database_url, kafka, topics, customers_url=f"{downstream.url}/v1typo")
    await produce(kafka, topics.source, [(f"U-{n}", placed(f"U-{n}", customer=f"c-{n}"), {}) for n in range(10)])

    # When the service runs with it for a while
    async with running(wrong, "consumer_loop", "relay") as container:
        guard = container.breakers()["customers"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.misconfigured))
        waited = time.monotonic()
        await eventually(lambda: asyncio.sleep(0, time.monotonic() - waited > 1.0))  # a probe or two fail meanwhile
        # Then nothing was decided about any record: no rejection, no quarantine, no inbox row
        assert await scalar(engine, "SELECT count(*) FROM inbox") == 0

    # And once the URL is fixed, every order is applied
    fixed = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    async with running(fixed, "consumer_loop", "relay"):
        await eventually(lambda: all_terminal(engine, 10), timeout=60)
    assert await outcomes(engine) == {"processed": 10}
    assert len(await read_topic(kafka, topics.rejected, expect=0, timeout=2)) == 0


async def test_a_lone_order_answered_by_a_wrong_url_waits_with_the_breaker_open_and_spends_no_attempt(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given one order, and the directory's URL with a typo in its path (the server's HTML 404 page): one request alone
    wrong = settings_for(database_url, kafka, topics, customers_url=f"{downstream.url}/v1typo")
    await produce(kafka, topics.source, [("L-1", placed("L-1", customer="c-1"), {})])

    # When the service runs with it for longer than its three attempts took before (about 2 s)
    async with running(wrong, "consumer_loop", "relay") as container:
        guard = container.breakers()["customers"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.misconfigured))
        waited = time.monotonic()
        await eventually(lambda: asyncio.sleep(0, time.monotonic() - waited > 4.0), timeout=10)
        registry = container.metrics().registry
        misconfigured = registry.get_sample_value("orders_downstream_misconfigured", {"downstream": "customers"})
        failures = registry.get_sample_value("orders_failures_total", {"error_code": "DOWNSTREAM_MISCONFIGURED"})
        # Then the breaker is open as misconfigured (the metric the alert reads says so), nothing was decided about
        # the order and no attempt was spent on it
        assert (guard.breaker.state, misconfigured, failures) == (State.OPEN, 1.0, None)
        assert await scalar(engine, "SELECT count(*) FROM inbox") == 0
        assert await scalar(engine, "SELECT count(*) FROM quarantine") == 0

    # And once the URL is fixed, it is applied
    fixed = settings_for(database_url, kafka, topics, customers_url=downstream.url)
    async with running(fixed, "consumer_loop", "relay"):
        await eventually(lambda: all_terminal(engine, 1), timeout=60)
    assert await outcomes(engine) == {"processed": 1}
    assert len(await read_topic(kafka, topics.rejected, expect=0, timeout=2)) == 0


async def test_a_customer_a_firewall_refuses_is_its_orders_trouble_and_cannot_make_the_breaker_flap(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a directory behind a firewall that answers one customer's look-ups with its own HTML 403 page, always,
    # and orders of that customer among orders of others
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, retry_tiers="", max_elapsed="8s")
    page = b"<html><body>Request blocked</body></html>"
    downstream.answer_next("customers.get", 403, page, times=1000, key="c-waf")
    orders = [(f"F-{n}", placed(f"F-{n}", customer="c-waf" if n % 10 == 0 else f"c-{n}"), {}) for n in range(60)]
    await produce(kafka, topics.source, orders)

    # When the service works through them
    async with running(settings, "consumer_loop", "relay") as container:
        await eventually(lambda: all_terminal(engine, 60), timeout=60)
        registry = container.metrics().registry
        openings = registry.get_sample_value(
            "orders_breaker_transitions_total", {"downstream": "customers", "state": "open"}
        )

    # Then every other order was applied, and the refused customer's six were quarantined as misconfigured, spent
    # on their own budgets (once another customer's answer cleared it, the breaker charged its answers to them)
    assert await outcomes(engine) == {"processed": 54, "quarantined": 6}
    quarantined = await rows(engine, "SELECT error_code, attempts FROM quarantine")
    assert {(row["error_code"], row["attempts"]) for row in quarantined} == {
        ("DOWNSTREAM_MISCONFIGURED_EXHAUSTED", settings.max_attempts)
    }
    # And the breaker opened for it once or twice, not once per retry of each of its orders
    assert openings is not None
    assert openings <= 3, openings


async def test_a_head_quarantined_from_its_blocking_phase_parks_the_later_record_of_its_key_in_the_same_round(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given key P303: its placement, whose customer lookups always fail, and its shipment right behind it on the
    # same partition, under key ordering with no tiers (the blocking phase is the whole budget: 2 attempts)
    downstream.fail_next("customers.get", times=100, status=503, key="c-dead")
    settings = settings_for(
        database_url, kafka, topics, customers_url=downstream.url, retry_tiers="", max_attempts=2, ordering="key"
    )
    records = [("P303", placed("P303", customer="c-dead"), {}), ("P303", shipped("P303"), {})]
    await produce(kafka, topics.source, records, partition=0)

    # When the service runs until the placement is quarantined
    async with running(settings, "consumer_loop", "relay"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine"), timeout=60)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM parked"), timeout=10)

    # Then the shipment was parked behind it, in the same transaction, and the key is held: nothing rejected
    assert await rows(engine, "SELECT message_id, status FROM inbox") == [
        {"message_id": f"{topics.source}/0/0", "status": "quarantined"}
    ]
    assert await rows(engine, "SELECT ordering_key, failure_id FROM key_blocks") == [
        {"ordering_key": "P303", "failure_id": f"{topics.source}/0/0"}
    ]
    [parked] = await rows(engine, "SELECT message_id, parked_at FROM parked")
    [quarantined] = await rows(engine, "SELECT created_at FROM quarantine")
    assert parked["message_id"] == f"{topics.source}/0/1"
    assert parked["parked_at"] == quarantined["created_at"]  # one transaction: one now()
    assert len(await read_topic(kafka, topics.rejected, expect=0, timeout=2)) == 0


async def test_a_payments_outage_exhausts_no_effect_and_every_capture_goes_out_after_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given 100 orders to capture with 3 attempts each, and a payment provider down for 8 s as they come
    settings = settings_for(database_url, kafka, topics, payments_url=downstream.url, effect_max_attempts=3)
    downstream.outage("payments.post", 8.0)
    await produce(kafka, topics.source, [(f"C-{n}", placed(f"C-{n}"), {}) for n in range(100)])

    # When the consumer and the effect worker run through it
    async with running(settings, "consumer_loop", "relay", "effect_worker"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 100 FROM effects WHERE state = 'sent'"), timeout=90)

    # Then no effect spent its budget on the outage, and none failed
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'failed'") == 0
    assert await scalar(engine, "SELECT max(attempts) FROM effects") <= 3
    assert len(downstream.payments()) == 100


@pytest.mark.parametrize(
    "answer",
    [
        {"status": 308, "headers": [("Location", "https://payments.example/payments")]},
        {"status": 401, "body": b"<html>Sign in</html>"},
        {"status": 204, "content_type": None},
        {"status": 404, "body": b"<html><body>Not Found</body></html>", "content_type": "text/html"},
    ],
    ids=["redirect", "401", "204", "html-404"],
)
async def test_a_payment_provider_answering_what_its_api_never_answers_fails_no_payment(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, answer: dict[str, Any]
) -> None:
    # Given a payment provider that answers its first captures with what its API never answers (http:// redirected
    # to https://, a login page, a 204), then as itself
    settings = settings_for(database_url, kafka, topics, payments_url=downstream.url, effect_max_attempts=3)
    downstream.answer_next("payments.post", times=3, **answer)
    await produce(kafka, topics.source, [(f"R-{n}", placed(f"R-{n}"), {}) for n in range(10)])

    # When the consumer, the effect worker and (for what may have been acted on) the reconciler run
    quick = providers.Singleton(EffectPolicy, max_attempts=3, alone_misconfigured_wait=timedelta(seconds=1))
    async with running(
        settings, "consumer_loop", "effect_worker", configure=lambda c: c.effect_policy.override(quick)
    ) as container:
        guard = container.breakers()["payments"]
        await eventually(lambda: asyncio.sleep(0, guard.breaker.misconfigured), timeout=30)

        async def settled() -> bool:
            await (await container.reconciler()).run_once(5.0)  # (an uncertain capture is looked up, as cron does)
            return bool(await scalar(engine, "SELECT count(*) = 10 FROM effects WHERE state = 'sent'"))

        await eventually(settled, timeout=90, interval=1.0)

    # Then no capture failed, none was declined, none spent an attempt on those answers, and each was made once
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'failed'") == 0
    assert await scalar(engine, "SELECT count(*) FROM orders WHERE details->>'payment_status' = 'failed'") == 0
    assert len(downstream.payments()) == 10


async def test_after_an_outage_a_customer_that_always_fails_cannot_keep_the_directory_closed_to_the_others(
    downstream: Downstream,
) -> None:
    # Given a directory whose breaker five customers' failures opened, and a customer whose look-up always fails
    rules = BreakerPolicy(first_open=0.2)
    breakers = Breakers(rules)
    http = HttpClient.open(timedelta(seconds=2), connections=4)
    try:
        customers = CustomersClient(http, downstream.url, breakers)
        guard = breakers[customers.downstream]
        for n in range(rules.threshold):
            downstream.fail_next("customers.get", status=503, key=f"c-{n}")
            with pytest.raises(DownstreamError):
                await customers.status(f"c-{n}")
        downstream.fail_next("customers.get", times=100, status=503, key="c-dead")
        assert guard.breaker.state is State.OPEN

        async def time_is_up() -> bool:
            return guard.wait() == 0

        await eventually(time_is_up, timeout=5)

        # When that customer's look-up is the probe once the directory is back, and fails
        with pytest.raises(DownstreamError):
            await customers.status("c-dead")
        assert guard.breaker.state is State.OPEN
        calls = downstream.calls("customers.get")

        # Then the next other customer is asked at once, not after twice the open time, and its answer closes it
        assert await customers.status("c-healthy") is CustomerStatus.ACTIVE
        assert guard.breaker.state is State.CLOSED
        assert downstream.calls("customers.get") == calls + 1
        # And the failing customer was refused meanwhile, then is its own record's trouble: it opens nothing
        with pytest.raises(DownstreamError) as failed:
            await customers.status("c-dead")
        assert failed.value.charged
        assert guard.breaker.state is State.CLOSED
    finally:
        await http.close()
