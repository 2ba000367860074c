"""The one place that assembles the service: a domain and its settings in, ready-to-run loops out. Nothing at
import time: the entry point hands the `Domain` (service/ports.py) to the container it builds."""

from __future__ import annotations

import asyncio
import functools
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from dependency_injector import containers, providers
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from service import explain
from service.adapters import kafka, topics
from service.adapters.breakers import Breakers
from service.adapters.http import HttpClient
from service.config import Settings
from service.health import HealthServer
from service.metrics import Metrics
from service.policy.effects import EffectPolicy
from service.policy.owners import Owners, parse_owners
from service.policy.retry import RetryPolicy
from service.ports import Domain, EffectRegistry, Handler, Plumbing
from service.store.retention import Retention
from service.store.uow import create_engine, ping
from service.tracing import Tracing, wanted
from service.worker.consumer import CONTEXT_LOOKUPS, ConsumerLoop, KafkaDiagnosis
from service.worker.downtime import Downtime
from service.worker.effects import EffectWorker, call_budget
from service.worker.gauges import GaugeRefresher
from service.worker.heartbeat import Heartbeat
from service.worker.heartbeat import identity as heartbeat_identity
from service.worker.middleware import FaultPoints
from service.worker.processor import Processor, RoundSettings
from service.worker.reconciler import Reconciler
from service.worker.relay import Relay
from service.worker.reprocess import Reprocessor
from service.worker.round_store import PostgresRounds
from service.worker.topics_check import TopicsCheck


async def _engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(settings.database)
    try:
        yield engine
    finally:
        await engine.dispose()


# Effect kinds one process calls at once, each up to <PREFIX>EFFECT_CONCURRENCY calls.
_KINDS_AT_ONCE = 4


def http_connections(settings: Settings) -> int:
    """The exchanges the one HTTP client allows at once: every effect kind's concurrent calls and, in `run`, the
    consumer's look-ups besides. A call that waits for a free one past the HTTP timeout fails, and spends an attempt."""
    return max(100, _KINDS_AT_ONCE * settings.effect_concurrency + CONTEXT_LOOKUPS)


async def _http(settings: Settings, tracing: Tracing) -> AsyncIterator[HttpClient]:
    # One client, its connections kept alive (http_connections); while tracing, a CLIENT span per request.
    client = HttpClient.open(settings.http_timeout, connections=http_connections(settings), tracing=tracing)
    try:
        yield client
    finally:
        await client.close()


def _metrics(settings: Settings, domain: Domain) -> Metrics:
    metrics = Metrics(domain.metrics_prefix)
    metrics.breaker_alert_after.set(settings.breaker_alert_after.total_seconds())
    return metrics


def _policy(settings: Settings) -> RetryPolicy:
    return settings.retry_policy()


def _seconds(duration: timedelta) -> float:
    return duration.total_seconds()


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _ready(engine: AsyncEngine, settings: Settings, topics_check: TopicsCheck) -> bool:
    """Ready when the topics the process needs were found at start-up, PostgreSQL answers a query and a Kafka
    bootstrap server accepts a connection."""
    if not topics_check.ready:
        return False
    try:
        async with asyncio.timeout(2):
            await ping(engine)
            host, _, port = settings.kafka_bootstrap_servers.split(",")[0].strip().rpartition(":")
            # An IPv6 address is written in brackets in host:port; a socket takes it without them.
            _, writer = await asyncio.open_connection(host.removeprefix("[").removesuffix("]"), int(port))
            writer.close()
    except (OSError, TimeoutError, ValueError, SQLAlchemyError):
        return False
    return True


def _reprocess_lag(settings: Settings) -> Callable[[], Awaitable[int]]:
    """How far the consumer group is behind on the reprocess topic."""
    return functools.partial(kafka.group_lag, settings, settings.topics.reprocess)


def _topics(settings: Settings, policy: RetryPolicy) -> list[str]:
    """The source topic, every retry tier topic, and the reprocess topic."""
    tiers = [settings.topics.retry(label) for label in policy.tier_labels]
    return [settings.topics.source, *tiers, settings.topics.reprocess]


def _names(settings: Settings) -> type[Settings]:
    """The settings' class: what names the program and its variables in a worker's log lines."""
    return type(settings)


def _round_settings(settings: Settings) -> RoundSettings:
    """What a consumer's rounds take from the settings."""
    return RoundSettings(
        topics=settings.topics,
        consumer=settings.consumer_name,
        ordering=settings.ordering,
        processing_timeout=settings.processing_timeout,
        quarantine_owners=parse_owners(settings.quarantine_owners),
        faults=FaultPoints(fail_at=settings.fault_fail_at, crash_at=settings.fault_crash_at),
    )


def _processor(
    settings: RoundSettings,
    engine: AsyncEngine,
    handler: Handler[Any, Any, Any],
    owners: Owners,
    policy: RetryPolicy,
    metrics: Metrics,
    clock: Callable[[], datetime],
    rng: random.Random,
    downtime: Downtime,
    breakers: Breakers,
    tracing: Tracing,
) -> Processor:
    """A consumer's processor, its rounds on PostgreSQL; one handler serves both (its aggregate store the rounds')."""
    store = PostgresRounds(engine, settings.consumer, handler)
    return Processor(settings, store, handler, owners, policy, metrics, clock, rng, downtime, breakers, tracing)


def _tracing(settings: Settings, role: str) -> Iterator[Tracing]:
    """The process's tracing (service/tracing.py): off unless the OTEL_* variables name an OTLP endpoint; what is
    left is exported when the process ends."""
    tracing = Tracing()
    if wanted(os.environ):
        from service.adapters import otel

        tracing = otel.configured(settings.program, role)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def _kafka_diagnosis(settings: Settings) -> KafkaDiagnosis:
    """The consumer's Kafka client started, and its failures explained, with the process's settings."""
    return KafkaDiagnosis(
        start=functools.partial(kafka.start_with_backoff, settings=settings),
        reason=functools.partial(explain.kafka_reason, names=settings),
    )


def _heartbeat(
    engine: AsyncEngine,
    settings: Settings,
    metrics: Metrics,
    breakers: Breakers,
    topics_check: TopicsCheck,
    role: str,
) -> Heartbeat:
    """The process's heartbeat as `role` (consume, relay, effects, run); its parts are named once they are built."""
    interval = settings.heartbeat_interval.total_seconds()
    who = heartbeat_identity(role, settings.consumer_name, settings.program, interval, _utcnow())
    return Heartbeat(engine, who, metrics, breakers, topics_check)


def _handler(domain: Domain, plumbing: Plumbing) -> Handler[Any, Any, Any]:
    return domain.handler(plumbing)


def _effect_kinds(domain: Domain, plumbing: Plumbing) -> EffectRegistry:
    return domain.effects(plumbing)


class Container(containers.DeclarativeContainer):
    """Providers for every long-running part, built from a domain and its settings; tests override `settings` or
    any provider."""

    domain = providers.Dependency(instance_of=Domain)
    settings = providers.Dependency(instance_of=Settings)

    engine = providers.Resource(_engine, settings=settings)
    # The process's role (its command: consume, relay, effects, run, reconcile, console, …) for its traces.
    role = providers.Object("cli")
    tracing = providers.Resource(_tracing, settings=settings, role=role)
    http = providers.Resource(_http, settings=settings, tracing=tracing)
    metrics = providers.Singleton(_metrics, settings=settings, domain=domain)
    clock = providers.Object(_utcnow)
    rng = providers.Singleton(random.Random)
    policy = providers.Singleton(_policy, settings=settings)
    # The process's circuit breakers, one per downstream, shared by the consumer and the effect worker alike.
    breakers = providers.Singleton(Breakers, metrics=metrics)
    downtime = providers.Singleton(Downtime)

    # What the domain's handler and effect kinds are built on: the settings, the HTTP client, the breakers.
    plumbing = providers.Factory(Plumbing, settings=settings, http=http, breakers=breakers)
    handler = providers.Factory(_handler, domain=domain, plumbing=plumbing)
    effect_kinds = providers.Factory(_effect_kinds, domain=domain, plumbing=plumbing)
    effect_specs = providers.Callable(getattr, domain, "effect_specs")
    decode = providers.Callable(getattr, domain, "decode")  # a record's bytes as a message (reprocess re-reads)
    failing_field = providers.Callable(getattr, domain, "failing_field")  # (path, rule) of a bad record's first field
    effect_policy = providers.Singleton(EffectPolicy, max_attempts=settings.provided.effect_max_attempts)
    processor = providers.Factory(
        _processor,
        settings=providers.Callable(_round_settings, settings),
        engine=engine,
        handler=handler,
        owners=providers.Callable(getattr, domain, "owners"),
        policy=policy,
        metrics=metrics,
        clock=clock,
        rng=rng,
        downtime=downtime,
        breakers=breakers,
        tracing=tracing,
    )
    kafka_consumer = providers.Factory(kafka.make_consumer, settings=settings)
    kafka_producer = providers.Factory(kafka.make_producer, settings=settings)
    one_by_one_producer = providers.Factory(kafka.make_producer, settings=settings, idempotent=False)
    consumer_loop = providers.Factory(
        ConsumerLoop,
        processor=processor,
        metrics=metrics,
        make_consumer=kafka_consumer.provider,
        topics=providers.Callable(_topics, settings, policy),
        batch_size=settings.provided.batch_size,
        breakers=breakers,
        kafka=providers.Callable(_kafka_diagnosis, settings),
    )
    # What the workers below take of the settings: only the values each uses.
    names = providers.Callable(_names, settings)
    topic_names = settings.provided.topics
    call_seconds = providers.Callable(call_budget, settings.provided.http_timeout)
    effect_worker = providers.Factory(
        EffectWorker,
        engine=engine,
        kinds=effect_kinds,
        policy=effect_policy,
        metrics=metrics,
        rng=rng,
        breakers=breakers,
        topics=topic_names,
        lease=settings.provided.effect_lease,
        concurrency=settings.provided.effect_concurrency,
        budget=call_seconds,
        names=names,
        tracing=tracing,
    )
    reconciler = providers.Factory(
        Reconciler,
        engine=engine,
        kinds=effect_kinds,
        policy=effect_policy,
        metrics=metrics,
        topics=topic_names,
        lease=settings.provided.effect_lease,
        dedup_window=settings.provided.dedup_window,
        retention=providers.Callable(Retention.of, settings),
        lookup_budget=call_seconds,
        program=settings.provided.program,
        consumer_name=settings.provided.consumer_name,
        tracing=tracing,
    )
    reprocessor = providers.Factory(
        Reprocessor,
        engine=engine,
        lag=providers.Callable(_reprocess_lag, settings),
        decode=decode,
        consumer_name=settings.provided.consumer_name,
        topic=settings.provided.topics.reprocess,
        names=names,
    )
    relay = providers.Factory(
        Relay,
        engine=engine,
        metrics=metrics,
        make_producer=kafka_producer.provider,
        make_one_by_one_producer=one_by_one_producer.provider,
        start_client=providers.Callable(functools.partial, kafka.start_with_backoff, settings=settings),
        batch_size=settings.provided.relay_batch_size,
        names=names,
        crash_at=settings.provided.fault_crash_at,
        tracing=tracing,
    )
    # The start-up check of the topics a long-running process reads and writes (service/cli/serve.py).
    topics_check = providers.Singleton(
        TopicsCheck,
        look=providers.Callable(functools.partial, topics.look, settings),
        source=settings.provided.source_topic,
        program=settings.provided.program,
        names=settings,
    )
    readiness = providers.Callable(functools.partial, _ready, engine, settings, topics_check)
    gauges = providers.Factory(
        GaugeRefresher,
        engine=engine,
        metrics=metrics,
        interval=providers.Callable(_seconds, settings.provided.metrics_refresh),
    )
    # Called with the process's role (service/cli/serve.py): every long-running process beats.
    heartbeat = providers.Factory(
        _heartbeat, engine=engine, settings=settings, metrics=metrics, breakers=breakers, topics_check=topics_check
    )
    health = providers.Singleton(HealthServer, metrics=metrics, ready=readiness, port=settings.provided.metrics_port)
