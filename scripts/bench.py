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
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from bench_data import record_at
from bench_lab import FULL, QUICK, STAGES, Bench, BenchError, Drain, Sizes, best, console, progress
from bench_peer import run_peer
from bench_pipeline import PipelineResults, measure_pipeline
from bench_pipeline import figures as pipeline_figures
from rich.console import Console
from rich.table import Table

# Far more partitions than a test suite and a bench leave behind: a broker's heap holds every partition's state, and
# one full of old topics slows every figure that goes through it (docs/performance.md, "The machine").
MANY_PARTITIONS = 5_000


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
    results.pipeline = PipelineResults(slow_stages=bench.sizes.pipeline_slow, only=bench.sizes.only)
    await measure_pipeline(bench, results.pipeline)


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
    sys.exit(main())
