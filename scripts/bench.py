"""Benchmark order-service against its limits and a typical peer, in one run, on the same data (scripts/bench).

On a fresh 3-partition topic it produces N records (90 % new orders, 5 % producer retries of an earlier
record with the same `message-id`, 5 % bytes that are not JSON), then measures:

1. the limit: raw aiokafka consumption of the topic, and a raw asyncpg write of the rows the service writes
   per record (inbox, order, effect, outbox event; 1,000 records per transaction with `unnest`);
2. the peer: a FastStream subscriber (`AckPolicy.ACK`) with one SQLAlchemy session per message, on the first
   records of the same data;
3. `order-service consume`, one process and then two in one group, from its start until every record is
   terminal (inbox rows = unique message ids, committed offsets = end offsets);
4. its peak RSS while draining a large backlog, its produce-to-commit latency at a steady 2,000 records/s,
   and its throughput with a large inbox already in place;
5. the whole pipeline (scripts/bench_pipeline.py): the relay against a raw idempotent producer, one effect
   worker against a fake provider, and consume + relay + two effect workers on new orders.

Every database it creates is named `bench_*`, every topic `bench-*-<timestamp>`; it stops every process it
started and drops what it created (unless --keep). The last line of its output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.table import Table
from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from service.domain.codes import ErrorCode
from service.orders import model as order_rules
from service.orders.domain import DOMAIN
from service.orders.handler import event_document
from service.orders.messages import decode as decode_order
from service.orders.tables import orders
from service.policy.envelope import event_headers, failure_envelope
from service.policy.handling import DecodeFailure
from service.policy.owners import owner_for
from service.policy.records import SourceRecord
from service.policy.retry import AttemptHistory
from service.store.tables import inbox

if TYPE_CHECKING:
    from bench_pipeline import PipelineResults

ROOT = Path(__file__).resolve().parent.parent
ORDER_SERVICE = Path(sys.executable).parent / "order-service"
console = Console(stderr=True)

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]
Process = asyncio.subprocess.Process

PARTITIONS = 3
# The service subscribes to these besides its source topic (default retry tiers 30s,5m); they must exist.
DERIVED = ("quarantine", "events", "rejected", "reprocess", "retry.30s", "retry.5m")
TENANTS = ("acme", "globex", "initech")
# Of every 20 records: 18 new orders, one producer retry of an earlier order, one record that is not JSON.
BLOCK = 20
ORDERS_PER_BLOCK = 18
RAW_BATCH = 1_000
# A drain that has not finished by STARTUP_ALLOWANCE + records / SLOWEST_RATE seconds counts as not terminal.
STARTUP_ALLOWANCE = 60.0
SLOWEST_RATE = 100.0
STOP_GRACE = 30.0
# Far more partitions than a test suite and a bench leave behind: a broker's heap holds every partition's state, and
# one full of old topics slows every figure that goes through it (docs/performance.md, "The machine").
MANY_PARTITIONS = 5_000


@dataclass(frozen=True)
class Sizes:
    """How much each step measures."""

    records: int
    peer: int
    backlog: int
    steady_seconds: int
    steady_rate: int
    prefill: int
    pipeline: int  # the orders of each pipeline stage
    pipeline_slow: bool  # the pipeline stages with a 100 ms provider and at a steady rate
    only: frozenset[str] = frozenset()  # `--only`: just these stages (STAGES)


QUICK = Sizes(
    records=5_000,
    peer=1_000,
    backlog=20_000,
    steady_seconds=5,
    steady_rate=2_000,
    prefill=100_000,
    pipeline=2_000,
    pipeline_slow=False,
)
FULL = Sizes(
    records=200_000,
    peer=5_000,
    backlog=1_000_000,
    steady_seconds=30,
    steady_rate=2_000,
    prefill=10_000_000,
    pipeline=60_000,  # as the black-box figures: enough for the raw producer to reach its pace
    pipeline_slow=True,
)


# The stages `--only` can pick: `consume` (the raw limits, the service twice, the latency), and the pipeline's
# (scripts/bench_pipeline.py).
STAGES = ("consume", "relay", "effects", "effects100", "pipeline", "steady")

# ------------------------------------------------------------------------------------------------ the data


@dataclass(frozen=True)
class Mix:
    """What the first n records of the data are made of."""

    orders: int
    duplicates: int
    invalid: int

    @staticmethod
    def of(n: int) -> Mix:
        """The mix of records 0 … n-1 (see `record_at`)."""
        blocks, rest = divmod(n, BLOCK)
        return Mix(
            orders=blocks * ORDERS_PER_BLOCK + min(rest, ORDERS_PER_BLOCK),
            duplicates=blocks + (rest > ORDERS_PER_BLOCK),
            invalid=blocks,
        )

    @property
    def unique(self) -> int:
        """Message ids that each get one inbox row: the orders and the invalid records."""
        return self.orders + self.invalid


def record_at(index: int) -> Record:
    """Record `index` of the data; deterministic, so a duplicate is an exact re-send of an earlier record."""
    block, slot = divmod(index, BLOCK)
    if slot < ORDERS_PER_BLOCK:
        return placed_order(block * ORDERS_PER_BLOCK + slot)
    if slot == ORDERS_PER_BLOCK:
        return placed_order(block * ORDERS_PER_BLOCK + block % ORDERS_PER_BLOCK)
    # No message-id header: the service identifies it by its coordinates (contract §5).
    return f"X-{block:08d}".encode(), b"\xff\xfe not json " + str(block).encode(), []


def placed_order(number: int, order_id: str | None = None) -> Record:
    """An `order.placed.v1` record with its producer's message id."""
    order_id = order_id or f"B-{number:08d}"
    document = {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": TENANTS[number % len(TENANTS)],
        "customer_id": f"c-{number % 1000}",
        "currency": "EUR",
        "items": [{"sku": f"sku-{number % 97}", "quantity": 1 + number % 3, "unit_price_cents": 1999}],
    }
    return order_id.encode(), json.dumps(document).encode(), [("message-id", f"{order_id}.1/order.placed".encode())]


# ------------------------------------------------------------------------------------------------ results


@dataclass
class Drain:
    """How long a system took to take a topic's records to a terminal state."""

    records: int
    seconds: float
    terminal: bool
    peak_rss_mb: float = 0.0

    @property
    def rps(self) -> float:
        """Records per second, start of the process(es) included."""
        return self.records / self.seconds


@dataclass
class Results:
    """Everything measured; `None` where a step did not run."""

    sizes: Sizes
    produce_rps: float | None = None
    raw_consume: Drain | None = None
    raw_db: Drain | None = None
    peer: Drain | None = None
    service: Drain | None = None
    service_2proc: Drain | None = None
    backlog: Drain | None = None
    latency_ms: tuple[float, float] | None = None
    latency_terminal: bool = False
    prefill_seconds: float | None = None
    big_inbox: Drain | None = None
    pipeline: PipelineResults | None = None
    error: str | None = None
    # Other work on the machine (the cluster and broker are shared) moves every figure: report it with them.
    load_at_start: float = field(default_factory=lambda: os.getloadavg()[0])
    # So does the broker's size: its heap holds every partition's state (docs/performance.md, "The machine").
    broker_partitions: int | None = None


class BenchError(Exception):
    """A step cannot go on (a process died, a command failed); the run reports what it has and exits 1."""


async def poll(check: Callable[[], Awaitable[bool]], within: float, interval: float | Callable[[], float]) -> bool:
    """Call `check` until it is true or `within` seconds passed; `interval` (or what it returns before each
    wait) bounds the error of a timing."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval() if callable(interval) else interval)
    return True


def interval_for(done: int, target: int) -> float:
    """Poll rarely while a drain is far from done (each poll runs on the same cores as the service), and every
    20 ms over its last stretch (about a second's worth of records), so that the poll adds little more than that
    to a timing."""
    left = target - done
    return 0.02 if left <= min(target // 10, 20_000) else max(0.05, min(0.5, left / 400_000))


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size so far (VmHWM); 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------------------------------------------ the bench


class Bench:
    """Owns what the run creates (topics, databases, processes) and measures one step at a time."""

    def __init__(self, admin_url: str, bootstrap: str, sizes: Sizes, keep: bool = False) -> None:
        self.stamp = time.strftime("%Y%m%d%H%M%S")
        self.keep = keep  # the databases and topics stay after the run
        self.server = admin_url.rsplit("/", 1)[0]  # postgresql://user@host:port
        self.admin_url = admin_url
        self.bootstrap = bootstrap
        self.sizes = sizes
        self.workdir = ROOT / ".local" / "bench" / self.stamp
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.topics: list[str] = []
        self.databases: list[str] = []
        self.processes: list[Process] = []
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    # -- set-up and clean-up

    async def start(self) -> None:
        """Connect the admin client and the offset probe."""
        await self.admin.start()
        await self.probe.start()

    async def close(self) -> None:
        """Stop every process this run started; drop its databases and topics unless `keep`."""
        for process in self.processes:
            await stop(process)
        await self.probe.stop()
        if not self.keep:
            if self.topics:
                await self.admin.delete_topics(self.topics)
            await self.drop_databases()
        await self.admin.close()

    async def drop_databases(self) -> None:
        """Drop the databases made so far (unless `keep`). Each step starts by dropping those of the steps before:
        left in place, their autovacuum (a 1,000,000-record backlog's, say) ran in the middle of later steps."""
        if self.keep or not self.databases:
            return
        admin = await asyncpg.connect(self.admin_url)
        try:
            for name in self.databases:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        self.databases.clear()

    async def broker_partitions(self) -> int | None:
        """How many partitions the broker holds (every topic's, Kafka's own included); None when it does not say."""
        try:
            topics = await self.admin.describe_topics()
        except KafkaError as error:
            console.print(f"[yellow]bench: the broker's partitions are not known ({type(error).__name__})[/yellow]")
            return None
        return sum(len(topic["partitions"]) for topic in topics)

    async def new_topic(self, what: str, *, derived: bool) -> str:
        """A fresh source topic, with the topics order-service derives from it when it will consume it."""
        topic = f"bench-{what}-{self.stamp}"
        names = [topic, *(f"{topic}.{suffix}" for suffix in DERIVED)] if derived else [topic]
        await self.admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
        self.topics += names
        return topic

    async def new_database(self, what: str) -> tuple[str, str]:
        """A fresh database migrated by `order-service migrate`, after dropping those of the steps before; returns
        its asyncpg DSN and SQLAlchemy URL."""
        await self.drop_databases()
        name = f"bench_{what}_{self.stamp}"
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        self.databases.append(name)
        dsn = f"{self.server}/{name}"
        url = "postgresql+asyncpg://" + dsn.removeprefix("postgresql://")
        with (self.workdir / "migrate.log").open("ab") as log:
            migrate = await asyncio.create_subprocess_exec(
                str(ORDER_SERVICE), "migrate", env=service_env(ORDERS_DATABASE_URL=url), stdout=log, stderr=log
            )
        if await migrate.wait() != 0:
            raise BenchError(f"order-service migrate failed on {name}")
        return dsn, url

    async def spawn(self, name: str, args: list[str], env: dict[str, str]) -> Process:
        """Start a process whose output goes to `<workdir>/<name>.log`."""
        with (self.workdir / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(*args, cwd=ROOT, env=env, stdout=log, stderr=log)
        self.processes.append(process)
        return process

    def consume(self, name: str, url: str, topic: str, consumer: str) -> Callable[[], Awaitable[Process]]:
        """How to start one `order-service consume` (the caller starts it when its clock runs)."""
        env = service_env(
            ORDERS_DATABASE_URL=url,
            ORDERS_KAFKA_BOOTSTRAP_SERVERS=self.bootstrap,
            ORDERS_SOURCE_TOPIC=topic,
            ORDERS_CONSUMER_NAME=consumer,
            ORDERS_METRICS_PORT="0",
        )
        return lambda: self.spawn(name, [str(ORDER_SERVICE), "consume"], env)

    # -- producing

    async def produce(self, topic: str, records: Iterable[Record]) -> tuple[int, float]:
        """Send as fast as the producer can (futures awaited in windows); return the count and seconds."""
        producer = self.producer()
        await producer.start()
        started = time.monotonic()
        sent = 0
        try:
            window: list[asyncio.Future[Any]] = []
            for key, value, headers in records:
                window.append(await producer.send(topic, value, key=key, headers=headers))
                sent += 1
                if len(window) >= 10_000:
                    await asyncio.gather(*window)
                    window.clear()
            await asyncio.gather(*window)
        finally:
            await producer.stop()
        return sent, time.monotonic() - started

    async def produce_steady(
        self, topic: str, count: int, rate: int, records: Callable[[int], Record] = record_at
    ) -> None:
        """Send `records(0)` … `records(count - 1)` at `rate` per second, in 10 ms ticks."""
        producer = self.producer()
        await producer.start()
        per_tick = max(1, rate // 100)
        started = time.monotonic()
        try:
            futures = []
            for tick, first in enumerate(range(0, count, per_tick)):
                # Pacing, not waiting for an outcome: the record timestamps must follow the chosen rate.
                await asyncio.sleep(max(0.0, started + tick * per_tick / rate - time.monotonic()))
                for index in range(first, min(first + per_tick, count)):
                    key, value, headers = records(index)
                    futures.append(await producer.send(topic, value, key=key, headers=headers))
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    def producer(self) -> AIOKafkaProducer:
        """An idempotent producer with large batches."""
        return AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, max_batch_size=512 * 1024)

    # -- measuring

    async def lag(self, group: str, topic: str) -> int:
        """Records of `topic` whose offsets the group has not committed: all of them while the broker cannot say
        yet (a fresh broker creates its offsets topic on the first request about a group, and answers that its
        coordinator is not available meanwhile)."""
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        try:
            committed = await self.admin.list_consumer_group_offsets(group, partitions=partitions)
        except KafkaError as error:
            if not error.retriable:
                raise
            committed = {}
        ends = await self.probe.end_offsets(partitions)
        done = {tp: max(meta.offset, 0) for tp, meta in committed.items()}
        return sum(ends[tp] - done.get(tp, 0) for tp in partitions)

    async def drain(
        self, dsn: str, topic: str, records: int, consumer: str, starts: list[Callable[[], Awaitable[Process]]]
    ) -> Drain:
        """Start the processes, and time them until every record of `topic` is terminal: committed offsets = end
        offsets (a member commits an offset only after its record's transaction), then inbox rows of `consumer` =
        unique message ids (duplicates add none).

        The poll asks Kafka, not the database: a `count(*)` of the inbox walks every row written so far, on the
        cores it measures (docs/performance.md, "What is measured").
        """
        target = Mix.of(records).unique
        connection = await asyncpg.connect(dsn)
        peak = 0.0
        try:
            started = time.monotonic()
            processes = [await start() for start in starts]

            lag = records

            async def committed() -> bool:
                nonlocal peak, lag
                for process in processes:
                    if process.returncode is not None:
                        raise BenchError(f"a process exited with {process.returncode}; see {self.workdir}")
                    peak = max(peak, peak_rss_mb(process.pid))
                lag = await self.lag(consumer, topic)
                return lag == 0

            timeout = STARTUP_ALLOWANCE + records / SLOWEST_RATE
            reached = await poll(committed, timeout, lambda: interval_for(records - lag, records))
            seconds = time.monotonic() - started

            async def all_in() -> bool:
                count = await connection.fetchval("SELECT count(*) FROM inbox WHERE consumer_name = $1", consumer)
                return bool(count == target)

            # Every offset committed, so every record is terminal: its inbox row (a duplicate's is its original's).
            terminal = reached and await poll(all_in, STARTUP_ALLOWANCE, 0.2)
            for process in processes:
                peak = max(peak, peak_rss_mb(process.pid))
                await stop(process)
        finally:
            await connection.close()
        return Drain(records, seconds, terminal, peak)

    async def raw_consume(self, topic: str, records: int) -> Drain:
        """The Kafka limit: read the topic with no processing (no group, nothing committed)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            read = 0
            started = time.monotonic()
            deadline = started + STARTUP_ALLOWANCE + records / SLOWEST_RATE
            while read < records and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
                read += sum(len(batch) for batch in batches.values())
            return Drain(records, time.monotonic() - started, read == records)
        finally:
            await consumer.stop()

    async def raw_db(self, topic: str, records: int, what: str = "raw") -> Drain:
        """The PostgreSQL limit: the service's rows for each record, 1,000 records per transaction."""
        dsn, _ = await self.new_database(what)
        connection = await asyncpg.connect(dsn)
        try:
            seconds = 0.0
            for first in range(0, records, RAW_BATCH):
                rows = RawRows.of(range(first, min(first + RAW_BATCH, records)), topic)
                # Only the transactions count: building the arrays is this script's work, not PostgreSQL's.
                started = time.monotonic()
                async with connection.transaction():
                    await rows.write(connection, "bench-raw")
                seconds += time.monotonic() - started
            count = await connection.fetchval("SELECT count(*) FROM inbox")
        finally:
            await connection.close()
        return Drain(records, seconds, count == Mix.of(records).unique)

    async def peer(self, topic: str, records: int, what: str = "peer") -> Drain:
        """The FastStream peer in its own process, on the first `records` records of the data."""
        dsn, url = await self.new_database(what)
        group = f"bench-{what}-{self.stamp}"
        args = [sys.executable, __file__, "peer", "--bootstrap", self.bootstrap, "--topic", topic]
        args += ["--group", group, "--database-url", url]
        return await self.drain(dsn, topic, records, group, [lambda: self.spawn("peer", args, service_env())])

    async def service(self, topic: str, records: int, what: str, processes: int = 1) -> Drain:
        """`order-service consume` (`processes` members of one group) on a fresh database."""
        dsn, url = await self.new_database(what)
        consumer = f"bench-{what}-{self.stamp}"
        starts = [self.consume(f"{what}-{n}", url, topic, consumer) for n in range(processes)]
        return await self.drain(dsn, topic, records, consumer, starts)

    async def latency(self) -> tuple[tuple[float, float], bool]:
        """p50 and p99 of inbox.processed_at − record timestamp, at a steady rate, with consume running."""
        sizes = self.sizes
        topic = await self.new_topic("lat", derived=True)
        dsn, url = await self.new_database("lat")
        consumer = f"bench-lat-{self.stamp}"
        # The bulk writes of the steps before leave dirty pages behind; flush them now so that their checkpoint
        # does not land in this step (the cluster's test databases force such checkpoints all the time anyway).
        await self.checkpoint()
        process = await self.consume("lat", url, topic, consumer)()
        connection = await asyncpg.connect(dsn)
        try:

            def count_at_least(target: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    if process.returncode is not None:
                        raise BenchError(f"consume exited with {process.returncode}; see {self.workdir}")
                    return bool(await connection.fetchval("SELECT count(*) FROM inbox") >= target)

                return check

            # One record first, so the group join and the first fetch are not counted as latency.
            await self.produce(topic, [placed_order(0, order_id="WARMUP")])
            if not await poll(count_at_least(1), STARTUP_ALLOWANCE, 0.05):
                raise BenchError(f"consume did not apply the warm-up record; see {self.workdir}")
            count = sizes.steady_rate * sizes.steady_seconds
            await self.produce_steady(topic, count, sizes.steady_rate)
            drained = await poll(count_at_least(1 + Mix.of(count).unique), STARTUP_ALLOWANCE, 0.2)
            p50, p99 = await connection.fetchrow(
                """
                SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
                FROM (SELECT extract(epoch FROM processed_at - received_at) * 1000 AS ms
                      FROM inbox WHERE message_id <> 'WARMUP.1/order.placed') AS latencies
                """
            )
        finally:
            await connection.close()
            await stop(process)
        return (float(p50), float(p99)), drained

    async def checkpoint(self) -> None:
        """Flush the cluster's dirty pages (CHECKPOINT changes no data)."""
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute("CHECKPOINT")
        finally:
            await admin.close()

    async def big_inbox(self, topic: str, records: int) -> tuple[float, Drain]:
        """The service on a database whose inbox already holds `sizes.prefill` rows of another consumer."""
        dsn, url = await self.new_database("big")
        connection = await asyncpg.connect(dsn)
        try:
            started = time.monotonic()
            await connection.execute(PREFILL, self.sizes.prefill)
            await connection.execute("VACUUM ANALYZE inbox")
            prefill_seconds = time.monotonic() - started
        finally:
            await connection.close()
        # Like service_rps, the better of two runs: the second on a copy of the prefilled database.
        name = dsn.rsplit("/", 1)[1]
        copy = f"bench_big2_{self.stamp}"
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
        finally:
            await admin.close()
        self.databases.append(copy)
        runs = []
        for what, database in (("big", name), ("big2", copy)):
            await self.checkpoint()
            consumer = f"bench-{what}-{self.stamp}"
            database_dsn, database_url = dsn.replace(name, database), url.replace(name, database)
            start = self.consume(what, database_url, topic, consumer)
            runs.append(await self.drain(database_dsn, topic, records, consumer, [start]))
        return prefill_seconds, best(*runs)


PREFILL = """
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                       aggregate_id, received_at, processed_at)
    SELECT 'bench-prefill', 'P-' || lpad(n::text, 9, '0') || '.1/order.placed', 'processed', 'bench-prefill',
           n % 3, n / 3, 'P-' || lpad(n::text, 9, '0'), now() - interval '1 day', now() - interval '1 day'
    FROM generate_series(1, $1::bigint) AS n
"""


@dataclass
class RawRows:
    """The rows order-service writes for a batch of records, as column arrays for `unnest`."""

    topic: str
    inbox: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(7)])
    orders: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(7)])
    effects: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(4)])
    outbox: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(4)])
    quarantine: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(8)])

    @staticmethod
    def of(indices: range, topic: str) -> RawRows:
        """A new order: inbox + order + payment.capture effect + order.accepted event; an invalid record:
        inbox (quarantined) + quarantine row (and the two timeline events its trigger appends) + envelope; a
        duplicate: nothing (its original is in the same block of 20, so in the same batch: the rows are the ones
        that persist, written by plain inserts, as order-service writes them but for the quarantine row, which it
        inserts `ON CONFLICT DO NOTHING`)."""
        rows = RawRows(topic)
        now = datetime.now(UTC)
        for index in indices:
            key, value, headers = record_at(index)
            # Coordinates as the topic would give them; PostgreSQL's work does not depend on their values.
            partition, offset = index % PARTITIONS, index // PARTITIONS
            if not headers:
                rows.add_invalid(
                    SourceRecord(topic, partition, offset, int(now.timestamp() * 1000), key, value, ()), now
                )
                continue
            if index % BLOCK == ORDERS_PER_BLOCK:
                continue
            message_id = headers[0][1].decode()
            append(rows.inbox, message_id, "processed", partition, offset, key.decode(), None, now)
            rows.add_order(value, message_id)
        return rows

    def add_invalid(self, record: SourceRecord, now: datetime) -> None:
        """A quarantined record's inbox row, its quarantine row (envelope and original bytes) and its envelope
        on the quarantine topic, as the service builds them."""
        code = ErrorCode.MALFORMED_PAYLOAD
        envelope = failure_envelope(
            record,
            record.coordinates,
            consumer="bench-raw",
            history=AttemptHistory.first(now),
            code=code,
            payload_schema=None,
        )
        document = json.dumps(envelope.document)
        message_id, key = record.message_id, record.key_text
        append(self.inbox, message_id, "quarantined", record.partition, record.offset, None, code.value, now)
        append(
            self.quarantine,
            envelope.failure_id,
            code.value,
            owner_for(code, DOMAIN.owners),
            key,
            document,
            record.value,
            now,
            now,
        )
        append(self.outbox, f"{self.topic}.quarantine", key, json.dumps(envelope.headers()), document.encode())

    def add_order(self, value: bytes, message_id: str) -> None:
        """A new order's row, its capture effect and its order.accepted event, as the service's own rule and
        documents make them (before run BF the event had four of its eight fields, and no `event-type` header)."""
        message = decode_order(value)
        assert not isinstance(message, DecodeFailure), message
        applied = order_rules.apply(message, None, order_rules.Context(frozenset(TENANTS)))
        assert isinstance(applied, order_rules.Applied), applied
        order, (capture,), (accepted,) = applied.aggregate, applied.effects, applied.events
        append(
            self.orders,
            order.order_id,
            order.tenant,
            order.customer_id,
            order.status.value,
            order.amount_cents,
            order.currency,
            order.sequence,
        )
        append(self.effects, capture.idempotency_key, capture.aggregate_id, capture.kind, json.dumps(capture.payload))
        headers = event_headers(message_id, accepted.type, None)
        document = orjson.dumps(event_document(accepted, order.version, message_id))
        append(self.outbox, f"{self.topic}.events", order.order_id, json.dumps(headers), document)

    async def write(self, connection: asyncpg.Connection, consumer: str) -> None:
        """Five statements, whatever the batch size."""
        await connection.execute(RAW_INBOX, consumer, self.topic, *self.inbox)
        await connection.execute(RAW_QUARANTINE, consumer, *self.quarantine)
        await connection.execute(RAW_ORDERS, *self.orders)
        await connection.execute(RAW_EFFECTS, *self.effects)
        await connection.execute(RAW_OUTBOX, *self.outbox)


def append(columns: list[list[Any]], *values: Any) -> None:
    """Append one row to column arrays."""
    for column, value in zip(columns, values, strict=True):
        column.append(value)


RAW_INBOX = """
    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition, source_offset,
                       aggregate_id, error_code, received_at)
    SELECT $1, m, s, $2, p, o, i, e, r
    FROM unnest($3::text[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[], $9::timestamptz[])
         AS v(m, s, p, o, i, e, r)
"""
# Its trigger (migration 0009) appends the record's first timeline events, as it does for the service's rows.
RAW_QUARANTINE = """
    INSERT INTO quarantine (consumer_name, failure_id, message_id, error_code, owner, ordering_key, envelope, payload,
                            attempts, first_failed_at, last_failed_at)
    SELECT $1, f, f, c, o, k, e::jsonb, p, 1, t, l
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::timestamptz[],
                $9::timestamptz[]) AS v(f, c, o, k, e, p, t, l)
"""
RAW_ORDERS = """
    INSERT INTO orders (order_id, tenant, customer_id, status, amount_cents, currency, sequence)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[])
"""
RAW_EFFECTS = """
    INSERT INTO effects (idempotency_key, aggregate_id, kind, payload)
    SELECT k, o, c, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS v(k, o, c, p)
"""
RAW_OUTBOX = """
    INSERT INTO outbox (topic, key, headers, payload)
    SELECT t, k, h::jsonb, p FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) AS v(t, k, h, p)
"""


def service_env(**orders: str) -> dict[str, str]:
    """The environment for a child: ours without any ORDERS_ variable, plus the given ones; a BENCH_ORDERS_X of
    ours is the child's ORDERS_X (to compare settings in alternating runs)."""
    chosen = {k.removeprefix("BENCH_"): v for k, v in os.environ.items() if k.startswith("BENCH_ORDERS_")}
    return {k: v for k, v in os.environ.items() if not k.startswith(("ORDERS_", "BENCH_ORDERS_"))} | chosen | orders


async def stop(process: Process) -> None:
    """SIGTERM, then SIGKILL after a grace period."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE)
    except TimeoutError:
        process.kill()
        await process.wait()


# ------------------------------------------------------------------------------------------------ the peer


class PeerItem(BaseModel):
    """An order line, as the peer team would model it."""

    sku: str
    quantity: int = Field(gt=0)
    unit_price_cents: int = Field(ge=0)


class PeerOrderPlaced(BaseModel):
    """`order.placed.v1`, as the peer team would model it."""

    order_id: str
    tenant: str
    customer_id: str
    currency: str
    items: list[PeerItem] = Field(min_length=1)


async def peer_handle(sessions: async_sessionmaker[AsyncSession], consumer: str, record: ConsumerRecord) -> None:
    """One message, one session, one transaction: the inbox row, then the order if the row is new.

    Bytes that do not validate are terminal too: an inbox row `quarantined`, nothing else.
    """
    headers = {name: value.decode() for name, value in record.headers}
    message_id = headers.get("message-id") or f"{record.topic}/{record.partition}/{record.offset}"
    try:
        order: PeerOrderPlaced | None = PeerOrderPlaced.model_validate_json(record.value or b"")
    except ValidationError:
        order = None
    row = {
        "consumer_name": consumer,
        "message_id": message_id,
        "status": "processed" if order else "quarantined",
        "source_topic": record.topic,
        "source_partition": record.partition,
        "source_offset": record.offset,
        "aggregate_id": order.order_id if order else None,
        "error_code": None if order else "MALFORMED_PAYLOAD",
        "received_at": datetime.fromtimestamp(record.timestamp / 1000, UTC),
    }
    async with sessions() as session:
        new = await session.execute(insert(inbox).values(row).on_conflict_do_nothing().returning(inbox.c.message_id))
        if order is not None and new.first() is not None:
            upsert = insert(orders).values(
                order_id=order.order_id,
                tenant=order.tenant,
                customer_id=order.customer_id,
                status="placed",
                amount_cents=sum(item.quantity * item.unit_price_cents for item in order.items),
                currency=order.currency,
                sequence=1,
            )
            set_ = {"status": upsert.excluded.status, "updated_at": func.now()}
            await session.execute(upsert.on_conflict_do_update(index_elements=[orders.c.order_id], set_=set_))
        await session.commit()


async def run_peer(bootstrap: str, topic: str, group: str, database_url: str) -> None:
    """The FastStream subscriber, until SIGTERM; the broker commits each message after its handler."""
    engine = create_async_engine(database_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    # FastStream logs two lines per message by default; off, so that the peer is measured at its best.
    broker = KafkaBroker(bootstrap, logger=None)

    @broker.subscriber(topic, group_id=group, auto_offset_reset="earliest", ack_policy=AckPolicy.ACK)
    async def handle(message: KafkaMessage) -> None:
        await peer_handle(sessions, group, message.raw_message)

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await broker.start()
    try:
        await stopping.wait()
    finally:
        await broker.stop()
        await engine.dispose()


# ------------------------------------------------------------------------------------------------ the run


async def measure(bench: Bench, results: Results) -> None:
    """Every step, in order, on the same data (with `--only`, just those pipeline stages)."""
    sizes = bench.sizes
    if sizes.only:
        if "consume" in sizes.only:
            await consume_steps(bench, results, peer=False)
            await latency_step(bench, results)
        await pipeline_stages(bench, results)
        return
    source = await consume_steps(bench, results, peer=True)
    results.service_2proc = await bench.service(source, sizes.records, "svc2", processes=2)
    progress("order-service consume, 2 processes", results.service_2proc.rps)
    await latency_step(bench, results)
    backlog = await bench.new_topic("backlog", derived=True)
    await bench.produce(backlog, map(record_at, range(sizes.backlog)))
    results.backlog = await bench.service(backlog, sizes.backlog, "rss")
    progress(f"drained a {sizes.backlog:,} backlog, peak RSS {results.backlog.peak_rss_mb:.0f} MB", results.backlog.rps)
    results.prefill_seconds, results.big_inbox = await bench.big_inbox(source, sizes.records)
    progress(f"with {sizes.prefill:,} inbox rows (prefilled in {results.prefill_seconds:.0f} s)", results.big_inbox.rps)
    await pipeline_stages(bench, results)


async def consume_steps(bench: Bench, results: Results, *, peer: bool) -> str:
    """The raw limits and `consume` on the same records, and the peer when asked; return the source topic."""
    sizes = bench.sizes
    source = await bench.new_topic("src", derived=True)
    sent, seconds = await bench.produce(source, map(record_at, range(sizes.records)))
    results.produce_rps = sent / seconds
    progress(f"produced {sent:,} records to {source}", sent / seconds)
    results.raw_consume = await bench.raw_consume(source, sizes.records)
    progress("raw aiokafka consume", results.raw_consume.rps)
    # The raw write, the peer and the service each run twice, in turn (raw, peer, svc, raw, peer, svc), and the
    # better run of each counts: on a shared machine a run can be slowed by 20 % by whatever else runs at that
    # moment, and conditions drift over a stage, for all three alike. Each run starts after a CHECKPOINT, so that
    # no run pays for flushing the pages the runs before it dirtied.
    runs: dict[str, list[Drain]] = {"raw": [], "peer": [], "svc": []}
    sample = await bench.new_topic("peer", derived=False) if peer else None
    if sample is not None:
        await bench.produce(sample, map(record_at, range(sizes.peer)))
    for suffix in ("", "b"):
        await bench.checkpoint()
        runs["raw"].append(await bench.raw_db(source, sizes.records, f"raw{suffix}"))
        results.raw_db = best(*runs["raw"])  # set already, should a service run fail
        progress("raw asyncpg write", runs["raw"][-1].rps)
        if sample is not None:
            await bench.checkpoint()
            runs["peer"].append(await bench.peer(sample, sizes.peer, f"peer{suffix}"))
            progress(f"FastStream peer on the first {sizes.peer:,} records", runs["peer"][-1].rps)
        await bench.checkpoint()
        runs["svc"].append(await bench.service(source, sizes.records, f"svc{suffix}"))
        progress("order-service consume, 1 process", runs["svc"][-1].rps)
    progress("raw asyncpg write (best of two)", best(*runs["raw"]).rps)
    if sample is not None:
        results.peer = best(*runs["peer"])
        progress(f"FastStream peer on the first {sizes.peer:,} records (best of two)", results.peer.rps)
    results.service = best(*runs["svc"])
    progress("order-service consume, 1 process (best of two)", results.service.rps)
    await bench.checkpoint()
    return source


async def latency_step(bench: Bench, results: Results) -> None:
    """p50 and p99 of `consume` at a steady rate."""
    results.latency_ms, results.latency_terminal = await bench.latency()
    progress(
        f"latency at {bench.sizes.steady_rate:,}/s: p50 {results.latency_ms[0]:.0f} ms, "
        f"p99 {results.latency_ms[1]:.0f} ms"
    )


async def pipeline_stages(bench: Bench, results: Results) -> None:
    """What follows the consumer: the relay, the effect workers, the whole pipeline (scripts/bench_pipeline.py)."""
    # Imported here, not at the top: bench_pipeline imports this module.
    from bench_pipeline import PipelineResults, measure_pipeline

    results.pipeline = PipelineResults(slow_stages=bench.sizes.pipeline_slow, only=bench.sizes.only)
    await measure_pipeline(bench, results.pipeline)


def best(*runs: Drain) -> Drain:
    """The fastest of several runs of one system; terminal only if all were."""
    return replace(max(runs, key=lambda run: run.rps), terminal=all(run.terminal for run in runs))


def progress(what: str, rps: float | None = None) -> None:
    """One line on stderr as each step ends."""
    console.print(f"[bold]{what}[/bold]" + (f": {rps:,.0f} records/s" if rps is not None else ""))


async def run(admin_url: str, bootstrap: str, sizes: Sizes, keep: bool) -> Results:
    """Measure, then clean up whatever happened."""
    bench = Bench(admin_url, bootstrap, sizes, keep)
    results = Results(sizes)
    console.print(f"bench {bench.stamp}: logs in {bench.workdir}")
    await bench.start()
    try:
        results.broker_partitions = await bench.broker_partitions()
        console.print(f"partitions on the broker at the start: {results.broker_partitions}")
        if results.broker_partitions is not None and results.broker_partitions > MANY_PARTITIONS:
            console.print(
                f"[yellow]bench: more than {MANY_PARTITIONS:,} partitions on the broker: its collections may slow"
                " every step (scripts/kafka-local reset empties a local broker)[/yellow]"
            )
        await measure(bench, results)
    except BenchError as error:
        results.error = str(error)
        console.print(f"[red]bench: {error}[/red]")
    finally:
        await bench.close()
    return results


def summary(results: Results) -> dict[str, Any]:
    """The figures of the JSON line."""
    r = results

    def rps(drain: Drain | None) -> float | None:
        return round(drain.rps, 1) if drain else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    from bench_pipeline import figures as pipeline_figures

    pipeline = pipeline_figures(r.pipeline)
    limit = min(r.raw_consume.rps, r.raw_db.rps) if r.raw_consume and r.raw_db else None
    drains = [r.raw_consume, r.raw_db, r.peer, r.service, r.service_2proc, r.backlog, r.big_inbox]
    service = rps(r.service)
    return {
        "raw_consume_rps": rps(r.raw_consume),
        "raw_db_rps": rps(r.raw_db),
        "peer_rps": rps(r.peer),
        "service_rps": service,
        "service_2proc_rps": rps(r.service_2proc),
        "service_vs_peer": ratio(service, rps(r.peer)),
        "service_vs_limit": ratio(service, limit),
        "peak_rss_mb": round(r.backlog.peak_rss_mb, 1) if r.backlog else None,
        "p50_ms": round(r.latency_ms[0], 1) if r.latency_ms else None,
        "p99_ms": round(r.latency_ms[1], 1) if r.latency_ms else None,
        "inbox_10m_ratio": ratio(rps(r.big_inbox), service),
        "records": r.sizes.records,
        "all_terminal": r.error is None
        and (
            all(d.terminal for d in drains if d is not None) and (r.latency_terminal or r.latency_ms is None)
            if r.sizes.only
            else r.latency_terminal and all(d is not None and d.terminal for d in drains)
        )
        and pipeline["pipeline_all_done"],
        "produce_rps": round(r.produce_rps, 1) if r.produce_rps else None,
        "peer_records": r.sizes.peer,
        "backlog_records": r.sizes.backlog,
        "backlog_rps": rps(r.backlog),
        "steady_rate": r.sizes.steady_rate,
        "steady_seconds": r.sizes.steady_seconds,
        "prefill_rows": r.sizes.prefill,
        "prefill_seconds": round(r.prefill_seconds, 1) if r.prefill_seconds is not None else None,
        "service_big_inbox_rps": rps(r.big_inbox),
        "load_1m_at_start": round(r.load_at_start, 2),
        "broker_partitions_at_start": r.broker_partitions,
        **pipeline,
        "error": r.error,
    }


def report(results: Results, figures: dict[str, Any]) -> None:
    """The table on stdout, then the JSON line, last."""
    table = Table(title=f"order-service bench ({results.sizes.records:,} records)")
    table.add_column("what")
    for column in ("records", "seconds", "records/s"):
        table.add_column(column, justify="right")
    table.add_column("terminal")
    rows = [
        ("limit: raw aiokafka consume", results.raw_consume),
        ("limit: raw asyncpg write", results.raw_db),
        ("peer: FastStream + SQLAlchemy", results.peer),
        ("order-service, 1 process", results.service),
        ("order-service, 2 processes", results.service_2proc),
        ("order-service, backlog (RSS)", results.backlog),
        (f"order-service, {results.sizes.prefill:,} in inbox", results.big_inbox),
    ]
    for label, drain in rows:
        if drain is None:
            table.add_row(label, "-", "-", "-", "not run")
            continue
        ok = "yes" if drain.terminal else "[red]NO[/red]"
        table.add_row(label, f"{drain.records:,}", f"{drain.seconds:.1f}", f"{drain.rps:,.0f}", ok)
    Console().print(table)
    names = ("service_vs_peer", "service_vs_limit", "peak_rss_mb", "p50_ms", "p99_ms", "inbox_10m_ratio")
    pipeline = ("relay_vs_raw_produce", "effects_per_worker_rps", "effects_per_worker_rps_100ms", "pipeline_rps")
    for name in (*names, *pipeline, "p99_to_captured_ms"):
        print(f"{name}: {figures[name]}")
    print(json.dumps(figures))


def arguments(argv: list[str]) -> argparse.Namespace:
    """The command line of the bench, and of its peer subprocess (`peer …`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser("run", help="the whole benchmark (the default)")
    bench.add_argument("--admin-url", required=True, help="libpq URL of the cluster's postgres database")
    bench.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    bench.add_argument("--quick", action="store_true", help="small sizes; finishes in under two minutes")
    bench.add_argument("--records", type=int, help="N, the records of the source topic")
    bench.add_argument("--keep", action="store_true", help="keep the databases and topics it created")
    bench.add_argument(
        "--only",
        help=f"only these stages, comma-separated ({','.join(STAGES)})",
    )
    bench.add_argument("--orders", type=int, help="the orders of each pipeline stage")
    bench.add_argument("--steady-rate", type=int, help="records (orders) per second of the steady-rate steps")
    peer = sub.add_parser("peer", help="(internal) the FastStream peer")
    for name in ("--bootstrap", "--topic", "--group", "--database-url"):
        peer.add_argument(name, required=True)
    return parser.parse_args(argv if argv[:1] in (["run"], ["peer"], ["-h"], ["--help"]) else ["run", *argv])


def main() -> int:
    """Run the bench (or its peer); exit 0 only when every record of every system was terminal."""
    args = arguments(sys.argv[1:])
    if args.command == "peer":
        asyncio.run(run_peer(args.bootstrap, args.topic, args.group, args.database_url))
        return 0
    sizes = QUICK if args.quick else FULL
    if args.records:
        sizes = replace(
            sizes, records=args.records, peer=min(sizes.peer, args.records), pipeline=min(sizes.pipeline, args.records)
        )
    if args.orders:
        sizes = replace(sizes, pipeline=args.orders)
    if args.steady_rate:
        sizes = replace(sizes, steady_rate=args.steady_rate)
    if args.only:
        only = frozenset(args.only.split(","))
        if not only <= set(STAGES):
            raise SystemExit(f"bench: --only takes {', '.join(STAGES)}; got {args.only}")
        sizes = replace(sizes, only=only)
    results = asyncio.run(run(args.admin_url, args.bootstrap, sizes, args.keep))
    figures = summary(results)
    report(results, figures)
    return 0 if figures["all_terminal"] else 1


if __name__ == "__main__":
    # scripts/bench_pipeline.py imports this module as `bench`: the same module, not a second copy of it.
    sys.modules["bench"] = sys.modules[__name__]
    sys.exit(main())
