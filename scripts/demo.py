"""The demo driver (run by scripts/demo): the whole pipeline on a realistic sample, then a checked summary.

It starts the downstream test server and `order-service run` as real processes, produces good orders,
duplicates, malformed records, an unsupported schema, missing fields, business rejections and transient
downstream failures, waits until every record is terminal and the outbox is drained, and prints what
happened next to what it expected. Exit code 1 when they differ.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ROOT = Path(__file__).resolve().parent.parent
console = Console()


def stage(what: str) -> None:
    """One progress line: the demo says what it does next before each step that takes a while."""
    console.print(f"demo: {what}", markup=False, highlight=False)


Record = tuple[str, bytes, dict[str, str]]


def placed(order_id: str, customer: str, tenant: str = "acme") -> bytes:
    return _json(
        {
            "schema": "order.placed.v2",
            "order_id": order_id,
            "tenant": tenant,
            "customer_id": customer,
            "currency": "EUR",
            "placed_at": "2026-11-30T10:00:00Z",
            "sequence": 1,
            "items": [{"sku": "book-42", "quantity": 2, "unit_price_cents": 1999}],
        }
    )


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


def sample() -> tuple[list[Record], dict[str, Any]]:
    """The records to produce and what the service must make of them."""
    good = [f"DEMO-{n:03d}" for n in range(1, 21)]
    records: list[Record] = []
    for n, order_id in enumerate(good):
        tenant = ("acme", "globex", "initech")[n % 3]
        records.append((order_id, placed(order_id, f"c-{n}", tenant), {"message-id": f"{order_id}.1/order.placed"}))
    # A producer that retried: the same message ids again.
    records += [
        (order_id, placed(order_id, "c-0"), {"message-id": f"{order_id}.1/order.placed"}) for order_id in good[:5]
    ]
    for order_id in good[:8]:
        shipped = {"schema": "order.shipped.v1", "order_id": order_id, "carrier": "dhl", "tracking_number": "JD01"}
        records.append((order_id, _json(shipped), {"message-id": f"{order_id}.2/order.shipped"}))
    for order_id in good[8:11]:
        cancelled = {"schema": "order.cancelled.v1", "order_id": order_id, "reason": "customer asked"}
        records.append((order_id, _json(cancelled), {"message-id": f"{order_id}.2/order.cancelled"}))
    # Invalid input: quarantined at once.
    records += [(f"BAD-{n}", b"\x00\x01 not json", {}) for n in range(3)]
    records += [(f"ODD-{n}", _json({"schema": "order.teleported.v9", "order_id": f"ODD-{n}"}), {}) for n in range(2)]
    records += [(f"GAP-{n}", _json({"schema": "order.shipped.v1", "order_id": f"GAP-{n}"}), {}) for n in range(2)]
    # Business rejections: terminal, never retried.
    records += [(f"UMB-{n}", placed(f"UMB-{n}", "c-1", tenant="umbrella"), {}) for n in range(2)]
    records.append(("BLK-1", placed("BLK-1", "blocked-9"), {}))
    records.append(("MIS-1", placed("MIS-1", "missing-3"), {}))
    for n in range(2):
        ghost = {"schema": "order.shipped.v1", "order_id": f"GHOST-{n}", "carrier": "ups", "tracking_number": "1Z"}
        records.append((f"GHOST-{n}", _json(ghost), {}))
    records.append((good[11], placed(good[11], "c-11"), {"message-id": f"{good[11]}.9/order.placed"}))
    cancel_shipped = {"schema": "order.cancelled.v1", "order_id": good[0], "reason": "too late"}
    records.append((good[0], _json(cancel_shipped), {"message-id": f"{good[0]}.3/order.cancelled"}))
    expected = {
        "produced": len(records) + 1,  # + the order whose customer lookups keep failing, produced later
        "duplicates": 5,
        "inbox": {"processed": 31, "rejected": 8, "quarantined": 8},
        "rejected": {
            "UNKNOWN_TENANT": 2,
            "CUSTOMER_BLOCKED": 1,
            "UNKNOWN_CUSTOMER": 1,
            "ORDER_NOT_FOUND": 2,
            "ORDER_EXISTS": 1,
            "INVALID_TRANSITION": 1,
        },
        "quarantined": {
            "MALFORMED_PAYLOAD": 3,
            "SCHEMA_UNSUPPORTED": 2,
            "INVALID_FIELD": 2,
            "DOWNSTREAM_UNAVAILABLE_EXHAUSTED": 1,
        },
        "orders": {"placed": 9, "shipped": 8, "cancelled": 3},
        "effects": {"payment.capture": 20, "email.shipped": 8, "payment.refund": 3},
        # One capture declined (402); one capture and one email uncertain (timeout, cut) until the reconciler.
        "effect_states": {"sent": 30, "failed": 1},
        "uncertain_before_reconcile": 2,
        "provider": {"payments (captures + refunds)": 22, "emails, at most one per ref": 1, "emails sent": 8},
        # order.accepted/shipped/cancelled 31 + payment.captured 19 + payment.failed 1 + payment.refunded 3
        "topics": {"events": 54, "rejected": 8, "quarantine": 8},
    }
    return records, expected


class Demo:
    def __init__(self, database_url: str, bootstrap: str, workdir: Path) -> None:
        self.database_url = database_url
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.topic = f"orders-demo-{int(time.time())}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
        env |= {
            "ORDERS_DATABASE_URL": self.database_url,
            "ORDERS_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "ORDERS_SOURCE_TOPIC": self.topic,
            "ORDERS_CONSUMER_NAME": "order-service-demo",
            "ORDERS_RETRY_TIERS": "1s,2s",
            "ORDERS_MAX_ELAPSED": "8s",
            "ORDERS_HTTP_TIMEOUT": "1s",
            "ORDERS_METRICS_PORT": "0",
        }
        return env | extra

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log)
        self.processes.append(process)
        return process

    def stop_all(self) -> list[int]:
        codes = []
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            codes.append(process.wait(timeout=60))
        return codes

    async def run(self) -> int:
        records, expected = sample()
        stage("creating the demo's topics ...")
        await self.create_topics()
        stage(f"starting the fake downstream APIs and `order-service run` (logs in {self.workdir}) ...")
        downstream = self.spawn(
            "downstream", [sys.executable, "-m", "service.orders.fakes", "--port", "0"], os.environ.copy()
        )
        assert downstream.stdout is not None
        customers_url = downstream.stdout.readline().decode().strip()
        async with httpx.AsyncClient(base_url=customers_url) as control:
            # Transient trouble the blocking retry absorbs: two rate limits (Retry-After: 1) and one 503.
            await control.post(
                "/_control/faults",
                json={"route": "customers.get", "kind": "fail", "times": 2, "status": 429, "retry_after": 1},
            )
            await control.post(
                "/_control/faults", json={"route": "customers.get", "kind": "fail", "times": 1, "status": 503}
            )
            # Effects: a declined card, a payment that answers after our timeout, an email whose connection is cut.
            await control.post("/_control/declines", json={"order_id": "DEMO-015"})
            await control.post(
                "/_control/faults",
                json={"route": "payments.post", "kind": "delay", "seconds": 2, "key": "DEMO-016/payment.capture"},
            )
            await control.post(
                "/_control/faults",
                json={"route": "emails.post", "kind": "cut", "after_apply": True, "key": "DEMO-003/email.shipped"},
            )
            self.spawn(
                "service",
                [sys.executable, "-m", "service", "run"],
                self.env(
                    ORDERS_CUSTOMERS_URL=customers_url,
                    ORDERS_PAYMENTS_URL=customers_url,
                    ORDERS_EMAILS_URL=customers_url,
                ),
            )
            stage(f"producing {len(records)} records to {self.topic} ...")
            await self.produce(records)
            engine = create_async_engine(self.database_url)
            try:
                stage("waiting for each record to be applied, rejected or quarantined (retries take seconds) ...")
                await self.wait_for(
                    engine, "SELECT count(*) FROM inbox", expected["produced"] - expected["duplicates"] - 1
                )
                # A customer directory that stays down: the budget runs out and the record is quarantined.
                await control.post(
                    "/_control/faults", json={"route": "customers.get", "kind": "fail", "times": 100, "status": 503}
                )
                stage("taking the customer directory down for one more order, until its retry budget runs out ...")
                await self.produce(
                    [("DEMO-099", placed("DEMO-099", "c-99"), {"message-id": "DEMO-099.1/order.placed"})]
                )
                await self.wait_for(engine, "SELECT count(*) FROM inbox", expected["produced"] - expected["duplicates"])
                stage("waiting for the payments and emails to be sent or left uncertain ...")
                await self.wait_for(engine, "SELECT count(*) FROM effects WHERE state NOT IN ('sent', 'failed')", 2)
                uncertain = await self.count(engine, "SELECT count(*) FROM effects WHERE state = 'uncertain'")
                stage("running `order-service reconcile` on the uncertain effects ...")
                reconcile = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "service",
                    "reconcile",
                    cwd=ROOT,
                    env=self.env(ORDERS_PAYMENTS_URL=customers_url, ORDERS_EMAILS_URL=customers_url),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                stdout, stderr = await reconcile.communicate()
                # Its log lines go with the other processes' logs, not into this human output.
                (self.workdir / "reconcile.log").write_bytes(stderr)
                if reconcile.returncode != 0:
                    raise SystemExit(f"demo: reconcile failed with exit code {reconcile.returncode}")
                stage(f"reconcile: {stdout.decode().strip()}")
                stage("waiting for the last effects and events to go out ...")
                await self.wait_for(engine, "SELECT count(*) FROM effects WHERE state NOT IN ('sent', 'failed')", 0)
                await self.wait_for(engine, "SELECT count(*) FROM outbox WHERE published_at IS NULL", 0)
                state = await control.get("/_control/state")
                actual = await self.observe(engine)
                actual["uncertain_before_reconcile"] = uncertain
                provider = state.json()
                emails_per_ref = Counter(email["ref"] for email in provider["emails"])
                actual["provider"] = {
                    "payments (captures + refunds)": len(provider["payments"]),
                    "emails, at most one per ref": max(emails_per_ref.values()),
                    "emails sent": sum(emails_per_ref.values()),
                }
            finally:
                await engine.dispose()
        stage("stopping the service (SIGTERM) and checking the summary ...")
        codes = self.stop_all()
        lookups = sum(state.json()["calls"].get("customers.get", {}).values())
        return self.report(expected, actual, lookups, service_exit=codes[0])

    async def create_topics(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            names = [self.topic] + [
                f"{self.topic}.{suffix}"
                for suffix in ("quarantine", "rejected", "events", "reprocess", "retry.1s", "retry.2s")
            ]
            await admin.create_topics([NewTopic(name, 3, 1) for name in names])
        finally:
            await admin.close()

    async def produce(self, records: list[Record]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for key, value, headers in records:
                await producer.send(
                    self.topic, value, key=key.encode(), headers=[(k, v.encode()) for k, v in headers.items()]
                )
            await producer.flush()
        finally:
            await producer.stop()

    async def wait_for(self, engine: AsyncEngine, sql: str, value: int) -> None:
        deadline = time.monotonic() + 120
        started = time.monotonic()
        # A spinner with what it waits for and the count so far, on a terminal (nothing when piped).
        with console.status("") as status:
            while True:
                async with engine.connect() as connection:
                    current = (await connection.execute(text(sql))).scalar()
                if current == value:
                    return
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"demo: timed out waiting for `{sql}` = {value} (now {current}); see {self.workdir}"
                    )
                status.update(f"waiting for {value} (now {current}, {time.monotonic() - started:.0f} s): {sql}")
                await asyncio.sleep(0.2)

    async def count(self, engine: AsyncEngine, sql: str) -> int:
        async with engine.connect() as connection:
            return int((await connection.execute(text(sql))).scalar_one())

    async def observe(self, engine: AsyncEngine) -> dict[str, Any]:
        async with engine.connect() as connection:

            async def grouped(sql: str) -> dict[str, int]:
                return {row[0]: row[1] for row in await connection.execute(text(sql))}

            actual = {
                "inbox": await grouped("SELECT status, count(*) FROM inbox GROUP BY 1"),
                "rejected": await grouped(
                    "SELECT error_code, count(*) FROM inbox WHERE status = 'rejected' GROUP BY 1"
                ),
                "quarantined": await grouped("SELECT error_code, count(*) FROM quarantine GROUP BY 1"),
                "orders": await grouped("SELECT status, count(*) FROM orders GROUP BY 1"),
                "effects": await grouped("SELECT kind, count(*) FROM effects GROUP BY 1"),
                "effect_states": await grouped("SELECT state, count(*) FROM effects GROUP BY 1"),
            }
        actual["topics"] = {
            suffix: await self.count_topic(f"{self.topic}.{suffix}") for suffix in ("events", "rejected", "quarantine")
        }
        return actual

    async def count_topic(self, topic: str) -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in range(3)]
            ends = await consumer.end_offsets(partitions)
            return sum(ends.values())
        finally:
            await consumer.stop()

    def report(self, expected: dict[str, Any], actual: dict[str, Any], lookups: int, service_exit: int) -> int:
        table = Table(title="order-service demo: what was produced and where it ended")
        table.add_column("what")
        table.add_column("expected", justify="right")
        table.add_column("actual", justify="right")
        table.add_column("")
        mismatches = 0

        def row(label: str, want: Any, got: Any) -> None:
            nonlocal mismatches
            ok = want == got
            mismatches += not ok
            table.add_row(label, str(want), str(got), "[green]ok[/green]" if ok else "[red]MISMATCH[/red]")

        terminal = sum(actual["inbox"].values())
        row("records produced", expected["produced"], expected["produced"])
        row("duplicates (no second effect)", expected["duplicates"], expected["produced"] - terminal)
        row(
            "uncertain effects before reconcile",
            expected["uncertain_before_reconcile"],
            actual["uncertain_before_reconcile"],
        )
        for group in ("inbox", "rejected", "quarantined", "orders", "effects", "effect_states", "provider", "topics"):
            for name, want in expected[group].items():
                row(f"{group}: {name}", want, actual[group].get(name, 0))
            extra = set(actual[group]) - set(expected[group])
            for name in sorted(extra):
                row(f"{group}: {name}", 0, actual[group][name])
        row("service exit code after SIGTERM", 0, service_exit)
        console.print(table)
        console.print(
            f"customer lookups: {lookups}: two 429s (Retry-After: 1) were waited out as backpressure, one 503 was"
            " retried in place, and one order's directory stayed down through the 1s and 2s retry tiers and"
            " backpressure pauses until its 8s budget ran out."
        )
        console.print(
            "effects: one card declined (payment.failed), one payment timed out after the provider took it and one"
            " email connection was cut after sending; the reconciler found both, so nobody was charged or mailed twice."
        )
        if mismatches:
            console.print(f"[red]{mismatches} mismatches[/red]; logs are in {self.workdir}")
            return 1
        console.print("[green]every record reached a terminal state, each exactly once[/green]")
        return 0


def main() -> int:
    database_url, bootstrap, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    # The clients' own warnings (a producer's NotLeaderForPartitionError retry while a fresh topic elects its
    # leaders) go to a file, not among the progress lines; a failure names the directory.
    logging.basicConfig(filename=workdir / "demo.log", level=logging.WARNING)
    demo = Demo(database_url, bootstrap, workdir)
    try:
        return asyncio.run(demo.run())
    finally:
        for process in demo.processes:
            if process.poll() is None:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
