"""Several members of every long-running process at once, through crashes and outages: three `consume`, two `relay` and
two `effects` processes share one consumer name under ORDERS_ORDERING=key with short retry tiers, while members are
SIGKILLed and restarted, PostgreSQL restarts twice, the broker restarts once, and the customer directory and then the
payment provider are each away for 10 s, with budgets those outages would spend but for the downstreams' circuit
breakers (5 attempts and 60 s a record, 4 calls an effect). Afterwards every record is terminal (or parked behind a
key that a quarantined head holds), nothing healthy is quarantined, no retry or parked row is left over, each order's
events are published in version order, and each effect happened once.

Black-box: real processes (`python -m service …`), real PostgreSQL and Kafka, the project's HTTP fault server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from tests.support import (
    ROOT,
    ServiceProcess,
    Topics,
    cli,
    delete_topics,
    eventually,
    produce_raw,
    read_topic,
    rows,
    settings_for,
)

pytestmark = pytest.mark.slow

SOURCE_PARTITIONS = 6
# More than one partition per tier topic, so that tier copies are spread over the members too.
TIER_PARTITIONS = 3
EVENT_PARTITIONS = 3
CHUNKS = 6  # the stream is produced in this many parts, between the faults
OUTAGE_SECONDS = 10.0
CONVERGE_SECONDS = 180.0
LOG_TAIL_CHARS = 3000

PROCESSED = ("processed", None)
PARKED = ("parked", None)
EXHAUSTED = "_EXHAUSTED"  # a code that ends so: a record whose retry budget was spent


@dataclass(frozen=True)
class Scenario:
    """One kind of order life: the records of its key in order, what each must end as, and what must follow."""

    steps: tuple[str, ...]
    outcomes: tuple[tuple[str, str | None], ...]
    effects: tuple[str, ...]
    events: int  # events of the order on the events topic: its final version
    status: str | None  # the order's final status; None: no order
    customer: str = "healthy"  # healthy, flaky (may be made flaky), missing, dead


SCENARIOS: dict[str, Scenario] = {
    "ship": Scenario(
        ("placed", "shipped"), (PROCESSED, PROCESSED), ("payment.capture", "email.shipped"), 3, "shipped", "flaky"
    ),
    "cancel": Scenario(
        ("placed", "cancelled"), (PROCESSED, PROCESSED), ("payment.capture", "payment.refund"), 4, "cancelled", "flaky"
    ),
    "ship_then_cancel": Scenario(
        ("placed", "shipped", "cancelled"),
        (PROCESSED, PROCESSED, ("rejected", "INVALID_TRANSITION")),
        ("payment.capture", "email.shipped"),
        3,
        "shipped",
        "flaky",
    ),
    "cancel_then_ship": Scenario(
        ("placed", "cancelled", "shipped"),
        (PROCESSED, PROCESSED, ("rejected", "INVALID_TRANSITION")),
        ("payment.capture", "payment.refund"),
        4,
        "cancelled",
        "flaky",
    ),
    "placed_only": Scenario(("placed",), (PROCESSED,), ("payment.capture",), 2, "placed", "flaky"),
    # Invalid input is quarantined at once and never retried; it does not hold its key (README, Ordering).
    "invalid_in_the_middle": Scenario(
        ("placed", "invalid", "cancelled"),
        (PROCESSED, ("quarantined", "INVALID_FIELD"), PROCESSED),
        ("payment.capture", "payment.refund"),
        4,
        "cancelled",
    ),
    "malformed_first": Scenario(
        ("malformed", "placed", "shipped"),
        (("quarantined", "MALFORMED_PAYLOAD"), PROCESSED, PROCESSED),
        ("payment.capture", "email.shipped"),
        3,
        "shipped",
    ),
    "unknown_customer": Scenario(
        ("placed", "cancelled"),
        (("rejected", "UNKNOWN_CUSTOMER"), ("rejected", "ORDER_NOT_FOUND")),
        (),
        0,
        None,
        "missing",
    ),
    # A head whose look-up never succeeds spends its budget in the tiers and is quarantined; it then holds its
    # key, and the key's later records stay parked until an operator acts.
    "dead_head": Scenario(
        ("placed", "cancelled", "shipped"), (("quarantined", EXHAUSTED), PARKED, PARKED), (), 0, None, "dead"
    ),
}
MIX = {
    "ship": 250,
    "cancel": 220,
    "ship_then_cancel": 90,
    "cancel_then_ship": 90,
    "placed_only": 120,
    "invalid_in_the_middle": 8,
    "malformed_first": 6,
    "unknown_customer": 10,
    "dead_head": 3,
}
FLAKY_SHARE = 0.06  # of the orders whose customer may be flaky: their look-up fails 1 to 3 times first
DEAD_FAULTS = 400  # more failures than a dead head can ask for within its budget


@dataclass(frozen=True)
class Planned:
    """One record of the stream and the state it must end in."""

    message_id: str
    order_id: str
    chunk: int
    value: bytes
    status: str  # processed, rejected, quarantined, or parked (behind a key held by a quarantined head)
    code: str | None


@dataclass
class Order:
    """One order of the stream."""

    order_id: str
    scenario: Scenario
    customer_id: str
    records: list[Planned] = field(default_factory=list)


@dataclass
class Plan:
    """The whole stream, and the faults arranged for it."""

    orders: list[Order]
    flaky: dict[str, int]  # customer id -> how many look-ups fail first
    dead: list[str]  # customer ids whose look-up always fails
    failing_captures: list[str]  # capture idempotency keys answered 503 twice
    cut_payments: list[str]  # payment idempotency keys whose first call is cut after it was applied
    cut_emails: list[str]  # email refs whose first call is cut after the email was sent

    @property
    def records(self) -> list[Planned]:
        """Every record of the stream, each order's in its order."""
        return [record for order in self.orders for record in order.records]

    def chunk(self, number: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
        """The records of one part of the stream, in each key's order, as (key, value, headers)."""
        return [
            (record.order_id.encode(), record.value, [("message-id", record.message_id.encode())])
            for record in self.records
            if record.chunk == number
        ]

    def dead_heads(self) -> list[str]:
        """The message ids of the heads whose look-up never succeeds."""
        return [o.records[0].message_id for o in self.orders if o.scenario.customer == "dead"]

    def keys_held(self) -> set[str]:
        """Keys that a quarantined head must hold at the end."""
        return {o.order_id for o in self.orders if any(r.status == "parked" for r in o.records)}

    def effects(self) -> set[tuple[str, str]]:
        """The (order, kind) of every effect the stream must cause."""
        return {(o.order_id, kind) for o in self.orders for kind in o.scenario.effects}


def _document(kind: str, order_id: str, customer_id: str, n: int) -> bytes:
    """The bytes of one record (never printed: payloads stay out of logs and test output)."""
    if kind == "malformed":
        return b'{"schema": "order.placed.v1", "order_id": '
    if kind == "placed":
        item = {"sku": f"sku-{n % 7}", "quantity": 1 + n % 3, "unit_price_cents": 500 + n}
        document: dict[str, Any] = {
            "schema": "order.placed.v1",
            "order_id": order_id,
            "tenant": "acme",
            "customer_id": customer_id,
            "currency": "EUR",
            "items": [item],
        }
    elif kind == "shipped":
        document = {"schema": "order.shipped.v1", "order_id": order_id, "carrier": "dhl", "tracking_number": f"T{n}"}
    elif kind == "invalid":  # a shipment without its tracking number: INVALID_FIELD
        document = {"schema": "order.shipped.v1", "order_id": order_id, "carrier": "dhl"}
    else:
        document = {"schema": "order.cancelled.v1", "order_id": order_id, "reason": "changed my mind"}
    return json.dumps(document).encode()


def plan_stream(seed: int) -> Plan:
    """A deterministic stream: each order's records spread over the parts, faults chosen per customer and key."""
    rng = random.Random(seed)
    names = [name for name, count in MIX.items() for _ in range(count)]
    rng.shuffle(names)
    plan = Plan([], {}, [], [], [], [])
    for n, name in enumerate(names):
        scenario = SCENARIOS[name]
        order_id = f"M-{n:04d}"
        if scenario.customer == "dead":
            customer = f"c-dead-{n}"
            plan.dead.append(customer)
        elif scenario.customer == "missing":
            customer = f"missing-{n}"
        elif scenario.customer == "flaky" and rng.random() < FLAKY_SHARE:
            customer = f"c-flaky-{n}"
            plan.flaky[customer] = rng.randint(1, 3)
        else:
            customer = f"c-{n}"
        order = Order(order_id, scenario, customer)
        # Dead heads start early, so that their budget runs out while the rest of the stream still flows.
        chunk = 0 if scenario.customer == "dead" else rng.randrange(CHUNKS)
        for step, (kind, (status, code)) in enumerate(zip(scenario.steps, scenario.outcomes, strict=True)):
            if step:
                chunk = min(CHUNKS - 1, chunk + rng.choice((0, 1, 1, 2)))
            message_id = f"{order_id}.{step + 1}/{kind}"
            order.records.append(
                Planned(message_id, order_id, chunk, _document(kind, order_id, customer, n), status, code)
            )
        plan.orders.append(order)
        for kind in scenario.effects:
            key = f"{order_id}/{kind}"
            draw = rng.random()
            if kind == "payment.capture" and draw < 0.05:
                plan.failing_captures.append(key)
            elif kind.startswith("payment.") and draw > 0.97:
                plan.cut_payments.append(key)
            elif kind == "email.shipped" and draw < 0.04:
                plan.cut_emails.append(key)
    return plan


def arrange_faults(plan: Plan, customers: Downstream, providers: Downstream) -> None:
    """Queue the plan's faults on the customer directory and on the payment and email providers."""
    for customer, times in plan.flaky.items():
        customers.fail_next("customers.get", times=times, status=503, key=customer)
    for customer in plan.dead:
        customers.fail_next("customers.get", times=DEAD_FAULTS, status=503, key=customer)
    for key in plan.failing_captures:
        providers.fail_next("payments.post", times=2, status=503, key=key)
    for key in plan.cut_payments:
        providers.cut_next("payments.post", times=1, after_apply=True, key=key)
    for ref in plan.cut_emails:
        providers.cut_next("emails.post", times=1, after_apply=True, key=ref)


class Members:
    """The long-running processes by name; a killed one is replaced, and kept to check that it died of the kill."""

    def __init__(self, settings: Settings, logs: Path) -> None:
        self._settings = settings
        self._logs = logs
        self.live: dict[str, ServiceProcess] = {}
        self.killed: list[tuple[str, ServiceProcess]] = []
        self._generation: Counter[str] = Counter()

    def start(self, name: str) -> None:
        """Start `name` (`consume-0`, `relay-1`, …) as a process of its role."""
        role = name.rsplit("-", 1)[0]
        generation = self._generation[name]
        self._generation[name] += 1
        self.live[name] = ServiceProcess(role, self._settings, self._logs / f"{name}.{generation}.log")

    def kill_and_restart(self, *names: str) -> None:
        """SIGKILL these members, then start a fresh process in each one's place."""
        for name in names:
            process = self.live.pop(name)
            process.kill()
            self.killed.append((name, process))
        for name in names:
            self.start(name)

    def exited_on_their_own(self) -> list[str]:
        """Members that are not running although nobody stopped them, with their exit codes."""
        gone = [
            f"{name} exited {p.process.returncode}" for name, p in self.live.items() if p.process.poll() is not None
        ]
        return gone + [
            f"{name} (killed) exited {p.process.returncode}" for name, p in self.killed if p.process.returncode != -9
        ]

    def stop(self) -> dict[str, int]:
        """SIGTERM every live member and return the exit codes (each must finish its work and exit 0)."""
        codes: dict[str, int] = {}
        for name, process in self.live.items():
            if process.process.poll() is None:
                codes[name] = process.terminate()
            else:
                codes[name] = process.wait(timeout=1)
        return codes

    def kill_all(self) -> None:
        """Leave nothing running, whatever happened."""
        for process in self.live.values():
            if process.process.poll() is None:
                process.kill()

    def said(self, event: str, message_id: str) -> list[str]:
        """The logs in which a member logged `event` for a record, with how often (ids only, no payloads)."""
        found = []
        for _, process in [*self.killed, *self.live.items()]:
            lines = [line for line in process.log().splitlines() if f'"{event}"' in line and message_id in line]
            if lines:
                found.append(f"{process.log_path.name} x{len(lines)}")
        return found

    def tails(self) -> str:
        """The end of every member's log (JSON lines without payloads), for a failure's report."""
        parts = []
        for _, process in [*self.killed, *self.live.items()]:
            parts.append(f"----- {process.log_path.name} -----\n{process.log()[-LOG_TAIL_CHARS:]}")
        return "\n".join(parts)


class Cron:
    """`order-service reconcile` every few seconds, as cron runs it; collects each pass's exit code and summary."""

    def __init__(self, settings: Settings, every: float = 3.0) -> None:
        self._settings = settings
        self._every = every
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.codes: Counter[int] = Counter()
        self.retry_orphans_removed = 0

    def start(self) -> None:
        """Run passes in the background until `stop`."""
        self._task = asyncio.create_task(self._run())

    async def run_once(self) -> int:
        """One pass now; its exit code."""
        finished = await cli(self._settings, "reconcile", "--max-seconds", "10", check=False)
        self.codes[finished.returncode] += 1
        found = re.search(r"(\d+) orphan retry rows removed", finished.stdout)
        if found:
            self.retry_orphans_removed += int(found.group(1))
        return finished.returncode

    async def stop(self) -> None:
        """Let the pass under way finish, and run no more."""
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.run_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._every)  # cron's schedule, not a synchronisation


async def create_topics(bootstrap: str, topics: Topics) -> None:
    """This test's topics: the source with several partitions, the tiers and the events with a few."""
    partitions = {topics.source: SOURCE_PARTITIONS, topics.events: EVENT_PARTITIONS}
    partitions |= {topics.retry(label): TIER_PARTITIONS for label in ("1s", "2s")}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions.get(name, 1), 1) for name in topics.all()])
    finally:
        await admin.close()


async def local_service(script: str, command: str) -> None:
    """`scripts/pg-local` or `scripts/kafka-local` stop/start, off the event loop (the cron keeps running)."""
    await asyncio.to_thread(
        subprocess.run, [str(ROOT / "scripts" / script), command], check=True, capture_output=True, timeout=180
    )


@contextlib.asynccontextmanager
async def stopped(script: str) -> AsyncIterator[None]:
    """PostgreSQL or the broker stopped for the block, and started again (on its port, with its data) after it,
    whatever happens in the block."""
    await local_service(script, "stop")
    try:
        yield
    finally:
        await local_service(script, "start")


def free_port() -> int:
    """A port nothing listens on now, for a server that must come back on the same one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Progress:
    """Where the run stands; true once everything that must settle has settled."""

    not_terminal: int
    not_parked: int  # records meant to stay parked that are not (yet)
    parked: int
    retries: int
    unpublished: int
    unsettled_effects: int
    expected_effects: int
    effects: int

    def __bool__(self) -> bool:
        # Extra parked rows are not waited for: they are reported by the checks that follow.
        return (
            self.not_terminal == 0
            and self.not_parked == 0
            and self.retries == 0
            and self.unpublished == 0
            and self.unsettled_effects == 0
            and self.effects == self.expected_effects
        )


async def progress(engine: AsyncEngine, plan: Plan) -> Progress:
    """Read the run's state from PostgreSQL."""
    terminal = {r["message_id"] for r in await rows(engine, "SELECT message_id FROM inbox")}
    parked = {r["message_id"] for r in await rows(engine, "SELECT message_id FROM parked")}
    wanted = [r.message_id for r in plan.records if r.status != "parked"]
    counts = (
        await rows(
            engine,
            """
            SELECT (SELECT count(*) FROM parked) AS parked,
                   (SELECT count(*) FROM retries) AS retries,
                   (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unpublished,
                   (SELECT count(*) FROM effects WHERE state <> 'sent') AS unsettled,
                   (SELECT count(*) FROM effects) AS effects
            """,
        )
    )[0]
    return Progress(
        not_terminal=sum(1 for message_id in wanted if message_id not in terminal),
        not_parked=sum(1 for r in plan.records if r.status == "parked" and r.message_id not in parked),
        parked=counts["parked"],
        retries=counts["retries"],
        unpublished=counts["unpublished"],
        unsettled_effects=counts["unsettled"],
        expected_effects=len(plan.effects()),
        effects=counts["effects"],
    )


async def in_tiers(engine: AsyncEngine, message_ids: list[str]) -> bool:
    """Whether every one of these records went to a retry tier: it waits there (a retry row) or is terminal."""
    there = await rows(
        engine,
        "SELECT message_id FROM retries WHERE message_id = ANY(:ids)"
        " UNION SELECT message_id FROM inbox WHERE message_id = ANY(:ids)",
        ids=message_ids,
    )
    return len(there) == len(message_ids)


async def terminal_count(engine: AsyncEngine) -> int:
    """How many records have an inbox row."""
    return len(await rows(engine, "SELECT message_id FROM inbox"))


def grew(engine: AsyncEngine, since: int) -> Callable[[], Awaitable[bool]]:
    """A check: more records are terminal than `since`."""

    async def check() -> bool:
        return await terminal_count(engine) > since

    return check


def examples(items: list[Any], limit: int = 8) -> str:
    """How many, and the first few (ids, codes and states only: never a payload)."""
    return f"{len(items)} (e.g. {items[:limit]})"


async def test_several_members_of_each_process_keep_every_guarantee_through_crashes_and_outages(
    engine: AsyncEngine, database_url: str, kafka: str, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a stream of orders with flaky, dead and unknown customers, invalid records, and provider faults
    began = time.monotonic()
    timeline: list[str] = []

    def note(what: str) -> None:
        timeline.append(f"{time.monotonic() - began:6.1f}s {what}")

    topics = Topics(f"t{uuid.uuid4().hex[:10]}")
    await create_topics(kafka, topics)
    plan = plan_stream(seed=13)
    customers = Downstream(port=free_port())
    customers.start()
    arrange_faults(plan, customers, downstream)
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=customers.url,
        payments_url=downstream.url,
        emails_url=downstream.url,
        ordering="key",
        # Short tiers, and tight budgets: a flaky look-up fails 3 times, and an outage charges a record at most once
        # (the few calls a member makes before its breaker opens), so 5 attempts hold; a 10 s outage that charged
        # every call would spend them. A dead head runs out of them, or of its 60 s, alone.
        retry_tiers="1s,2s",
        blocking_attempts=2,
        blocking_elapsed="2s",
        max_attempts=5,
        max_elapsed="60s",
        effect_lease="6s",
        # A capture fails twice by plan, a member killed mid-call spends one more (its call may have been made), and
        # the run that opens a member's breaker charges a call; backoff (1 s, 2 s, 4 s) would spend 4 more calls
        # within a 10 s outage.
        effect_max_attempts=5,
        batch_size=50,
    )
    # And three consumers, two relays and two effect workers on the same settings, with reconcile as cron
    members = Members(settings, tmp_path)
    for name in ("consume-0", "consume-1", "consume-2", "relay-0", "relay-1", "effects-0", "effects-1"):
        members.start(name)
    cron = Cron(settings)
    cron.start()
    problems: list[str] = []
    summary: dict[str, Any] = {}
    try:
        # When the stream arrives in parts while members crash and PostgreSQL, Kafka and the directory go away
        await produce_raw(kafka, topics.source, plan.chunk(0))
        note("part 0 produced")
        # The dead heads wait in a tier before the faults begin: their history then travels with their tier
        # copies, so their elapsed budget runs from now whatever member takes them later.
        # Dead heads alone failing the directory in one member can open its breaker: they then wait uncharged,
        # and reach their tier (or quarantine) as the probes fail, within their 60 s budget.
        await eventually(lambda: in_tiers(engine, plan.dead_heads()), timeout=90)
        note("dead heads in the retry tiers")

        members.kill_and_restart("consume-0")
        note("consume-0 killed and restarted")
        before = await terminal_count(engine)
        await produce_raw(kafka, topics.source, plan.chunk(1))
        note("part 1 produced")
        await eventually(grew(engine, before), timeout=60)

        async with stopped("pg-local"):
            note("PostgreSQL stopped")
            await produce_raw(kafka, topics.source, plan.chunk(2))
            note("part 2 produced")
        note("PostgreSQL started")
        await engine.dispose()  # this test's pooled connections died with the server
        members.kill_and_restart("relay-0", "effects-0")
        note("relay-0 and effects-0 killed and restarted")

        customers.stop()
        note("customer directory down")
        await produce_raw(kafka, topics.source, plan.chunk(3))
        note("part 3 produced")
        await asyncio.sleep(OUTAGE_SECONDS)  # the outage's length: the fault itself, not a synchronisation
        customers.start()
        note("customer directory back")
        # The records that waited for the directory now make their captures, into the payment provider's outage
        downstream.outage("payments.post", OUTAGE_SECONDS)
        note("payment provider down")

        async with stopped("kafka-local"):
            note("Kafka stopped")
        note("Kafka started")

        before = await terminal_count(engine)
        await produce_raw(kafka, topics.source, plan.chunk(4))
        note("part 4 produced")
        await eventually(grew(engine, before), timeout=60)
        async with stopped("pg-local"):
            note("PostgreSQL stopped")
        note("PostgreSQL started")
        await engine.dispose()

        members.kill_and_restart("consume-1", "relay-1", "effects-1")
        note("consume-1, relay-1 and effects-1 killed and restarted")
        await produce_raw(kafka, topics.source, plan.chunk(5))
        note("part 5 produced")

        # Then everything settles: every record terminal or parked, nothing left in flight
        try:
            await eventually(lambda: progress(engine, plan), timeout=CONVERGE_SECONDS, interval=1.0)
            note("settled")
        except AssertionError as error:
            note("did not settle")
            problems.append(f"the run did not settle: {error}")
        await cron.stop()
        note("cron stopped")
        if await cron.run_once() != 0:
            problems.append("the last reconcile pass failed")

        problems += [f"a member exited on its own: {gone}" for gone in members.exited_on_their_own()]
        problems += await check_database(engine, plan)
        doubled = await rows(engine, "SELECT message_id FROM parked GROUP BY message_id HAVING count(*) > 1")
        problems += [
            f"{d['message_id']} was parked by: {members.said('record_parked', d['message_id'])}" for d in doubled
        ]
        problems += await check_topics(kafka, topics, engine, plan, summary)
        problems += check_providers(plan, downstream)
        codes = members.stop()
        note("members stopped")
        problems += [f"{name} exited {code} on SIGTERM" for name, code in codes.items() if code != 0]
        summary |= {
            "seconds": round(time.monotonic() - began, 1),
            "records": len(plan.records),
            "orders": len(plan.orders),
            "flaky_customers": len(plan.flaky),
            "reconcile_passes": dict(cron.codes),
            "retry_orphans_removed_by_reconcile": cron.retry_orphans_removed,
            "timeline": timeline,
        }
        print(json.dumps(summary, indent=1))
        if problems:
            print(members.tails())
        assert not problems, "\n".join(problems)
    except BaseException:
        if not problems:
            print("\n".join(timeline))
            print(members.tails())
        raise
    finally:
        await cron.stop()
        members.kill_all()
        customers.stop()
        try:
            await delete_topics(kafka, topics)
        except KafkaError as error:  # (the broker restarted above: its failure to come back is the test's to tell)
            print(f"could not delete this test's topics: {type(error).__name__}")


async def check_database(engine: AsyncEngine, plan: Plan) -> list[str]:
    """Every record ended as planned; quarantine, retries, parked rows and key blocks hold nothing unexpected;
    each order is in its final state and has exactly its effects, all sent."""
    problems: list[str] = []
    inbox = {r["message_id"]: r for r in await rows(engine, "SELECT message_id, status, error_code FROM inbox")}
    planned = {r.message_id: r for r in plan.records}
    wrong: list[tuple[str, object, object]] = []
    for record in plan.records:
        row = inbox.get(record.message_id)
        got = (row["status"], row["error_code"]) if row else None
        if record.status == "parked" and got is not None:
            wrong.append((record.message_id, "parked", got))
        elif record.status != "parked" and not _ended_as(record, got):
            wrong.append((record.message_id, (record.status, record.code), got))
    if wrong:
        problems.append(f"records not in their planned terminal state: {examples(wrong)}")
    strangers = sorted(set(inbox) - set(planned))
    if strangers:
        problems.append(f"inbox rows for message ids nobody sent: {examples(strangers)}")

    quarantined = await rows(engine, "SELECT failure_id, message_id, error_code, status, ordering_key FROM quarantine")
    meant = {r.message_id for r in plan.records if r.status == "quarantined"}
    healthy = [(q["message_id"], q["error_code"]) for q in quarantined if q["message_id"] not in meant]
    if healthy:
        problems.append(f"healthy records quarantined: {examples(healthy)}")
    missing = sorted(meant - {q["message_id"] for q in quarantined})
    if missing:
        problems.append(f"records meant for quarantine without a quarantine row: {examples(missing)}")
    repeated = [m for m, n in Counter(q["message_id"] for q in quarantined).items() if n > 1]
    if repeated:
        problems.append(f"records quarantined more than once: {examples(repeated)}")

    retries = await rows(
        engine, "SELECT message_id, ordering_key, tier_step, attempts, error_code, due_at FROM retries ORDER BY due_at"
    )
    if retries:
        terminal = [r["message_id"] for r in retries if r["message_id"] in inbox]
        left = [(r["message_id"], r["ordering_key"], r["tier_step"], r["error_code"]) for r in retries]
        problems.append(f"retry rows left: {examples(left)}; {len(terminal)} of them for records already terminal")

    blocks = await rows(engine, "SELECT ordering_key, failure_id FROM key_blocks")
    open_heads = {q["failure_id"]: q for q in quarantined if q["status"] == "open"}
    unheaded = [(b["ordering_key"], b["failure_id"]) for b in blocks if b["failure_id"] not in open_heads]
    if unheaded:
        problems.append(f"keys held without a quarantined head: {examples(unheaded)}")
    held = {b["ordering_key"] for b in blocks}
    meant_held = plan.keys_held()
    if held != meant_held:
        problems.append(
            f"held keys differ: unexpected {sorted(held - meant_held)}, not held {sorted(meant_held - held)}"
        )
    parked = await rows(
        engine,
        "SELECT id, ordering_key, message_id, source_partition, source_offset, parked_at FROM parked ORDER BY id",
    )
    loose = [(p["ordering_key"], p["message_id"]) for p in parked if p["ordering_key"] not in held]
    if loose:
        problems.append(f"parked records of keys nothing holds (never released): {examples(loose)}")
    meant_parked = {r.message_id for r in plan.records if r.status == "parked"}
    stray = sorted({p["message_id"] for p in parked} - meant_parked)
    if stray:
        problems.append(f"records parked that should have been applied: {examples(stray)}")
    twice = [m for m, n in Counter(p["message_id"] for p in parked).items() if n > 1]
    if twice:
        copies = [
            (p["message_id"], p["id"], f"{p['source_partition']}/{p['source_offset']}", str(p["parked_at"]))
            for p in parked
            if p["message_id"] in twice
        ]
        problems.append(
            f"records parked more than once (message id, row, partition/offset, parked at): {examples(copies)}"
        )

    unpublished = await rows(engine, "SELECT id, topic FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 20")
    if unpublished:
        problems.append(f"outbox rows never published: {examples([(u['id'], u['topic']) for u in unpublished])}")

    orders = {o["order_id"]: o for o in await rows(engine, "SELECT order_id, status, version FROM orders")}
    wrong_orders = []
    for order in plan.orders:
        row = orders.get(order.order_id)
        got = (row["status"], row["version"]) if row else None
        meant_state = (order.scenario.status, order.scenario.events) if order.scenario.status else None
        if got != meant_state:
            wrong_orders.append((order.order_id, meant_state, got))
    if wrong_orders:
        problems.append(f"orders not in their final state (status, version): {examples(wrong_orders)}")

    effects = await rows(engine, "SELECT aggregate_id, kind, state, count(*) AS n FROM effects GROUP BY 1, 2, 3")
    per_kind = Counter((e["aggregate_id"], e["kind"]) for e in effects for _ in range(e["n"]))
    doubled = [key for key, n in per_kind.items() if n > 1]
    if doubled:
        problems.append(f"more than one effect row per (order, kind): {examples(doubled)}")
    if set(per_kind) != plan.effects():
        problems.append(
            f"effects differ: unexpected {examples(sorted(set(per_kind) - plan.effects()))}, "
            f"missing {examples(sorted(plan.effects() - set(per_kind)))}"
        )
    unsent = [(e["aggregate_id"], e["kind"], e["state"]) for e in effects if e["state"] != "sent"]
    if unsent:
        problems.append(f"effects not sent: {examples(unsent)}")
    return problems


def _ended_as(record: Planned, got: tuple[str, str | None] | None) -> bool:
    if got is None or got[0] != record.status:
        return False
    if record.code == EXHAUSTED:
        return got[1] is not None and got[1].endswith(EXHAUSTED)
    return got[1] == record.code


async def check_topics(
    kafka: str, topics: Topics, engine: AsyncEngine, plan: Plan, summary: dict[str, Any]
) -> list[str]:
    """Each order's events, without the at-least-once repeats, carry versions 1, 2, … n in publication order;
    each quarantined record's envelope was published."""
    problems: list[str] = []
    expected = sum(order.scenario.events for order in plan.orders)
    records = await read_topic(kafka, topics.events, expect=expected, timeout=60)
    records.sort(key=lambda r: (r.partition, r.offset))
    first: dict[str, bytes] = {}
    versions: dict[str, list[int]] = defaultdict(list)
    changed_repeats = []
    for record in records:
        event_id = dict(record.headers).get("event-id", b"").decode()
        if event_id in first:
            if first[event_id] != record.value:
                changed_repeats.append(event_id)
            continue
        first[event_id] = record.value
        event = json.loads(record.value)
        versions[event["orderId"]].append(event["orderVersion"])
    summary["events"] = {"published": len(records), "distinct": len(first), "repeats": len(records) - len(first)}
    if changed_repeats:
        problems.append(f"an event published again with other content: {examples(changed_repeats)}")
    meant = {o.order_id: o.scenario.events for o in plan.orders if o.scenario.events}
    out_of_order = [
        (order_id, versions.get(order_id, [])[:10])
        for order_id, n in meant.items()
        if versions.get(order_id, []) != list(range(1, n + 1))
    ]
    if out_of_order:
        problems.append(f"orders whose events are not versions 1..n in order: {examples(out_of_order)}")
    unknown = sorted(set(versions) - set(meant))
    if unknown:
        problems.append(f"events of orders that should have none: {examples(unknown)}")

    quarantined = {q["failure_id"] for q in await rows(engine, "SELECT failure_id FROM quarantine")}
    envelopes = await read_topic(kafka, topics.quarantine, expect=len(quarantined), timeout=30)
    published = {dict(r.headers).get("failure-id", b"").decode() for r in envelopes}
    if published != quarantined:
        problems.append(
            f"quarantine topic differs from the table: missing {sorted(quarantined - published)}, "
            f"extra {sorted(published - quarantined)}"
        )
    return problems


def check_providers(plan: Plan, providers: Downstream) -> list[str]:
    """The providers saw each payment once (one capture per order at most) and each email once per ref."""
    problems: list[str] = []
    payments = providers.payments()
    meant = {f"{order_id}/{kind}" for order_id, kind in plan.effects() if kind.startswith("payment.")}
    if set(payments) != meant:
        problems.append(
            f"payments differ: unexpected {examples(sorted(set(payments) - meant))}, "
            f"missing {examples(sorted(meant - set(payments)))}"
        )
    refs = Counter(email["ref"] for email in providers.emails())
    meant_refs = {f"{order_id}/{kind}" for order_id, kind in plan.effects() if kind == "email.shipped"}
    doubled = [ref for ref, n in refs.items() if n > 1]
    if doubled:
        problems.append(f"emails sent more than once for one ref: {examples(doubled)}")
    if set(refs) != meant_refs:
        problems.append(
            f"emails differ: unexpected {examples(sorted(set(refs) - meant_refs))}, "
            f"missing {examples(sorted(meant_refs - set(refs)))}"
        )
    return problems
