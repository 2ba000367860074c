"""What tracing costs the consumer: CPU seconds per record of `order-service consume` with tracing off, on with a
tenth of the roots sampled, and on with every span sampled (scripts/bench-tracing, docs/performance.md "Tracing").

Each run gets a fresh topic and database. The topic first holds a warm-up of records; once the consumer has
committed them (its imports, connections and group join done), the run reads the process's CPU time (utime + stime
of /proc/<pid>/stat, every thread's: the span exporter's too), produces the measured records, waits until their
offsets are committed and the exporter's batch delay has passed, and reads it again. The records are the bench's
(scripts/bench_data.py: new orders, producer retries, bytes that are not JSON), half of them with a producer's
`traceparent`, one in ten of those sampled. Tracing exports over OTLP/HTTP to a sink in this process that reads each
request and answers 200: the export's serialisation and HTTP cost is real, nothing is stored.

The configurations run in rotated order (off, 10 %, 100 %; then 10 %, 100 %, off; …) so that drift on a shared
machine touches each alike. With `--baseline DIR`, a configuration named `<config>@base` runs the consumer of another
checkout (the commit before tracing, or before a change to it) with its own migrations. Figures: the median CPU
per record of each, its spread (min-max), and the median's ratio to `off`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from aiohttp import web
from bench_data import Mix, Record, record_at
from bench_lab import QUICK, ROOT, Bench, BenchError, poll, service_env, stop
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
WARMUP = 1_000
SETTLE = 1.5  # after the drain, for the batch span processor's last export (its delay is set to 500 ms)
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
# The configurations: off (the default), on with nothing sampled (what every record pays), with a ratio of the roots
# sampled (parent-based: a producer's sampled `traceparent` is always followed), with every span sampled.
TRACING = {
    "off": {},
    "on0": {"OTEL_TRACES_SAMPLER": "always_off"},
    "on1": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "on10": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    "on100": {"OTEL_TRACES_SAMPLER": "always_on"},
    "default": {},  # on, with the service's own default sampler (service/adapters/otel.py DEFAULT_SAMPLER)
}
# One producer's `traceparent` in this many is sampled (every second record carries one); 0: none is.
SAMPLED_PARENTS = {"every": 10}


def traced_record(index: int) -> Record:
    """Record `index` of the bench's data, every second one with a producer's `traceparent` (sampled in one of ten
    of those): a mix of records that continue a trace and records that root their own."""
    key, value, headers = record_at(index)
    if index % 2 == 0:
        trace_id = (index * 0x9E3779B97F4A7C15 + 1) % (1 << 128) or 1
        every = SAMPLED_PARENTS["every"]
        flags = "01" if every and index % (2 * every) == 0 else "00"
        parent = f"00-{trace_id:032x}-{index + 1:016x}-{flags}"
        headers = [*headers, ("traceparent", parent.encode())]
    return key, value, headers


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far, every thread's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


@dataclass
class Runs:
    """CPU microseconds per record of each configuration, in run order."""

    per_record: dict[str, list[float]] = field(default_factory=dict)

    def add(self, config: str, micros: float) -> None:
        """One run's figure."""
        self.per_record.setdefault(config, []).append(micros)

    def table(self) -> Table:
        """Median and spread of each, its median against `off`'s, and the median and spread of its ratio to `off`
        in the same round (the pairs: drift over the run touches both of a pair alike)."""
        table = Table(title="consume: CPU per record")
        for column in ("configuration", "runs", "median µs", "min-max µs", "vs off", "paired vs off (min-max)"):
            table.add_column(column, justify="right")
        offs = self.per_record.get("off") or next(iter(self.per_record.values()))
        off = statistics.median(offs)
        for config, values in self.per_record.items():
            median = statistics.median(values)
            spread = f"{min(values):.0f}-{max(values):.0f}"
            paired = [(value / base - 1) * 100 for value, base in zip(values, offs, strict=False)]
            table.add_row(
                config,
                str(len(values)),
                f"{median:.0f}",
                spread,
                f"{(median / off - 1) * 100:+.1f} %",
                f"{statistics.median(paired):+.1f} % ({min(paired):+.0f} to {max(paired):+.0f} %)",
            )
        return table


class Sink:
    """An OTLP/HTTP endpoint that reads every export and answers 200 with an empty (valid) response."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.bytes += len(await request.read())
        self.requests += 1
        return web.Response(body=b"", content_type="application/x-protobuf")


class TracingBench:
    """The runs: a topic, a database and one `consume` each, from this checkout or the baseline's."""

    def __init__(self, bench: Bench, sink: Sink, records: int, baseline: Path | None, chosen: list[str]) -> None:
        self.chosen = chosen
        self.profile = False  # run each consumer under cProfile (its main thread), its stats in the run's directory
        self.drain = False  # measure a drain (`--drain`): the consumer stopped while the records are produced
        self.bench = bench
        self.sink = sink
        self.records = records
        self.baseline = baseline
        self.runs = 0

    def configs(self) -> list[str]:
        """The configurations of one round, before rotation."""
        known = [*TRACING, *(f"{config}@base" for config in TRACING)] if self.baseline else list(TRACING)
        unknown = set(self.chosen) - set(known)
        if unknown:
            raise BenchError(f"no such configuration: {', '.join(sorted(unknown))} (known: {', '.join(known)})")
        return self.chosen

    async def database(self, checkout: Path, what: str) -> tuple[str, str]:
        """A fresh database migrated by `checkout`'s own `migrate`."""
        bench = self.bench
        await bench.drop_databases()
        name = f"bench_{what}_{bench.stamp}"
        admin = await asyncpg.connect(bench.admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        bench.databases.append(name)
        dsn = f"{bench.server}/{name}"
        url = "postgresql+asyncpg://" + dsn.removeprefix("postgresql://")
        env = service_env(ORDERS_DATABASE_URL=url, PYTHONPATH=str(checkout))
        with (bench.workdir / "migrate.log").open("ab") as log:
            migrate = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service", "migrate", cwd=checkout, env=env, stdout=log, stderr=log
            )
        if await migrate.wait() != 0:
            raise BenchError(f"migrate failed on {name}; see {bench.workdir}")
        return dsn, url

    async def run(self, config: str) -> float:
        """One run of `config`: CPU microseconds per measured record."""
        bench = self.bench
        self.runs += 1
        tracing, _, base = config.partition("@")
        what = f"tr{self.runs}{tracing}{base}"
        checkout = self.baseline if base and self.baseline is not None else ROOT
        topic = await bench.new_topic(what, derived=True)
        dsn, url = await self.database(checkout, what)
        await bench.checkpoint()
        await bench.produce(topic, map(traced_record, range(WARMUP)))
        group = f"bench-{what}-{bench.stamp}"
        otel = {}
        if tracing != "off":
            otel = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.sink.port}",
                "OTEL_BSP_SCHEDULE_DELAY": "500",
                **TRACING[tracing],
            }
        env = service_env(
            ORDERS_DATABASE_URL=url,
            ORDERS_KAFKA_BOOTSTRAP_SERVERS=bench.bootstrap,
            ORDERS_SOURCE_TOPIC=topic,
            ORDERS_CONSUMER_NAME=group,
            ORDERS_METRICS_PORT="0",
            PYTHONPATH=str(checkout),
        )
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")} | otel
        profile = ["-m", "cProfile", "-o", str(bench.workdir / f"{what}.prof")] if self.profile else []
        with (bench.workdir / f"{what}.log").open("ab") as log:
            # In the checkout (`-m` puts the working directory first on the path): its `service`, not ours.
            process = await asyncio.create_subprocess_exec(
                sys.executable, *profile, "-m", "service", "consume", cwd=checkout, env=env, stdout=log, stderr=log
            )
        bench.processes.append(process)
        try:

            async def committed() -> bool:
                if process.returncode is not None:
                    raise BenchError(f"consume exited with {process.returncode}; see {bench.workdir}")
                return await bench.lag(group, topic) == 0

            if not await poll(committed, 120, 0.05):
                raise BenchError(f"the warm-up was not consumed; see {bench.workdir}")
            if self.drain:
                # The consumer stopped (SIGSTOP) while the records are produced, then measured as it drains them:
                # its rounds are full batches, whatever the producer's pace (a live run's rounds follow it).
                os.kill(process.pid, signal.SIGSTOP)
                try:
                    await bench.produce(topic, map(traced_record, range(WARMUP, WARMUP + self.records)))
                    before = cpu_seconds(process.pid)
                finally:
                    os.kill(process.pid, signal.SIGCONT)
            else:
                before = cpu_seconds(process.pid)
                await bench.produce(topic, map(traced_record, range(WARMUP, WARMUP + self.records)))
            if not await poll(committed, 60 + self.records / 100, 0.1):
                raise BenchError(f"the records were not consumed; see {bench.workdir}")
            await asyncio.sleep(SETTLE)
            after = cpu_seconds(process.pid)
        finally:
            await stop(process)
        connection = await asyncpg.connect(dsn)
        try:
            inbox = await connection.fetchval("SELECT count(*) FROM inbox WHERE consumer_name = $1", group)
        finally:
            await connection.close()
        if inbox != Mix.of(WARMUP + self.records).unique:
            raise BenchError(f"{inbox} inbox rows, not {Mix.of(WARMUP + self.records).unique}; see {bench.workdir}")
        return (after - before) / self.records * 1e6


async def main(args: argparse.Namespace) -> int:
    """Alternate the configurations `--pairs` times; print each run and the table."""
    # The offset probe still asks about the topics of the runs before, deleted as each run ends.
    logging.getLogger("aiokafka.cluster").setLevel(logging.CRITICAL)
    SAMPLED_PARENTS["every"] = args.sampled_parents
    bench = Bench(args.admin_url, args.bootstrap, QUICK, keep=False)
    sink = Sink()
    await sink.start()
    await bench.start()
    lab = TracingBench(bench, sink, args.records, args.baseline, args.configs.split(","))
    lab.profile = args.profile
    lab.drain = args.drain
    results = Runs()
    console.print(f"bench-tracing {bench.stamp}: {args.records:,} records a run, logs in {bench.workdir}")
    try:
        configs = lab.configs()
        for round_ in range(args.pairs):
            turn = round_ % len(configs)
            for config in configs[turn:] + configs[:turn]:
                micros = await lab.run(config)
                results.add(config, micros)
                console.print(f"round {round_ + 1} {config}: {micros:.1f} µs CPU per record")
                # Each run's topics go at once: a broker full of partitions slows every run after.
                await bench.admin.delete_topics(bench.topics)
                bench.topics.clear()
    except BenchError as error:
        console.print(f"[red]bench-tracing: {error}[/red]")
        return 1
    finally:
        await bench.close()
        await sink.stop()
    Console(width=120).print(results.table())
    console.print(f"sink: {sink.requests:,} exports, {sink.bytes / 1e6:.1f} MB")
    return 0


def arguments() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", required=True, help="a PostgreSQL superuser URL (postgresql://…/postgres)")
    parser.add_argument("--bootstrap", required=True, help="Kafka's bootstrap servers")
    parser.add_argument("--records", type=int, default=20_000, help="measured records a run (default 20,000)")
    parser.add_argument("--pairs", type=int, default=4, help="rounds of alternating runs (default 4)")
    parser.add_argument(
        "--configs",
        default="off,on10,on100",
        help=f"comma separated, of {', '.join(TRACING)}; with --baseline also <config>@base (default off,on10,on100)",
    )
    parser.add_argument(
        "--sampled-parents",
        type=int,
        default=10,
        help="one producer's traceparent in this many is sampled (default 10: 5 %% of the records); 0: none",
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        help="measure a drain: the consumer is stopped (SIGSTOP) while the records are produced, then drains them",
    )
    parser.add_argument("--profile", action="store_true", help="profile each consumer: <logs>/<run>.prof (cProfile)")
    parser.add_argument("--baseline", type=Path, help="a checkout whose consumer runs as `base` (tracing off)")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(arguments())))
