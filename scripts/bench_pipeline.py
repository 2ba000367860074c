"""The whole pipeline in scripts/bench (issue 17): an order is done when its capture is sent and its events published.

Each stage runs on a fresh database and fresh topics (named, and dropped, as scripts/bench.py does), against the
fake provider of `python -m service.orders.fakes` (HTTP keep-alive, a latency per route):

1. relay: N `order.accepted` outbox rows, as the consumer writes them, published by one `order-service relay`,
   against a raw idempotent aiokafka producer sending the same messages to another topic (each twice, interleaved:
   the better run of each counts);
2. effects: N pending `payment.capture` effects (and their orders) executed by one `order-service effects`, with
   0 ms and (full runs only) 100 ms of provider latency;
3. pipeline: N new orders on a source topic with one `consume`, one `relay` and two `effects` running;
4. (full runs only) the same four processes at a steady rate: record timestamp → `payment.captured` published.

A process's clock starts at its `*_started` log line (after the interpreter's imports and the connections, which a
long-running process pays once), or at its spawn when it logs none; it stops when the database shows the stage
done. Set BENCH_EFFECT_CONCURRENCY to run the effect workers with that ORDERS_EFFECT_CONCURRENCY.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from aiokafka import AIOKafkaProducer
from bench_data import placed_order
from bench_lab import (
    ORDER_SERVICE,
    SLOWEST_RATE,
    STARTUP_ALLOWANCE,
    Bench,
    BenchError,
    Process,
    interval_for,
    progress,
    service_env,
    stop,
)

from service.adapters.kafka import COMPRESSION
from service.config import Settings
from service.orders import store as order_store
from service.orders.fakes import PAYMENTS_POST
from service.orders.model import Order, OrderStatus, capture_of
from service.policy.envelope import event_headers
from service.store import effects as effect_store
from service.store import outbox
from service.store.outbox import OutboxMessage
from service.store.recordset import Columns

# The consumer's `order.accepted` documents are about 200 bytes; the relay stage's are padded to this size.
PAYLOAD_BYTES = 300
WORKERS = 2  # effect workers in the pipeline stages
PROVIDER_LATENCY = 0.1  # seconds per payment call in the slow-provider stage
# ORDERS_EFFECT_CONCURRENCY of the slow-provider stage: calls in flight are what a 100 ms provider's rate grows with.
SLOW_CONCURRENCY = 160
STEADY_SECONDS = 15
# The relay stage's progress: this many outbox rows, evenly spread over the ids, and the last.
PROBE_COUNT = 100
PROBES = """
    SELECT array_agg(id ORDER BY id) FROM (
        SELECT id, row_number() OVER (ORDER BY id) AS n, count(*) OVER () AS rows FROM outbox) AS numbered
    WHERE n % greatest(rows / $1, 1) = 0 OR n = rows"""
PUBLISHED_OF = "SELECT count(*) FROM outbox WHERE id = ANY($1::bigint[]) AND published_at IS NOT NULL"
INSERT_BATCH = 5_000
# The order produced first in each pipeline stage, so that group joins and first connections are not measured.
WARMUP = "WARMUP"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stage:
    """How long one stage took to take `count` items to their end, and whether every one of them got there."""

    count: int
    seconds: float
    done: bool

    @property
    def rps(self) -> float:
        """Items per second."""
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PipelineResults:
    """What the pipeline stages measured; `None` where a stage did not run (yet)."""

    slow_stages: bool
    only: frozenset[str] = frozenset()  # just these stages (bench --only); empty: all
    relay: Stage | None = None
    raw_produce: Stage | None = None
    effects: Stage | None = None
    effects_100ms: Stage | None = None
    pipeline: Stage | None = None
    latency_ms: tuple[float, float] | None = None
    latency_done: bool = False

    @property
    def all_done(self) -> bool:
        """Every stage that had to run ran, and left no effect unsent and no outbox row unpublished."""
        stages = {
            "relay": [self.relay, self.raw_produce],
            "effects": [self.effects],
            "effects100": [self.effects_100ms],
            "pipeline": [self.pipeline],
        }
        ran = all(
            stage is not None and stage.done
            for name, stages_of in stages.items()
            if self.runs(name)
            for stage in stages_of
        )
        return ran and (self.latency_done or not self.runs("steady"))

    def runs(self, stage: str) -> bool:
        """Whether this run measures that stage (`effects100` and `steady` are the slow ones)."""
        if self.only:
            return stage in self.only
        return self.slow_stages or stage not in ("effects100", "steady")


def figures(results: PipelineResults | None) -> dict[str, Any]:
    """The pipeline's keys of the bench's JSON line (all null, and not done, when the stages never started)."""
    r = results or PipelineResults(slow_stages=True)

    def rps(stage: Stage | None) -> float | None:
        return round(stage.rps, 1) if stage else None

    relay, raw = rps(r.relay), rps(r.raw_produce)
    return {
        "relay_vs_raw_produce": round(relay / raw, 3) if relay is not None and raw else None,
        "relay_rps": relay,
        "raw_produce_rps": raw,
        "effects_per_worker_rps": rps(r.effects),
        "effects_per_worker_rps_100ms": rps(r.effects_100ms),
        "pipeline_rps": rps(r.pipeline),
        "p50_to_captured_ms": round(r.latency_ms[0], 1) if r.latency_ms else None,
        "p99_to_captured_ms": round(r.latency_ms[1], 1) if r.latency_ms else None,
        "pipeline_orders": r.pipeline.count if r.pipeline else None,
        "effect_concurrency": effect_concurrency(),
        "effect_concurrency_100ms": effect_concurrency(slow=True),
        "pipeline_all_done": results is not None and r.all_done,
    }


async def measure_pipeline(bench: Bench, results: PipelineResults) -> None:
    """Every pipeline stage, in order, filling `results` as each ends (a failed stage keeps what came before)."""
    count = bench.sizes.pipeline
    if results.runs("relay"):
        # Each measured twice, interleaved, and the better run counts, as the consume stage's limit and service:
        # each run is a second or two long, and whatever else runs on the machine at that moment moves it.
        runs = [await relay_stage(bench, count, suffix) for suffix in ("", "b")]
        results.relay = best_stage(*(relay for relay, _ in runs))
        results.raw_produce = best_stage(*(raw for _, raw in runs))
        progress(f"raw idempotent producer, {count:,} messages (best of two)", results.raw_produce.rps)
        progress("order-service relay, 1 process (best of two)", results.relay.rps)
    if not any(results.runs(stage) for stage in ("effects", "effects100", "pipeline", "steady")):
        return
    provider = await Provider.start(bench)
    try:
        if results.runs("effects"):
            results.effects = await effects_stage(bench, provider, count, "fx0", 0.0)
        if results.runs("effects100"):
            results.effects_100ms = await effects_stage(
                bench, provider, count, "fx100", PROVIDER_LATENCY, effect_concurrency(slow=True)
            )
        if results.runs("pipeline"):
            results.pipeline = await pipeline_stage(bench, provider, count)
        if results.runs("steady"):
            results.latency_ms, results.latency_done = await steady_stage(bench, provider)
    finally:
        await stop(provider.process)


# ------------------------------------------------------------------------------------------------ the stages


def best_stage(*runs: Stage) -> Stage:
    """The fastest of several runs of one stage; done only if all were."""
    return Stage(
        max(runs, key=lambda run: run.rps).count, min(run.seconds for run in runs), all(run.done for run in runs)
    )


async def relay_stage(bench: Bench, count: int, suffix: str = "") -> tuple[Stage, Stage]:
    """A raw idempotent producer sending `count` messages, then one relay publishing them from the outbox."""
    # The relay starts once the topics it writes exist (its start-up check): the source's derived topics.
    topic = await bench.new_topic(f"relay{suffix}", derived=True)
    raw_topic = await bench.new_topic(f"rawprod{suffix}", derived=False)
    dsn, url = await bench.new_database(f"relay{suffix}")
    messages = [accepted(topic, number) for number in range(count)]
    connection = await asyncpg.connect(dsn)
    try:
        await insert(connection, outbox.ADD_ROWS, "outbox_rows", outbox.COLUMNS, messages)
        probes = await connection.fetchval(PROBES, PROBE_COUNT)
        await bench.checkpoint()
        raw = await raw_produce(bench.bootstrap, raw_topic, messages)
        await bench.checkpoint()
        env = service_env(
            ORDERS_DATABASE_URL=url,
            ORDERS_KAFKA_BOOTSTRAP_SERVERS=bench.bootstrap,
            ORDERS_CONSUMER_NAME=f"bench-relay{suffix}-{bench.stamp}",
            ORDERS_SOURCE_TOPIC=topic,
            ORDERS_METRICS_PORT="0",
        )
        process = await bench.spawn(f"relay{suffix}", [str(ORDER_SERVICE), "relay"], env)
        clock = Clock(process, bench.workdir / f"relay{suffix}.log", "relay_started")
        unpublished, ended = count, None

        async def published() -> bool:
            # A hundred rows spread over the ids, looked up by primary key, say how far the relay is; the rows are
            # counted once those are published. A count walks the index entries of every row published so far, on
            # the cores it measures, each poll (docs/performance.md).
            nonlocal unpublished, ended
            alive([process], bench.workdir)
            clock.tick()
            taken = await connection.fetchval(PUBLISHED_OF, probes)
            unpublished = count - count * taken // len(probes)
            if taken < len(probes):
                return False
            ended = ended or time.time()
            unpublished = await connection.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            if unpublished:
                ended = None
            return bool(unpublished == 0)

        done = await poll_until(published, count, lambda: count - unpublished)
        seconds, cpu = clock.stop(ended)
        await stop(process)
        rows = await connection.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
    finally:
        await connection.close()
    progress(f"relay: {seconds:.2f} s, CPU {cpu / seconds:.0%} of a core, {cpu / count * 1000:.2f} ms per row")
    return Stage(count, seconds, done and rows == count), raw


async def raw_produce(bootstrap: str, topic: str, messages: Sequence[OutboxMessage]) -> Stage:
    """The relay's limit: an idempotent producer (compressed as the relay's) sending the messages, then flushing."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", compression_type=COMPRESSION
    )
    await producer.start()
    try:
        started = time.monotonic()
        futures = [
            await producer.send(topic, message.value, key=(message.key or "").encode(), headers=headers(message))
            for message in messages
        ]
        await producer.flush()
        seconds = time.monotonic() - started
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await producer.stop()
    return Stage(len(messages), seconds, not any(isinstance(outcome, BaseException) for outcome in outcomes))


async def effects_stage(
    bench: Bench, provider: Provider, count: int, what: str, latency: float, concurrency: int | None = None
) -> Stage:
    """One effect worker executing `count` pending captures against the fake provider with this latency (and this
    ORDERS_EFFECT_CONCURRENCY, else the pipeline's)."""
    dsn, database_url = await bench.new_database(what)
    connection = await asyncpg.connect(dsn)
    try:
        created = [new_order(number) for number in range(count)]
        await insert(connection, order_store.CREATE_ROWS, "created_aggregates", order_store.COLUMNS, created)
        effects = [effect_store.NewEffect.of(capture_of(order), None) for order in created]
        await insert(connection, effect_store.ADD_ROWS, "effect_rows", effect_store.COLUMNS, effects)
        await provider.control("reset")
        if latency:
            await provider.control("latency", {"route": PAYMENTS_POST, "seconds": latency})
        await bench.checkpoint()
        env = worker_env(bench, database_url, provider.url)
        if concurrency is not None:
            env["ORDERS_EFFECT_CONCURRENCY"] = str(concurrency)
        process = await bench.spawn(what, [str(ORDER_SERVICE), "effects"], env)
        clock = Clock(process, bench.workdir / f"{what}.log", "effects_started", provider.process)
        left = count

        async def settled() -> bool:
            nonlocal left
            alive([process], bench.workdir)
            clock.tick()
            # Each poll runs on the cores it measures. A sent capture writes one outbox row, so the outbox's last
            # id (one index entry away) says how far the worker is; the effects are counted only once that is
            # `count` (a count walks every index entry the claims left behind: docs/performance.md).
            left = count - await connection.fetchval("SELECT coalesce(max(id), 0) FROM outbox")
            if left > 0:
                return False
            left = await connection.fetchval("SELECT count(*) FROM effects WHERE state IN ('pending', 'in_flight')")
            return bool(left == 0)

        done = await poll_until(settled, count, lambda: count - left)
        seconds, cpu, provider_cpu = clock.stop()
        await stop(process)
        states = dict(await connection.fetch("SELECT state, count(*) FROM effects GROUP BY state"))
    finally:
        await connection.close()
    stage = Stage(count, seconds, done and states == {"sent": count})
    progress(
        f"order-service effects, 1 worker, {latency * 1000:.0f} ms provider latency ({states};"
        f" worker CPU {cpu / seconds:.0%} of a core, {cpu / count * 1000:.2f} ms per effect;"
        f" fake provider CPU {provider_cpu / seconds:.0%})",
        stage.rps,
    )
    return stage


async def pipeline_stage(bench: Bench, provider: Provider, count: int) -> Stage:
    """consume + relay + two effect workers on `count` new orders, from the first record produced to the last
    order whose capture is sent and whose two events are published."""
    async with running_pipeline(bench, provider, "pipe") as pipeline:
        started = time.monotonic()
        await bench.produce(pipeline.topic, map(placed_order, range(count)))
        done = await pipeline.wait(count)
        seconds = time.monotonic() - started
        stage = Stage(count, seconds, done and await pipeline.all_done(count))
        progress(f"pipeline, consume + relay + {WORKERS} effect workers ({pipeline.cpu(seconds)})", stage.rps)
    return stage


async def steady_stage(bench: Bench, provider: Provider) -> tuple[tuple[float, float], bool]:
    """p50 and p99 of the `payment.captured` row's published_at − the order's record timestamp, at a steady rate."""
    rate = bench.sizes.steady_rate
    count = rate * STEADY_SECONDS
    async with running_pipeline(bench, provider, "pipelat") as pipeline:
        pipeline.start_clock()
        started = time.monotonic()
        await bench.produce_steady(pipeline.topic, count, rate, placed_order)
        cpu = pipeline.cpu(time.monotonic() - started)
        done = await pipeline.wait(count) and await pipeline.all_done(count)
        # The inbox keeps the record's timestamp as received_at; published_at is the relay's claiming
        # transaction's start, a few milliseconds before Kafka acknowledged the batch.
        p50, p99 = await pipeline.connection.fetchrow(
            """
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
            FROM (SELECT extract(epoch FROM o.published_at - i.received_at) * 1000 AS ms
                  FROM inbox i JOIN outbox o ON o.key = i.aggregate_id AND o.headers->>'event-type' = 'payment.captured'
                  WHERE i.aggregate_id <> $1) AS latencies
            """,
            WARMUP,
        )
        hops = await pipeline.connection.fetch(
            """
            SELECT hop, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99
            FROM (SELECT i.aggregate_id,
                         extract(epoch FROM i.processed_at - i.received_at) * 1000 AS consumed,
                         extract(epoch FROM o.created_at - i.processed_at) * 1000 AS captured,
                         extract(epoch FROM o.published_at - o.created_at) * 1000 AS published
                  FROM inbox i JOIN outbox o ON o.key = i.aggregate_id AND o.headers->>'event-type' = 'payment.captured'
                  WHERE i.aggregate_id <> $1) AS each,
                 LATERAL (VALUES ('consumed', consumed), ('captured', captured), ('published', published)) AS h(hop, ms)
            GROUP BY hop ORDER BY array_position(ARRAY['consumed', 'captured', 'published'], hop)
            """,
            WARMUP,
        )
    progress(f"to payment.captured published at {rate:,} orders/s ({cpu}): p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    progress(
        "each hop (p50 / p99 ms): " + ", ".join(f"{hop['hop']} {hop['p50']:.0f} / {hop['p99']:.0f}" for hop in hops)
    )
    return (float(p50), float(p99)), done


@dataclass
class Pipeline:
    """One consume, one relay and two effect workers on a fresh source topic and database."""

    bench: Bench
    topic: str
    connection: asyncpg.Connection
    processes: list[Process]
    provider: Provider
    cpu_at_start: dict[int, float]
    machine_at_start: tuple[float, float] = (0.0, 0.0)
    warm: bool = False

    async def wait(self, orders: int) -> bool:
        """Wait until `orders` more than the warm-up's are done: their captures sent, every outbox row published."""
        target = orders + self.warm
        sent = 0

        async def done() -> bool:
            nonlocal sent
            alive(self.processes, self.bench.workdir)
            # Each poll runs on the cores it measures. Every order writes two outbox rows (order.accepted, then
            # payment.captured), so the outbox's last id (one index entry away) says how far the pipeline is; the
            # counts, which walk every index entry the claims and marks left behind, wait until that is 2 × target.
            written = await self.connection.fetchval("SELECT coalesce(max(id), 0) FROM outbox")
            sent = max(0, min(target - 1, written - target))
            if written < 2 * target:
                return False
            outstanding, unpublished = await self.connection.fetchrow(
                """SELECT (SELECT count(*) FROM effects WHERE state IN ('pending', 'in_flight', 'uncertain')),
                          (SELECT count(*) FROM outbox WHERE published_at IS NULL)"""
            )
            if outstanding or unpublished:
                return False
            sent = await self.connection.fetchval("SELECT count(*) FROM effects WHERE state = 'sent'")
            # A capture is sent in the transaction that writes its payment.captured row, after the one that wrote
            # its order.accepted row: with nothing unpublished left, both events of every sent order went out.
            return bool(sent >= target)

        return await poll_until(done, target, lambda: sent)

    async def all_done(self, orders: int) -> bool:
        """Every effect sent and every outbox row published: one capture and two events per order, nothing else."""
        target = orders + self.warm
        effects, sent, rows, published = await self.connection.fetchrow(
            """SELECT (SELECT count(*) FROM effects), (SELECT count(*) FROM effects WHERE state = 'sent'),
                      (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL)"""
        )
        return bool(effects == sent == target and rows == published == 2 * target)

    def start_clock(self) -> None:
        """Count CPU from now on."""
        pids = [*(process.pid for process in self.processes), self.provider.process.pid]
        self.cpu_at_start = {pid: cpu_seconds(pid) for pid in pids}
        self.machine_at_start = machine_seconds()

    def cpu(self, seconds: float) -> str:
        """Each process's CPU since `start_clock`, in shares of one core."""
        names = ["consume", "relay", *(f"effects {n + 1}" for n in range(WORKERS)), "fake provider"]
        pids = [*(process.pid for process in self.processes), self.provider.process.pid]
        used = [cpu_seconds(pid) - self.cpu_at_start.get(pid, 0.0) for pid in pids]
        busy, idle = (now - before for now, before in zip(machine_seconds(), self.machine_at_start, strict=True))
        return (
            "CPU: "
            + ", ".join(f"{name} {cpu / seconds:.0%}" for name, cpu in zip(names, used, strict=True))
            + f"; the machine {busy / (busy + idle):.0%} busy,"
            + f" {(busy - sum(used)) / seconds:.0%} of a core outside these (PostgreSQL, Kafka, the bench)"
        )


@asynccontextmanager
async def running_pipeline(bench: Bench, provider: Provider, what: str) -> AsyncIterator[Pipeline]:
    """The four processes on a fresh topic and database, after one order went all the way through."""
    topic = await bench.new_topic(what, derived=True)
    dsn, database_url = await bench.new_database(what)
    await provider.control("reset")
    await bench.checkpoint()
    consumer = f"bench-{what}-{bench.stamp}"
    # The effect workers write payment.captured to <source>.events, and the relay publishes it there.
    env = worker_env(bench, database_url, provider.url) | {
        "ORDERS_SOURCE_TOPIC": topic,
        "ORDERS_CONSUMER_NAME": consumer,
    }
    connection = await asyncpg.connect(dsn)
    processes: list[Process] = []
    try:
        processes.append(await bench.consume(f"{what}-consume", database_url, topic, consumer)())
        processes.append(await bench.spawn(f"{what}-relay", [str(ORDER_SERVICE), "relay"], env))
        for n in range(WORKERS):
            processes.append(await bench.spawn(f"{what}-effects-{n}", [str(ORDER_SERVICE), "effects"], env))
        pipeline = Pipeline(bench, topic, connection, processes, provider, {})
        await bench.produce(topic, [placed_order(0, order_id=WARMUP)])
        if not await pipeline.wait(1):
            raise BenchError(f"the warm-up order did not go through the pipeline; see {bench.workdir}")
        pipeline.warm = True
        pipeline.start_clock()
        yield pipeline
    finally:
        await asyncio.gather(*(stop(process) for process in processes))
        await connection.close()


# ------------------------------------------------------------------------------------------------ the data


def accepted(topic: str, number: int) -> OutboxMessage:
    """Order `number`'s `order.accepted` event, as the consumer writes it (service/worker/writes.py), padded."""
    _, value, headers = placed_order(number)
    order = json.loads(value)
    message_id = headers[0][1].decode()
    document: dict[str, Any] = {
        "type": "order.accepted",
        "orderId": order["order_id"],
        "orderVersion": 1,
        "messageId": message_id,
        "tenant": order["tenant"],
        "customerId": order["customer_id"],
        "amountCents": amount(order),
        "currency": order["currency"],
    }
    document["note"] = "." * max(0, PAYLOAD_BYTES - len(orjson.dumps(document)) - len(',"note":""'))
    return OutboxMessage.json(topic, order["order_id"], event_headers(message_id, "order.accepted", None), document)


def new_order(number: int) -> Order:
    """Order `number` as the consumer creates it from its `order.placed.v1` record."""
    order = json.loads(placed_order(number)[1])
    return Order(
        order_id=order["order_id"],
        tenant=order["tenant"],
        customer_id=order["customer_id"],
        status=OrderStatus.PLACED,
        amount_cents=amount(order),
        currency=order["currency"],
        sequence=1,
    )


def amount(order: dict[str, Any]) -> int:
    """An order document's total in cents."""
    return sum(item["quantity"] * item["unit_price_cents"] for item in order["items"])


def headers(message: OutboxMessage) -> list[tuple[str, bytes]]:
    """A message's headers as Kafka takes them."""
    assert isinstance(message.headers, dict)
    return [(name, value.encode()) for name, value in message.headers.items()]


async def insert(
    connection: asyncpg.Connection, sql: str, parameter: str, columns: Columns, rows: Sequence[Any]
) -> None:
    """Rows written by the service's own statement (a recordset parameter), in batches."""
    statement = sql.replace(f":{parameter}", "$1")
    for first in range(0, len(rows), INSERT_BATCH):
        await connection.execute(statement, columns.encode(rows[first : first + INSERT_BATCH]))


# ------------------------------------------------------------------------------------------------ processes


def effect_concurrency(*, slow: bool = False) -> int | None:
    """The effect workers' ORDERS_EFFECT_CONCURRENCY: BENCH_EFFECT_CONCURRENCY, else the setting's default (for
    the slow-provider stage, BENCH_EFFECT_CONCURRENCY_100MS, else SLOW_CONCURRENCY)."""
    field = Settings.model_fields.get("effect_concurrency")
    if field is None:
        return None
    override = os.environ.get("BENCH_EFFECT_CONCURRENCY_100MS" if slow else "BENCH_EFFECT_CONCURRENCY")
    if override:
        return int(override)
    return SLOW_CONCURRENCY if slow else int(field.default)


def worker_env(bench: Bench, database_url: str, payments_url: str) -> dict[str, str]:
    """The environment of a relay or an effect worker."""
    env = service_env(
        ORDERS_DATABASE_URL=database_url,
        ORDERS_KAFKA_BOOTSTRAP_SERVERS=bench.bootstrap,
        ORDERS_PAYMENTS_URL=payments_url,
        ORDERS_METRICS_PORT="0",
    )
    concurrency = effect_concurrency()
    return env | ({"ORDERS_EFFECT_CONCURRENCY": str(concurrency)} if concurrency is not None else {})


@dataclass(frozen=True)
class Provider:
    """The fake provider in a process of its own (its CPU is not the bench's), and its URL."""

    process: Process
    url: str

    @staticmethod
    async def start(bench: Bench) -> Provider:
        """Start it, and wait for the URL it prints."""
        process = await bench.spawn("fakes", [sys.executable, "-m", "service.orders.fakes"], service_env())
        log = bench.workdir / "fakes.log"
        url = ""

        async def listening() -> bool:
            nonlocal url
            alive([process], bench.workdir)
            lines = log.read_text().splitlines() if log.exists() else []
            url = next((line for line in lines if line.startswith("http://")), "")
            return bool(url)

        if not await poll_until(listening, 0, lambda: 0):
            raise BenchError(f"the fake provider did not start; see {log}")
        return Provider(process, url)

    async def control(self, name: str, body: dict[str, Any] | None = None) -> None:
        """POST its `/_control/<name>` (reset: forget payments and latencies; latency: slow a route down)."""
        async with httpx.AsyncClient(base_url=self.url) as client:
            response = await client.post(f"/_control/{name}", json=body or {})
        if response.status_code != 200:
            raise BenchError(f"the fake provider refused /_control/{name}: {response.status_code} {response.text}")


def alive(processes: Sequence[Process], workdir: Path) -> None:
    """BenchError when one of the processes exited."""
    for process in processes:
        if process.returncode is not None:
            raise BenchError(f"a process exited with {process.returncode}; see {workdir}")


async def poll_until(check: Callable[[], Awaitable[bool]], count: int, done: Callable[[], int]) -> bool:
    """Poll `check` (rarely while far from `count`, every 20 ms near it) within the bench's allowance."""
    deadline = time.monotonic() + STARTUP_ALLOWANCE + count / SLOWEST_RATE
    while not await check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_for(done(), count) if count else 0.02)
    return True


class Clock:
    """A stage's clock on one process: it starts when the process logs its loop's start (else at its spawn),
    and counts the CPU of that process (and of the others given) from then on."""

    def __init__(self, process: Process, log: Path, event: str, *others: Process) -> None:
        self.pids = [process.pid, *(other.pid for other in others)]
        self.log, self.event = log, event
        self.started = time.time()
        self.cpu = [cpu_seconds(pid) for pid in self.pids]
        self.logged = False

    def tick(self) -> None:
        """Look for the start line (call it as the stage polls, until it is found)."""
        if self.logged:
            return
        at = logged_at(self.log, self.event)
        if at is not None:
            self.started, self.logged = at, True
            self.cpu = [cpu_seconds(pid) for pid in self.pids]

    def stop(self, ended: float | None = None) -> tuple[float, ...]:
        """The seconds from the start to `ended` (epoch seconds; default now), then the CPU seconds of each process
        since the start."""
        self.tick()
        used = [cpu_seconds(pid) - before for pid, before in zip(self.pids, self.cpu, strict=True)]
        return ((ended or time.time()) - self.started, *used)


def machine_seconds() -> tuple[float, float]:
    """The machine's busy and idle CPU seconds so far, all cores together (/proc/stat)."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait; steal and guest count as busy
    return (sum(ticks[:8]) - idle) / CLOCK_TICKS, idle / CLOCK_TICKS


def logged_at(log: Path, event: str) -> float | None:
    """When a process logged `event` (epoch seconds), if it has."""
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event and "timestamp" in entry:
            return datetime.fromisoformat(entry["timestamp"]).timestamp()
    return None


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the command's ")": state is field 3 of stat(5), utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
