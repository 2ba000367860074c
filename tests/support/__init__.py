"""Helpers for integration tests: produce and read topics, run the service in-process or as a process,
and poll for a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.config import Settings
from service.containers import Container
from service.orders.domain import DOMAIN
from service.orders.settings import OrderSettings
from service.policy.records import SourceRecord
from service.store import quarantine

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass(frozen=True)
class Topics:
    """A test's topic names, derived like the service derives them."""

    source: str

    @property
    def quarantine(self) -> str:
        return f"{self.source}.quarantine"

    @property
    def events(self) -> str:
        return f"{self.source}.events"

    @property
    def rejected(self) -> str:
        return f"{self.source}.rejected"

    @property
    def reprocess(self) -> str:
        return f"{self.source}.reprocess"

    def retry(self, label: str) -> str:
        return f"{self.source}.retry.{label}"

    def owns(self, topic: str) -> bool:
        """Whether `topic` is this test's: its source, or a topic named `<source>.<suffix>`."""
        return topic == self.source or topic.startswith(f"{self.source}.")

    def all(self) -> list[str]:
        """Every topic a test may touch; the retry tiers tests use are 1s, 2s and 3s. The service's processes wait at
        start-up until the topics they read and write exist (contract §11), so each tier a test configures is here."""
        return [
            self.source,
            self.quarantine,
            self.events,
            self.rejected,
            self.reprocess,
            self.retry("1s"),
            self.retry("2s"),
            self.retry("3s"),
        ]


def make_engine(url: str) -> AsyncEngine:
    return create_async_engine(url, pool_size=2, max_overflow=2)


def kafka_reachable(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


async def create_topics(bootstrap: str, topics: Topics, source_partitions: int = 3) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        new = [NewTopic(topics.source, source_partitions, 1)]
        new += [NewTopic(name, 1, 1) for name in topics.all()[1:]]
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(new)
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, topics: Topics) -> None:
    """Delete a test's topics: its source and every `<source>.<suffix>` (those it made by writing to them too).
    A deletion the broker refuses raises; a topic gone meanwhile is no error."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if topics.owns(name)]
        if not names:
            return
        response = await admin.delete_topics(names)
    finally:
        await admin.close()
    gone = UnknownTopicOrPartitionError.errno  # deleted meanwhile
    refused = [(name, code) for name, code in response.topic_error_codes if code not in (0, gone)]
    if refused:
        raise AssertionError(f"the broker did not delete these topics (name, error code): {refused}")


def settings_for(database_url: str, bootstrap: str, topics: Topics, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap_servers": bootstrap,
        "source_topic": topics.source,
        "consumer_name": f"{topics.source}-consumer",
        "metrics_port": 0,
        "max_attempts": 4,
        "retry_tiers": "",
        "max_elapsed": "20s",
    }
    values.update(overrides)
    return OrderSettings(**values)


def env_for(settings: Settings) -> dict[str, str]:
    """The environment that configures a service process like `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, tuple | list):
            value = ",".join(value)
        elif isinstance(value, timedelta):
            value = f"{value.total_seconds()}s"
        env[f"ORDERS_{name.upper()}"] = str(value)
    return env


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[str | None, bytes | dict[str, Any] | None, dict[str, str]]],
    partition: int | None = None,
) -> None:
    """Produce (key, value, headers) records; dict values are JSON-encoded."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for key, value, headers in records:
            body = json.dumps(value).encode() if isinstance(value, dict) else value
            await producer.send_and_wait(
                topic,
                body,
                key=key.encode() if key is not None else None,
                headers=[(name, item.encode()) for name, item in headers.items()],
                partition=partition,
            )
    finally:
        await producer.stop()


async def produce_raw(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes]]]],
    partition: int | None = None,
) -> None:
    """Produce (key, value, headers) records exactly as these bytes, as a producer in another language could."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, value, key=key, headers=list(headers), partition=partition)
            for key, value, headers in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


class _RawName(str):
    """A header name that encodes to exactly these bytes (which need not be UTF-8)."""

    raw: bytes

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


async def produce_raw_names(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes, bytes, Sequence[tuple[bytes, bytes]]]],
    partition: int,
    *,
    batch_each: bool = False,
) -> list[int]:
    """Produce records whose header NAMES are raw bytes (the Kafka protocol allows any bytes; Java and librdkafka
    producers can send them; aiokafka only sends text), in one batch or (`batch_each`) one batch per record;
    return their offsets. The pure-Python batch builder is swapped in for this one producer, then put back."""
    import aiokafka.producer.message_accumulator as accumulator
    import aiokafka.producer.producer as producing
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

    saved = accumulator.DefaultRecordBatchBuilder, producing.DefaultRecordBatchBuilder
    accumulator.DefaultRecordBatchBuilder = producing.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200)
    try:
        await producer.start()
        sent = []
        for key, value, headers in records:
            named = []
            for raw, item in headers:
                name = _RawName(raw.decode("latin-1"))
                name.raw = raw
                named.append((name, item))
            sent.append(await producer.send(topic, value, key=key, headers=named, partition=partition))
            if batch_each:
                await sent[-1]
        return [meta.offset for meta in await asyncio.gather(*sent)]
    finally:
        await producer.stop()
        accumulator.DefaultRecordBatchBuilder, producing.DefaultRecordBatchBuilder = saved


async def read_topic(bootstrap: str, topic: str, *, expect: int, timeout: float = 30.0) -> list[Any]:
    """Read a topic from the beginning until `expect` records arrived (or the deadline), then a little
    longer to catch extra ones; return all records read."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(await _partitions(consumer, topic))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(records) < expect:
            batch = await consumer.getmany(timeout_ms=200)
            records += [record for part in batch.values() for record in part]
        # Anything published beyond `expect` (a duplicate) must show up too: drain what is there now.
        end = await consumer.end_offsets(partitions)
        while [tp for tp in partitions if await consumer.position(tp) < end[tp]]:
            batch = await consumer.getmany(timeout_ms=200)
            records += [record for part in batch.values() for record in part]
        return records
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = consumer.partitions_for_topic(topic)
        if found:
            return set(found)
        await consumer._client.force_metadata_update()  # aiokafka has no public metadata refresh
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} has no partitions")


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll a condition until it holds or the deadline passes (instead of sleeping a guessed amount)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def eventually(check: Callable[[], Awaitable[T]], *, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll `check` until it returns a truthy value, or fail at the deadline with its last value."""
    deadline = time.monotonic() + timeout
    value = await check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        await asyncio.sleep(interval)
        value = await check()
    return value


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(text(sql), params)).scalar()


async def rows(engine: AsyncEngine, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        return [dict(row._mapping) for row in await connection.execute(text(sql), params)]


@contextlib.asynccontextmanager
async def running(
    settings: Settings, *parts: str, configure: Callable[[Container], object] | None = None
) -> AsyncIterator[Container]:
    """Run service loops in this process (e.g. "consumer_loop", "relay") until the block exits; `configure` may
    override the container's providers first."""
    container = Container(settings=settings, domain=DOMAIN)
    if configure is not None:
        configure(container)
    await container.init_resources()
    stop = asyncio.Event()
    loops = []
    for part in parts:
        provided = getattr(container, part)()
        loops.append(await provided if asyncio.isfuture(provided) or asyncio.iscoroutine(provided) else provided)
    tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
    try:
        yield container
    finally:
        stop.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await container.shutdown_resources()
        for result in results:
            if isinstance(result, BaseException):
                raise result


class ServiceProcess:
    """`python -m service <command>` as a child process, with its log captured to a file."""

    def __init__(self, command: str, settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None):
        env = env_for(settings) | (extra_env or {})
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", command], cwd=ROOT, env=env, stdout=self._log, stderr=self._log
        )

    @classmethod
    def with_env(cls, command: str, env: dict[str, str], log_path: Path) -> ServiceProcess:
        """The command with exactly this environment (secured settings, secrets in files)."""
        process = cls.__new__(cls)
        process.log_path = log_path
        process._log = log_path.open("ab")
        process.process = subprocess.Popen(
            [sys.executable, "-m", "service", command], cwd=ROOT, env=env, stdout=process._log, stderr=process._log
        )
        return process

    def terminate(self, timeout: float = 30.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        self._log.close()
        return code

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        self._log.close()

    def wait(self, timeout: float = 60.0) -> int:
        """Its exit code; one still running at the deadline is killed (so that it does not outlive the test and
        make the topics the test's fixture deletes again), and the test fails on the timeout."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._log.close()
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def quarantine_directly(settings: Settings, records: list[SourceRecord]) -> None:
    """Write quarantine envelopes to the outbox through the processor alone (no Kafka involved)."""
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        processor = await container.processor()
        pending = [processor.pending(record) for record in records]
        left = await processor.attempt(pending, asyncio.Event())
        assert left == set(pending), "every record is invalid input: quarantined in one round"
    finally:
        await container.shutdown_resources()


@dataclass(frozen=True)
class Finished:
    """A finished CLI process."""

    returncode: int
    stdout: str
    stderr: str


async def cli(settings: Settings, *args: str, check: bool = True, extra_env: dict[str, str] | None = None) -> Finished:
    """Run the CLI as a process without blocking this event loop (the service runs in it meanwhile)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        *args,
        cwd=ROOT,
        env=env_for(settings) | (extra_env or {}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    result = Finished(process.returncode or 0, out.decode(), err.decode())
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


async def committed(bootstrap: str, group: str, topic: str, partition: int, offset: int) -> bool:
    """True when the group's committed offset of the partition reached `offset`."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    found = offsets.get(TopicPartition(topic, partition))
    return found is not None and found.offset >= offset


def order_service(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a process with only `env` of the ORDERS_ variables (none of the caller's)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "service", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


async def quarantine_as(engine: AsyncEngine, consumer: str, records: Sequence[quarantine.QuarantineRow]) -> None:
    """Quarantine records under a consumer name as its round does: the consumer's own quarantine statement, and an
    inbox row that says `quarantined` (no Kafka involved, and no downstream to fail)."""
    async with engine.begin() as connection:
        encoded = quarantine.COLUMNS.encode(records)
        await connection.execute(text(quarantine.ADD_ROWS), {"consumer": consumer, "quarantine_rows": encoded})
        for row in records:
            topic, partition, offset = row.failure_id.rsplit("/", 2)
            await connection.execute(
                text(
                    """
                    INSERT INTO inbox (consumer_name, message_id, status, source_topic, source_partition,
                                       source_offset, aggregate_id, error_code, received_at)
                    VALUES (:consumer, :message_id, 'quarantined', :topic, :partition, :offset, :key, :code, now())
                    """
                ),
                {
                    "consumer": consumer,
                    "message_id": row.message_id,
                    "topic": topic,
                    "partition": int(partition),
                    "offset": int(offset),
                    "key": row.ordering_key,
                    "code": row.error_code,
                },
            )
