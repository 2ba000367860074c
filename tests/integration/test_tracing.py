"""One trace per record, from the producer to the provider, in a real Jaeger (scripts/jaeger-local): real consume,
relay and effects processes export over OTLP/HTTP; the tests read the traces back through Jaeger's query API. A
record that went through a retry tier, the quarantine and a reprocess shows every attempt linked; a collector that
is down costs nothing but the spans."""

from __future__ import annotations

import contextlib
import secrets
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.orders.fakes import Downstream
from service.policy.traces import derived_trace_id
from tests.support import ServiceProcess, Topics, cli, eventually, produce, rows, scalar, settings_for
from tests.support.jaeger import Jaeger, Span, Trace
from tests.support.orders import placed

pytestmark = pytest.mark.slow

PRODUCER_SPAN = "00f067aa0ba902b7"
PROCESSES = ("consume", "relay", "effects")


def tracing_env(endpoint: str, service: str) -> dict[str, str]:
    """Every span exported (the test must see each), at once."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


@contextlib.contextmanager
def running(settings: Settings, env: dict[str, str], logs: Path, *roles: str) -> Iterator[dict[str, ServiceProcess]]:
    """The processes, stopped cleanly at the end (their last spans exported)."""
    started = {role: ServiceProcess(role, settings, logs / f"{role}.log", env) for role in roles}
    try:
        yield started
    except BaseException:
        for process in started.values():
            process.terminate()
        raise
    codes = {role: process.terminate() for role, process in started.items()}
    assert codes == dict.fromkeys(started, 0), {role: started[role].log()[-2000:] for role in started}


def attributes_hold_nothing_of(trace: Trace, *secrets: str) -> None:
    """No attribute of any span holds one of these strings (a payload's or a header's values)."""
    for span in trace.spans:
        for name, value in span.tags.items():
            assert not any(secret in str(value) for secret in secrets), (span.operation_name, name)


def process_spans(trace: Trace, topic: str) -> list[Span]:
    return sorted(trace.named(f"process {topic}"), key=lambda span: span.start_time_us)


async def test_each_record_is_one_trace_from_its_producer_to_its_provider(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    jaeger: Jaeger,
    tmp_path: Path,
) -> None:
    # Given consume, relay and effects exporting every span to Jaeger
    service = f"orders-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        payments_url=downstream.url,
        emails_url=downstream.url,
    )
    env = tracing_env(jaeger.otlp_endpoint, service)
    producer_trace = secrets.token_hex(16)  # Jaeger keeps the traces of earlier runs: a trace of this run's own
    traced = f"00-{producer_trace}-{PRODUCER_SPAN}-01"

    # When one order arrives with its producer's traceparent and one without
    with running(settings, env, tmp_path, *PROCESSES):
        await produce(
            kafka,
            topics.source,
            [
                ("T-1", placed("T-1", customer="c-secret-1"), {"message-id": "T-1.1/placed", "traceparent": traced}),
                ("T-2", placed("T-2", customer="c-secret-2"), {"message-id": "T-2.1/placed"}),
            ],
        )
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM effects WHERE state = 'sent'"), timeout=90)
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=60
        )

    # Then each is one trace: the producer's for the first, the derived one for the second
    derived = derived_trace_id(settings.consumer_name, "T-2.1/placed")
    complete = {f"process {topics.source}", "GET", "write", f"send {topics.events}", "payment.capture", "POST"}
    for trace_id, order in ((producer_trace, "T-1"), (derived, "T-2")):
        trace = await jaeger.wait_for_trace_async(
            trace_id, lambda found: complete <= set(found.operations()), timeout=60
        )
        [process] = process_spans(trace, topics.source)
        assert process.span_kind == "consumer"
        assert process.tags["messaging.system"] == "kafka"
        assert process.tags["messaging.operation.type"] == "process"
        assert process.tags["messaging.destination.name"] == topics.source
        assert process.tags["messaging.consumer.group.name"] == settings.consumer_name
        assert process.tags["messaging.kafka.message.key"] == order
        assert process.tags["messaging.message.id"] == f"{order}.1/placed"
        assert process.tags["failure.id"].startswith(f"{topics.source}/")
        assert process.process_tags["service.role"] == "consume"
        # its look-up and its share of the write are its children
        for child in ("GET", "write"):
            assert any(span.parent_span_id == process.span_id for span in trace.named(child)), child
        # the capture's provider call continues it, and the relay's sends of the events each caused
        [capture] = trace.named("payment.capture")
        assert capture.parent_span_id == process.span_id
        assert capture.process_tags["service.role"] == "effects"
        assert any(span.parent_span_id == capture.span_id for span in trace.named("POST"))
        sends = trace.named(f"send {topics.events}")
        assert {send.parent_span_id for send in sends} == {process.span_id, capture.span_id}
        assert all(send.span_kind == "producer" for send in sends)
        assert all(send.process_tags["service.role"] == "relay" for send in sends)
        attributes_hold_nothing_of(trace, "c-secret-1", "c-secret-2", "2500", "EUR")
    first = await jaeger.trace_async(producer_trace)
    assert first is not None
    [process] = process_spans(first, topics.source)
    assert process.parent_span_id == PRODUCER_SPAN


async def test_a_record_through_a_tier_the_quarantine_and_a_reprocess_has_every_attempt_linked(
    engine: AsyncEngine,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    jaeger: Jaeger,
    tmp_path: Path,
) -> None:
    # Given a directory that refuses one customer twice, and two attempts with a 1 s tier between them
    service = f"orders-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        database_url,
        kafka,
        topics,
        customers_url=downstream.url,
        payments_url=downstream.url,
        emails_url=downstream.url,
        max_attempts=2,
        blocking_attempts=1,
        retry_tiers="1s",
    )
    downstream.fail_next("customers.get", times=2, status=503, key="c-down")
    env = tracing_env(jaeger.otlp_endpoint, service)

    with running(settings, env, tmp_path, *PROCESSES):
        # When its order fails in place, in the tier, is quarantined, and is reprocessed once the directory answers
        await produce(kafka, topics.source, [("Q-1", placed("Q-1", customer="c-down"), {"message-id": "Q-1.1/placed"})])
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine WHERE status = 'open'"), timeout=90
        )
        [row] = await rows(engine, "SELECT failure_id, envelope->>'traceId' AS trace_id FROM quarantine")
        assert row["trace_id"] == derived_trace_id(settings.consumer_name, "Q-1.1/placed")
        await cli(settings, "reprocess", "--failure-id", row["failure_id"], "--reason", "r", "--yes", extra_env=env)
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM orders"), timeout=90)

    # Then its one trace holds each attempt, each linked to the one before it
    trace_id = derived_trace_id(settings.consumer_name, "Q-1.1/placed")
    reprocessed = f"process {topics.reprocess}"
    trace = await jaeger.wait_for_trace_async(trace_id, lambda found: bool(found.named(reprocessed)), timeout=60)
    attempts = attempts_of(trace)
    seen = [(span.operation_name.removeprefix("process "), span.tags.get("outcome")) for span in attempts]
    assert seen[0] == (topics.source, "failed")
    assert (topics.retry("1s"), "failed") in seen
    assert (topics.retry("1s"), "quarantined") in seen
    assert seen[-1] == (topics.reprocess, "processed")
    assert attempts[0].tags["error.type"] == "DOWNSTREAM_UNAVAILABLE"
    spans_by_id = {span.span_id for span in trace.spans}
    for later in attempts[1:]:
        assert later.links, later.operation_name
        assert all(link.trace_id == trace_id and link.span_id in spans_by_id for link in later.links)


def attempts_of(trace: Trace) -> list[Span]:
    """Every attempt's process span, whatever topic it read the record from, in order."""
    spans = [span for span in trace.spans if span.operation_name.startswith("process ")]
    return sorted(spans, key=lambda span: span.start_time_us)


async def test_a_collector_that_is_down_costs_nothing_but_the_spans(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    # Given a collector address where nothing listens
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = settings_for(database_url, kafka, topics, customers_url=downstream.url, payments_url=downstream.url)
    env = tracing_env(f"http://127.0.0.1:{port}", "orders-nowhere")

    # When records are consumed and their events relayed
    with running(settings, env, tmp_path, "consume", "relay") as processes:
        await produce(
            kafka, topics.source, [(f"D-{n}", placed(f"D-{n}"), {"message-id": f"D-{n}.1/placed"}) for n in range(20)]
        )
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 20 FROM inbox WHERE status = 'processed'"), timeout=60
        )
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=60
        )

        # Then every record was applied and published, and each process said once that spans are dropped
        def said(process: ServiceProcess) -> int:
            return sum('"tracing_export_failed"' in line for line in process.log().splitlines())

        async def each_said_it() -> bool:
            return all(said(process) == 1 for process in processes.values())

        await eventually(each_said_it, timeout=30)
    for process in processes.values():
        assert said(process) == 1
        assert "Traceback" not in process.log()
