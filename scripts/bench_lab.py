"""What scripts/bench.py and scripts/bench_pipeline.py share: the sizes, the `Bench` that owns the run's topics,
databases and processes and measures one step at a time, and the helpers to poll, spawn and stop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from bench_data import PARTITIONS, Mix, RawRows, Record, placed_order, record_at
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
ORDER_SERVICE = Path(sys.executable).parent / "order-service"
console = Console(stderr=True)
Process = asyncio.subprocess.Process

# The service subscribes to these besides its source topic (default retry tiers 30s,5m); they must exist.
DERIVED = ("quarantine", "events", "rejected", "reprocess", "retry.30s", "retry.5m")
RAW_BATCH = 1_000
# A drain that has not finished by STARTUP_ALLOWANCE + records / SLOWEST_RATE seconds counts as not terminal.
STARTUP_ALLOWANCE = 60.0
SLOWEST_RATE = 100.0
STOP_GRACE = 30.0


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
        args = [
            sys.executable,
            str(Path(__file__).with_name("bench.py")),
            "peer",
            "--bootstrap",
            self.bootstrap,
            "--topic",
            topic,
        ]
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


def best(*runs: Drain) -> Drain:
    """The fastest of several runs of one system; terminal only if all were."""
    return replace(max(runs, key=lambda run: run.rps), terminal=all(run.terminal for run in runs))


def progress(what: str, rps: float | None = None) -> None:
    """One line on stderr as each step ends."""
    console.print(f"[bold]{what}[/bold]" + (f": {rps:,.0f} records/s" if rps is not None else ""))
