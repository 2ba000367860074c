"""The `order-service` command line (contract §3)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from service import logs
from service.config import ConfigurationError, Settings, load_settings
from service.containers import Container
from service.durations import parse_duration
from service.errors import InfrastructureUnavailable
from service.store import parking, quarantine
from service.store.uow import UnitOfWork

T = TypeVar("T")

_ENVIRONMENT_HELP = """\
Configuration comes from environment variables (see README): ORDERS_DATABASE_URL,
ORDERS_KAFKA_BOOTSTRAP_SERVERS, ORDERS_CONSUMER_NAME, ORDERS_SOURCE_TOPIC, ORDERS_RETRY_TIERS,
ORDERS_MAX_ATTEMPTS, ORDERS_MAX_ELAPSED, ORDERS_ORDERING, ORDERS_DEDUP_WINDOW, ORDERS_CUSTOMERS_URL,
ORDERS_PAYMENTS_URL, ORDERS_EMAILS_URL, ORDERS_KNOWN_TENANTS, ORDERS_METRICS_PORT, ORDERS_HTTP_TIMEOUT,
ORDERS_BATCH_SIZE, ORDERS_RELAY_BATCH_SIZE, ORDERS_LOG_LEVEL, ORDERS_BLOCKING_ATTEMPTS,
ORDERS_BLOCKING_ELAPSED, ORDERS_PROCESSING_TIMEOUT, ORDERS_EFFECT_LEASE, ORDERS_EFFECT_MAX_ATTEMPTS."""

app = typer.Typer(
    name="order-service",
    help="Apply order events from Kafka to PostgreSQL; every record reaches a known terminal state.",
    epilog=_ENVIRONMENT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
quarantine_app = typer.Typer(help="Operate the quarantine queue.", no_args_is_help=True)
app.add_typer(quarantine_app, name="quarantine")
parked_app = typer.Typer(help="Records parked behind a held key (ORDERS_ORDERING=key).", no_args_is_help=True)
app.add_typer(parked_app, name="parked")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _settings() -> Settings:
    try:
        settings = load_settings()
    except ConfigurationError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    logs.configure(settings.log_level)
    return settings


def _run(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine with SIGTERM/SIGINT turned into a graceful stop."""

    async def runner() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await main(stop)

    return asyncio.run(runner())


async def _serve(settings: Settings, *parts: str) -> None:
    container = Container(settings=settings)
    await container.init_resources()  # type: ignore[misc]
    try:
        loops = [await _provide(container, part) for part in parts]
        health = await _provide(container, "health")
        await health.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            async with asyncio.TaskGroup() as group:
                for part in loops:
                    group.create_task(part.run(stop))
        finally:
            await health.stop()
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def _provide(container: Container, name: str) -> Any:
    provided = getattr(container, name)()
    return await provided if isinstance(provided, Awaitable) else provided


@app.command()
def migrate() -> None:
    """Bring the database schema to the latest revision (`alembic upgrade head`)."""
    from alembic import command
    from alembic.config import Config

    settings = _settings()
    root = Path(__file__).resolve().parent.parent
    config = Config(str(root / "alembic.ini"))
    config.set_main_option("script_location", str(root / "migrations"))
    config.set_main_option("sqlalchemy.url", settings.database_url.replace("%", "%%"))
    try:
        command.upgrade(config, "head")
    except OSError as error:
        typer.echo(f"migrate: database unreachable ({type(error).__name__})", err=True)
        raise typer.Exit(1) from None
    typer.echo("database schema is at the latest revision")


@app.command()
def consume() -> None:
    """Consume the source topic until SIGTERM/SIGINT, then finish in-flight work, commit and exit 0."""
    settings = _settings()
    asyncio.run(_serve(settings, "consumer_loop"))


@app.command()
def relay() -> None:
    """Publish outbox rows to Kafka until stopped."""
    settings = _settings()
    asyncio.run(_serve(settings, "relay"))


@app.command()
def effects() -> None:
    """Execute pending external effects (payments, emails) until stopped."""
    settings = _settings()
    asyncio.run(_serve(settings, "effect_worker"))


@app.command()
def run() -> None:
    """Consume, relay and execute effects in one process (one metrics port for all)."""
    settings = _settings()
    asyncio.run(_serve(settings, "consumer_loop", "relay", "effect_worker"))


@app.command()
def reconcile(
    max_seconds: Annotated[
        float, typer.Option(min=1, help="Time budget of the pass; the rest waits for the next.")
    ] = 60,
) -> None:
    """One pass for cron: resolve uncertain and stale effects, purge expired inbox rows. Exit 0 unless it failed."""
    settings = _settings()

    async def once(_: asyncio.Event) -> Any:
        container = Container(settings=settings)
        await container.init_resources()  # type: ignore[misc]
        try:
            reconciler = await _provide(container, "reconciler")
            return await reconciler.run_once(max_seconds)
        finally:
            await container.shutdown_resources()  # type: ignore[misc]

    try:
        summary = _run(once)
    except InfrastructureUnavailable:
        typer.echo("reconcile: failed: database unavailable", err=True)
        raise typer.Exit(1) from None
    if summary is None:
        typer.echo("reconcile: another reconcile run holds the lock; nothing to do")
        return
    typer.echo(summary.line())


async def _read(settings: Settings, query: Callable[[Any], Awaitable[T]], *, commit: bool = False) -> T:
    """Run one unit of work for a CLI command; only commands that change something pass `commit=True`."""
    container = Container(settings=settings)
    engine = await _provide(container, "engine")
    try:
        async with UnitOfWork(engine) as uow:
            result = await query(uow.connection)
            if commit:
                await uow.commit()
            return result
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, sort_keys=True) + "\n")


def _age(moment: datetime) -> str:
    seconds = int((datetime.now(moment.tzinfo) - moment).total_seconds())
    return str(timedelta(seconds=max(0, seconds)))


@quarantine_app.command("list")
def quarantine_list(
    error_code: Annotated[str | None, typer.Option(help="Only this error code.")] = None,
    status: Annotated[str | None, typer.Option(help="open, resolved, reprocessing or reprocessed.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Only records first failed at least this long ago (5m).")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Only records of this order key.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """List quarantined records, oldest first."""
    settings = _settings()
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None
    rows = _run(
        lambda _: _read(
            settings,
            lambda c: quarantine.listing(c, error_code=error_code, status=status, older_than=age, key=key, limit=limit),
        )
    )
    if as_json:
        _print_json(rows)
        return
    table = Table("failure id", "message id", "error code", "status", "owner", "key", "attempts", "age")
    for row in rows:
        table.add_row(
            row["failure_id"],
            row["message_id"],
            row["error_code"],
            row["status"],
            row["owner"],
            row["order_key"] or "",
            str(row["attempts"]),
            _age(row["first_failed_at"]),
        )
    Console().print(table)


@quarantine_app.command("show")
def quarantine_show(
    failure_id: Annotated[str, typer.Argument(help="The failure id, e.g. orders/3/1200.")],
    include_payload: Annotated[bool, typer.Option(help="Also print the original bytes (base64).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show one quarantined record: envelope, attempts, annotations."""
    settings = _settings()
    row = _run(lambda _: _read(settings, lambda c: quarantine.get(c, failure_id)))
    if row is None:
        typer.echo(f"no quarantined record with failure id {failure_id}", err=True)
        raise typer.Exit(1)
    if not include_payload:
        row.pop("payload", None)
    if as_json:
        _print_json(row)
        return
    console = Console()
    for name, value in _jsonable(row).items():
        console.print(f"[bold]{name}[/bold]: {json.dumps(value) if isinstance(value, dict | list) else value}")


@quarantine_app.command("stats")
def quarantine_stats(as_json: JsonFlag = False) -> None:
    """Counts and rates per error code and owner, and the age of the oldest open record."""
    settings = _settings()
    summary = _run(lambda _: _read(settings, quarantine.stats))
    if as_json:
        _print_json(summary)
        return
    age = summary["oldest_open_age_seconds"]
    console = Console()
    console.print(f"open: {summary['open']}   oldest open: {timedelta(seconds=int(age)) if age is not None else '-'}")
    table = Table("error code", "owner", "open", "total", "last hour")
    for group in summary["by_code"]:
        table.add_row(
            group["error_code"],
            group["owner"],
            str(group["open"]),
            str(group["total"]),
            str(group["rate_per_hour"]),
        )
    console.print(table)


@parked_app.command("list")
def parked_list(as_json: JsonFlag = False) -> None:
    """Held keys: how many records wait behind each, since when, and what holds the key."""
    settings = _settings()
    held = _run(lambda _: _read(settings, lambda c: parking.summary(c, settings.consumer_name)))
    if as_json:
        _print_json(held)
        return
    table = Table("key", "parked", "oldest parked", "blocked by (quarantined)", "retrying")
    for row in held:
        oldest = row["oldest_parked_at"]
        table.add_row(
            row["order_key"],
            str(row["parked"]),
            _age(oldest) if oldest else "-",
            row["blocked_by"] or "",
            row["retrying"] or "",
        )
    Console().print(table)


@parked_app.command("release")
def parked_release(
    key: Annotated[str, typer.Argument(help="The order key to free; its parked records are then applied in order.")],
    as_json: JsonFlag = False,
) -> None:
    """Free a key held by a quarantined head; a running consumer applies its parked records in order."""
    settings = _settings()
    released = _run(lambda _: _read(settings, lambda c: parking.release(c, settings.consumer_name, key), commit=True))
    if as_json:
        _print_json({"key": key, "released": released})
        return
    typer.echo(f"{key}: released" if released else f"{key}: was not blocked (nothing to release)")


def main() -> None:
    """Console-script entry point."""
    app()
