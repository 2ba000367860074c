"""The `order-service` command line (contract §3)."""

from __future__ import annotations

import asyncio
import base64
import csv
import getpass
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any, TypeVar

import structlog
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from typer.exceptions import TyperException

from service import logs
from service.config import ConfigurationError, Settings, load_settings
from service.containers import Container
from service.domain.codes import ErrorCode
from service.domain.messages import invalid_field
from service.durations import parse_duration
from service.errors import InfrastructureUnavailable
from service.explain import explain, first_line
from service.runtime import collect_garbage, tune_garbage_collector
from service.stopping import sleep_unless_stopped
from service.store import effects as effects_store
from service.store import outbox, parking, quarantine
from service.store.uow import UnitOfWork
from service.worker.reprocess import Options, Selection

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
effects_app = typer.Typer(help="Execute pending external effects until stopped; `effects list` shows the ledger.")
app.add_typer(effects_app, name="effects")
outbox_app = typer.Typer(help="Outbox rows the relay set aside (Kafka refused them).", no_args_is_help=True)
app.add_typer(outbox_app, name="outbox")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"order-service {package_version('order-service')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Apply order events from Kafka to PostgreSQL; every record reaches a known terminal state."""


_loaded: Settings | None = None  # the settings of the command being run (set by `_settings`)


def _settings() -> Settings:
    global _loaded
    try:
        settings = load_settings()
    except ConfigurationError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    logs.configure(settings.log_level)
    _loaded = settings
    return settings


def _run(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine with SIGTERM/SIGINT turned into a graceful stop; a failure that ends it is one line on
    stderr and exit 1 (the stack trace only at ORDERS_LOG_LEVEL=debug)."""

    async def runner() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await main(stop)

    try:
        return asyncio.run(runner())
    except (typer.Exit, typer.Abort, TyperException):
        raise
    except Exception as error:
        settings = _loaded
        if settings is not None and settings.log_level == "debug":
            raise
        port = settings.metrics_port if settings is not None else None
        typer.echo(f"{_command()}: {explain(error, metrics_port=port)}", err=True)
        raise typer.Exit(1) from None


def _command() -> str:
    """The command being run, as typed up to its first option (`order-service quarantine list`)."""
    words = []
    for word in sys.argv[1:]:
        if word.startswith("-"):
            break
        words.append(word)
    return " ".join(["order-service", *words[:2]])


@asynccontextmanager
async def _assembled(settings: Settings) -> AsyncIterator[Container]:
    """The container with its resources (engine, HTTP client) open for the block, closed after it."""
    container = Container(settings=settings)
    await container.init_resources()  # type: ignore[misc]
    try:
        yield container
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def _use(settings: Settings, name: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """Build one provider and run `work` with it, resources open."""
    async with _assembled(settings) as container:
        return await work(await _provide(container, name))


def _serve(settings: Settings, *parts: str) -> None:
    """Run long-running loops until SIGTERM/SIGINT, with /metrics, /healthz and /readyz."""

    async def serve(stop: asyncio.Event) -> None:
        if not await _schema_ready(settings, stop):
            return
        async with _assembled(settings) as container:
            # Every long-running process also keeps the database-derived gauges fresh for its /metrics.
            loops = [await _provide(container, part) for part in (*parts, "gauges")]
            health = await _provide(container, "health")
            await health.start()
            tune_garbage_collector()
            try:
                async with asyncio.TaskGroup() as group:
                    for part in loops:
                        group.create_task(part.run(stop))
                    group.create_task(collect_garbage(stop))
            finally:
                await health.stop()

    _run(serve)


async def _schema_ready(settings: Settings, stop: asyncio.Event) -> bool:
    """Before a long-running command starts: a database that does not exist or is not at this version's schema
    ends it (one line, exit 1); one that cannot be reached is waited for, one log line per retry. False when
    stopped while waiting."""
    from service.store import schema
    from service.store.uow import is_unavailable

    delay = 1.0
    while not stop.is_set():
        try:
            await schema.require_head(settings.database_url)
            return True
        except Exception as error:
            if not is_unavailable(error):
                raise
        structlog.get_logger("order_service.cli").warning("database_unavailable", retry_in_seconds=delay)
        await sleep_unless_stopped(stop, delay)
        delay = min(delay * 2, 30.0)
    return False


async def _provide(container: Container, name: str) -> Any:
    provided = getattr(container, name)()
    return await provided if isinstance(provided, Awaitable) else provided


@app.command()
def migrate() -> None:
    """Bring the database schema to the latest revision (`alembic upgrade head`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from service.store import schema

    settings = _settings()
    logging.getLogger("alembic").setLevel(min(logging.INFO, logging.getLogger().level))  # say each upgrade
    try:
        head = schema.upgrade_to_head(settings.database_url)
    except OSError as error:
        typer.echo(f"migrate: database unreachable ({type(error).__name__})", err=True)
        raise typer.Exit(1) from None
    except SQLAlchemyError as error:
        typer.echo(f"migrate: failed: {first_line(getattr(error, 'orig', None) or error)}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"database schema is at the latest revision ({head})")


@app.command()
def consume() -> None:
    """Consume the source topic until SIGTERM/SIGINT, then finish in-flight work, commit and exit 0."""
    settings = _settings()
    _serve(settings, "consumer_loop")


@app.command()
def relay() -> None:
    """Publish outbox rows to Kafka until stopped."""
    settings = _settings()
    _serve(settings, "relay")


@effects_app.callback(invoke_without_command=True)
def effects(context: typer.Context) -> None:
    """Execute pending external effects (payments, emails) until stopped; `effects list` shows the ledger."""
    if context.invoked_subcommand is not None:
        return
    settings = _settings()
    _serve(settings, "effect_worker")


@app.command()
def run() -> None:
    """Consume, relay and execute effects in one process (one metrics port for all)."""
    settings = _settings()
    _serve(settings, "consumer_loop", "relay", "effect_worker")


@app.command()
def reconcile(
    max_seconds: Annotated[
        float, typer.Option(min=1, help="Time budget of the pass; the rest waits for the next.")
    ] = 60,
) -> None:
    """One pass for cron: resolve uncertain and stale effects, purge expired inbox rows. Exit 0 unless it failed."""
    settings = _settings()

    try:
        summary = _run(lambda _: _use(settings, "reconciler", lambda reconciler: reconciler.run_once(max_seconds)))
    except InfrastructureUnavailable:
        typer.echo("reconcile: failed: database unavailable", err=True)
        raise typer.Exit(1) from None
    if summary is None:
        typer.echo("reconcile: another reconcile run holds the lock; nothing to do")
        return
    typer.echo(summary.line())


async def _read(settings: Settings, query: Callable[[Any], Awaitable[T]], *, commit: bool = False) -> T:
    """Run one unit of work for a CLI command; only commands that change something pass `commit=True`."""

    async def work(engine: Any) -> T:
        async with UnitOfWork(engine) as uow:
            result = await query(uow.connection)
            if commit:
                await uow.commit()
            return result

    return await _use(settings, "engine", work)


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


def _tables() -> Console:
    """A console for tables of record content (keys, ids): shown as they are, never read as Rich markup."""
    return Console(markup=False, highlight=False)


def _show(headers: Sequence[str], rows: Sequence[Sequence[str]], *, footer: str | None = None) -> None:
    """Rows for an operator: a table on a terminal (long values fold, never cut: ids are pasted into other
    commands), tab-separated values with a header line when piped (tabs and newlines inside values escaped)."""
    if sys.stdout.isatty():
        table = Table(*(Column(header, overflow="fold") for header in headers))
        for row in rows:
            table.add_row(*row)
        _tables().print(table)
    else:
        for row in (headers, *rows):
            sys.stdout.write("\t".join(value.replace("\t", "\\t").replace("\n", "\\n") for value in row) + "\n")
    if footer:
        typer.echo(footer, err=not sys.stdout.isatty())


def _utc(moment: datetime | None) -> str:
    """A timestamp in UTC, ISO 8601, to the second."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


_STATUSES = ("open", "resolved", "reprocessing", "reprocessed")


@quarantine_app.command("list")
def quarantine_list(
    error_code: Annotated[str | None, typer.Option(help="Only this error code.")] = None,
    status: Annotated[str | None, typer.Option(help="open, resolved, reprocessing or reprocessed.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Only records first failed at least this long ago (5m).")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Only records of this order key.")] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", help="Only records of this message id.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="First failed at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="First failed before (RFC 3339).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (every column) instead of a table.")] = False,
) -> None:
    """List quarantined records, oldest first (N of M shown); --csv exports the selection."""
    settings = _settings()
    if status is not None and status not in _STATUSES:
        raise typer.BadParameter(f"{status!r} is not one of {', '.join(_STATUSES)}", param_hint="--status")
    if error_code is not None and error_code not in ErrorCode.__members__:
        raise typer.BadParameter(
            f"{error_code!r} is not an error code (README, Error codes)", param_hint="--error-code"
        )
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None
    after, before = _timestamp(since, "--since"), _timestamp(until, "--until")
    rows, total = _run(
        lambda _: _read(
            settings,
            lambda c: quarantine.listing(
                c,
                error_code=error_code,
                status=status,
                older_than=age,
                key=key,
                message_id=message_id,
                since=after,
                until=before,
                limit=limit,
                offset=offset,
            ),
        )
    )
    if as_json:
        _print_json(rows)
        return
    if as_csv:
        # For a spreadsheet or a hand-over to a producing team: every column of the selection, UTC timestamps.
        writer = csv.writer(sys.stdout)
        columns = list(rows[0]) if rows else ["failure_id", "message_id", "error_code", "status"]
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_utc(v) if isinstance(v, datetime) else ("" if v is None else v) for v in row.values()])
        return
    _show(
        ("failure id", "message id", "error code", "status", "owner", "key", "attempts", "first failed (UTC)"),
        [
            (
                row["failure_id"],
                row["message_id"],
                row["error_code"],
                row["status"],
                row["owner"],
                row["order_key"] or "",
                str(row["attempts"]),
                _utc(row["first_failed_at"]),
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown" + (f" (from {offset + 1})" if offset and rows else ""),
    )


@quarantine_app.command("show")
def quarantine_show(
    failure_id: Annotated[str, typer.Argument(help="The failure id, e.g. orders/3/1200.")],
    include_payload: Annotated[bool, typer.Option(help="Also print the original bytes (base64).")] = False,
    payload_as_text: Annotated[
        bool, typer.Option("--payload-as-text", help="Also print the original bytes as text, when they are UTF-8.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show one quarantined record: envelope, attempts, annotations, timeline; for invalid input, the failing
    field and the rule it breaks (names only, never values)."""
    settings = _settings()
    row = _run(lambda _: _read(settings, lambda c: quarantine.get(c, failure_id)))
    if row is None:
        typer.echo(f"no quarantined record with failure id {failure_id}", err=True)
        raise typer.Exit(1)
    payload = row.get("payload")
    if row["error_code"] == "INVALID_FIELD":
        found = invalid_field(bytes(payload) if payload is not None else None)
        row["failing_field"] = {"path": found[0], "rule": found[1]} if found else None
    if payload_as_text and payload is not None:
        try:
            row["payload_text"] = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            row["payload_text"] = None  # not text: ask for --include-payload (base64)
    if not include_payload:
        row.pop("payload", None)
    if as_json:
        _print_json(row)
        return
    console = Console()
    for name, value in _jsonable(row).items():
        # The values come from records: never let them be read as Rich markup.
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        console.print(f"[bold]{name}[/bold]: {escape(shown)}")


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


@quarantine_app.command("annotate")
def quarantine_annotate(
    failure_id: Annotated[str, typer.Argument(help="The failure id, e.g. orders/3/1200.")],
    note: Annotated[str, typer.Option("--note", help="What you found or did.")],
    author: Annotated[str, typer.Option("--author", help="Who writes it.")],
    as_json: JsonFlag = False,
) -> None:
    """Append a note to a quarantined record (annotations are append-only)."""
    settings = _settings()
    added = _run(lambda _: _read(settings, lambda c: quarantine.annotate(c, failure_id, author, note), commit=True))
    if not added:
        typer.echo(f"no quarantined record with failure id {failure_id}", err=True)
        raise typer.Exit(1)
    if as_json:
        _print_json({"failure_id": failure_id, "annotated": True})
    else:
        typer.echo(f"{failure_id}: note added")


@quarantine_app.command("resolve")
def quarantine_resolve(
    failure_id: Annotated[
        list[str] | None, typer.Argument(help="Failure ids, e.g. orders/3/1200 (or select with the options).")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why it needs no reprocessing (kept in the audit).")] = "",
    error_code: Annotated[
        str | None, typer.Option("--error-code", help="Select the open records with this code.")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Select the open records of this order key.")] = None,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Select the open records first failed this long ago (1h).")
    ] = None,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="Failure ids, one per line ('-': standard input).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be resolved; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Resolve a selection without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", help="Who resolves it (default: $USER).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Close open records without reprocessing them, one by id or a selection (code, key, age, a file of ids),
    with --dry-run first; frees the keys they held (ORDERS_ORDERING=key)."""
    settings = _settings()
    if not reason.strip():
        raise typer.BadParameter("say why: --reason", param_hint="--reason")
    who = _actor(author)
    ids = list(failure_id or [])
    if from_file is not None:
        text = sys.stdin.read() if str(from_file) == "-" else from_file.read_text()
        ids += [line.strip() for line in text.splitlines() if line.strip()]
    selecting = error_code is not None or key is not None or older_than is not None
    if not ids and not selecting:
        raise typer.BadParameter("name failure ids, --from-file, or select with --error-code / --key / --older-than")
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None

    async def chosen(connection: Any) -> list[str]:
        if not selecting:
            return ids
        rows, _ = await quarantine.listing(
            connection, error_code=error_code, status="open", older_than=age, key=key, limit=100_000
        )
        picked = [row["failure_id"] for row in rows]
        return [one for one in picked if one in ids] if ids else picked

    selection = _run(lambda _: _read(settings, chosen))
    if dry_run or (len(selection) > 1 and not yes):
        sample = ", ".join(selection[:5]) + (" …" if len(selection) > 5 else "")
        typer.echo(f"quarantine resolve: {len(selection)} records selected" + (f": {sample}" if selection else ""))
        if dry_run or not selection:
            return
        if not sys.stdin.isatty() or not typer.confirm(f"resolve {len(selection)} records?", err=True):
            typer.echo("quarantine resolve: not confirmed (pass --yes): nothing changed", err=True)
            raise typer.Exit(1)

    async def close(connection: Any) -> dict[str, str | None]:
        outcomes: dict[str, str | None] = {}
        for one in selection:
            previous = await quarantine.resolve(connection, one, reason, who)
            if previous == "open":
                await parking.unblock_failures(connection, [one])
            outcomes[one] = previous
        return outcomes

    outcomes = _run(lambda _: _read(settings, close, commit=True))
    resolved = [one for one, previous in outcomes.items() if previous == "open"]
    if as_json:
        _print_json(
            {
                "resolved": resolved,
                "skipped": {one: previous or "not found" for one, previous in outcomes.items() if previous != "open"},
            }
        )
    else:
        for one in resolved:
            typer.echo(f"{one}: resolved")
    for one, previous in outcomes.items():
        if previous is None:
            typer.echo(f"no quarantined record with failure id {one}", err=True)
        elif previous != "open":
            typer.echo(f"{one} is {previous}, not open: nothing to resolve", err=True)
    if len(resolved) < len(outcomes) or not outcomes:
        raise typer.Exit(1)


def _actor(given: str | None) -> str:
    """Who changes something: --author, else the OS user; refused when neither is known (an audit needs one)."""
    who = (given or "").strip()
    if not who:
        try:
            who = getpass.getuser()
        except (KeyError, OSError):  # no login name and no passwd entry for this uid (some containers)
            who = ""
    if not who:
        raise typer.BadParameter("say who you are: --author (no $USER to take it from)", param_hint="--author")
    return who


class _PlainProgress:
    """Progress as plain lines on stderr (not a terminal: logs, CI, pipes)."""

    def start(self, stage: str, total: int) -> None:
        self._stage, self._total = stage, total
        typer.echo(f"reprocess {stage}: {total} items", err=True)

    def advance(self, published: int, verified: int) -> None:
        typer.echo(f"reprocess {self._stage}: published {published}, verified {verified}", err=True)

    def finish(self) -> None:
        typer.echo(f"reprocess {self._stage}: done", err=True)


class _BarProgress:
    """Progress as a rich bar on a terminal."""

    def __init__(self) -> None:
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True))
        self._task: Any = None

    def start(self, stage: str, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(f"reprocess {stage}", total=total)

    def advance(self, published: int, verified: int) -> None:
        self._progress.update(self._task, completed=verified, description=f"published {published}")

    def finish(self) -> None:
        self._progress.stop()


def _timestamp(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an RFC 3339 timestamp", param_hint=option) from None
    if moment.tzinfo is None:
        raise typer.BadParameter(f"{value!r} needs a time zone (e.g. Z)", param_hint=option)
    return moment


@app.command()
def reprocess(
    reason: Annotated[str, typer.Option("--reason", help="Why this run is needed (kept in the audit).")],
    failure_id: Annotated[
        list[str] | None, typer.Option("--failure-id", help="A failure id to reprocess (repeatable).")
    ] = None,
    error_code: Annotated[str | None, typer.Option("--error-code", help="Open records with this code.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="First failed at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="First failed before (RFC 3339).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the volume and selection; write nothing.")] = False,
    sample: Annotated[int | None, typer.Option("--sample", min=1, help="Verify a sample of N first.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Continue after the sample without asking.")] = False,
    rate: Annotated[float, typer.Option("--rate", min=0.01, help="Records per second (token bucket).")] = 10.0,
    max_failure_rate: Annotated[
        float, typer.Option("--max-failure-rate", min=0, max=1, help="Stop when more items fail again.")
    ] = 0.2,
    max_lag: Annotated[int, typer.Option("--max-lag", min=0, help="Stop when the consumer lags more.")] = 10_000,
    verify_timeout: Annotated[
        float, typer.Option("--verify-timeout", min=1, help="Seconds to wait for a verdict.")
    ] = 120,
    actor: Annotated[str | None, typer.Option("--actor", help="Who runs it (default: $USER).")] = None,
    consumer: Annotated[
        str | None, typer.Option("--consumer", help="The consumer name, when the selection spans several.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Send quarantined records back via `<source>.reprocess`: selected, checked, rate limited, verified, audited.
    It acts as the consumer and on the source topic the records were quarantined under, not as
    ORDERS_CONSUMER_NAME / ORDERS_SOURCE_TOPIC."""
    settings = _settings()
    if not (failure_id or error_code or since or until):
        raise typer.BadParameter("select something: --failure-id, --error-code, --since or --until")
    selection = Selection(
        tuple(failure_id or ()), error_code, _timestamp(since, "--since"), _timestamp(until, "--until")
    )
    settings = _as_owner_of(settings, selection, consumer)
    options = Options(
        reason=reason,
        actor=_actor(actor),
        rate=rate,
        sample=sample,
        dry_run=dry_run,
        max_failure_rate=max_failure_rate,
        max_lag=max_lag,
        verify_timeout=verify_timeout,
    )
    progress = _BarProgress() if sys.stderr.isatty() and not as_json else _PlainProgress()

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            typer.echo(f"{question} (not asked: no terminal; pass --yes)", err=True)
            return False
        return typer.confirm(question, err=True)

    report = _run(
        lambda _: _use(settings, "reprocessor", lambda runner: runner.run(selection, options, progress, confirm))
    )
    if as_json:
        _print_json(asdict(report))
    else:
        typer.echo(
            f"reprocess {report.run_id or '(dry run)'}: {report.outcome}"
            + (f" ({report.stop_reason})" if report.stop_reason else "")
            + f"; selected {report.selected}, undecodable {len(report.undecodable)}, published {report.published}, "
            f"reprocessed {report.reprocessed}, already applied {report.noop}, failed again {report.failed_again}, "
            f"unverified {report.unverified}"
        )
        for skipped in report.undecodable:
            typer.echo(f"  skipped (does not decode with today's schemas): {skipped}")
        if dry_run:
            for chosen in report.selection:
                typer.echo(f"  selected: {chosen}")
    if report.outcome == "stopped":
        raise typer.Exit(3)
    if report.unverified:
        typer.echo(
            f"reprocess: {report.unverified} items unverified (no business change seen in time): check them with "
            f"`order-service quarantine show <failure id>` and that a consumer named {settings.consumer_name} runs",
            err=True,
        )
        raise typer.Exit(1)


def _as_owner_of(settings: Settings, selection: Selection, consumer: str | None) -> Settings:
    """The settings of the consumer the selected records were quarantined under (its name and source topic)."""
    from service.store import reprocess as reprocess_store

    found = _run(
        lambda _: _read(
            settings,
            lambda c: reprocess_store.owners(
                c,
                failure_ids=selection.failure_ids,
                error_code=selection.error_code,
                since=selection.since,
                until=selection.until,
            ),
        )
    )
    pairs = [pair for pair in found if consumer in (None, pair[0])]
    if len(pairs) > 1:
        names = ", ".join(f"{name} ({topic})" for name, topic in pairs)
        typer.echo(f"reprocess: the selection spans several consumers: {names}: pass --consumer", err=True)
        raise typer.Exit(2)
    if not pairs:
        return settings if consumer is None else settings.model_copy(update={"consumer_name": consumer})
    name, topic = pairs[0]
    owner = settings.model_copy(update={"consumer_name": name, "source_topic": topic})
    typer.echo(f"reprocess: as consumer {name}, copies to {owner.topics.reprocess}", err=True)
    return owner


ConsumerOption = Annotated[
    str | None,
    typer.Option("--consumer", help="Only this consumer name (default: every consumer with records here)."),
]


@parked_app.command("list")
def parked_list(consumer: ConsumerOption = None, as_json: JsonFlag = False) -> None:
    """Held keys of every consumer (the consumer name stored with each record, not ORDERS_CONSUMER_NAME): how many
    records wait behind each, since when, and what holds the key."""
    settings = _settings()
    held = _run(lambda _: _read(settings, lambda c: parking.summary(c, consumer)))
    if as_json:
        _print_json(held)
        return
    _show(
        ("consumer", "key", "parked", "oldest parked (UTC)", "held by"),
        [
            (row["consumer_name"], row["order_key"], str(row["parked"]), _utc(row["oldest_parked_at"]), _holder(row))
            for row in held
        ],
    )


def _holder(row: dict[str, Any]) -> str:
    """What holds a key, in words an operator acts on."""
    if row["blocked_by"]:
        return f"quarantined head {row['blocked_by']}"
    if row["retrying"]:
        return f"head in a retry tier {row['retrying']}"
    if row["releasing_by"]:
        return f"nothing: being released by {row['releasing_by']}"
    return "nothing: waiting for a consumer to release it"


@parked_app.command("release")
def parked_release(
    key: Annotated[str, typer.Argument(help="The order key to free; its parked records are then applied in order.")],
    consumer: ConsumerOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Free a key whatever holds it (a quarantined head, or a head in a retry tier, which keeps retrying on its
    own), under the consumer name its records are stored with; a running consumer of that name then applies its
    parked records in order."""
    settings = _settings()

    async def release(connection: Any) -> tuple[str | None, parking.Released | None]:
        names = [name for name in await parking.holders(connection, key) if consumer in (None, name)]
        if len(names) > 1:
            return ", ".join(names), None
        chosen = names[0] if names else (consumer or settings.consumer_name)
        return chosen, await parking.release(connection, chosen, key)

    chosen, released = _run(lambda _: _read(settings, release, commit=True))
    if released is None:
        typer.echo(f"parked release: {key} is held under several consumers ({chosen}): pass --consumer", err=True)
        raise typer.Exit(2)
    if as_json:
        _print_json(
            {
                "key": key,
                "consumer": chosen,
                "released": released.freed,
                "blockedBy": released.blocked_by,
                "retrying": released.retrying,
                "parked": released.parked,
            }
        )
        return
    typer.echo(f"consumer {chosen}:", err=True)
    if released.blocked_by:
        typer.echo(f"{key}: released (was held by quarantined head {released.blocked_by}); {released.parked} parked")
    elif released.retrying:
        heads = ", ".join(released.retrying)
        typer.echo(
            f"{key}: released (was held by {heads} in a retry tier, which retries on its own); {released.parked} parked"
        )
    elif released.parked:
        typer.echo(f"{key}: nothing held it; its {released.parked} parked records are released by a running consumer")
    else:
        typer.echo(f"{key}: nothing held it and nothing is parked behind it")


_EFFECT_STATES = ("pending", "in_flight", "sent", "uncertain", "failed")


@effects_app.command("list")
def effects_list(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", help="pending, in_flight, sent, uncertain or failed (repeatable; default: all but sent)."
        ),
    ] = None,
    kind: Annotated[
        str | None, typer.Option(help="Only this kind (payment.capture, payment.refund, email.shipped).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Effects not yet sent, oldest first: what waits, on what, and why (N of M shown). An effect whose
    provider URL is unset stays pending until it is set."""
    settings = _settings()
    states = state or [s for s in _EFFECT_STATES if s != "sent"]
    for chosen in states:
        if chosen not in _EFFECT_STATES:
            raise typer.BadParameter(f"{chosen!r} is not one of {', '.join(_EFFECT_STATES)}", param_hint="--state")
    rows, total = _run(
        lambda _: _read(settings, lambda c: effects_store.listing(c, states, kind=kind, limit=limit, offset=offset))
    )
    if as_json:
        _print_json(rows)
        return
    disabled = {
        family for family, url in (("payment", settings.payments_url), ("email", settings.emails_url)) if not url
    }
    _show(
        ("effect", "kind", "state", "attempts", "last error", "next attempt (UTC)"),
        [
            (
                row["idempotency_key"],
                row["kind"],
                row["state"],
                str(row["attempts"]),
                row["last_error_code"] or ("provider not configured" if row["kind"].split(".")[0] in disabled else ""),
                _utc(row["next_attempt_at"]),
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown",
    )


@effects_app.command("show")
def effects_show(
    key: Annotated[str, typer.Argument(help="The effect's idempotency key, e.g. A-1001/payment.capture.")],
    as_json: JsonFlag = False,
) -> None:
    """One effect: its state, attempts, last error, lease, provider reference and payload."""
    settings = _settings()
    row = _run(lambda _: _read(settings, lambda c: effects_store.get(c, key)))
    if row is None:
        typer.echo(f"no effect with idempotency key {key}", err=True)
        raise typer.Exit(1)
    if as_json:
        _print_json(row)
        return
    console = _tables()
    for name, value in _jsonable(row).items():
        console.print(f"{name}: {json.dumps(value) if isinstance(value, dict | list) else value}")


@outbox_app.command("set-aside")
def outbox_set_aside(as_json: JsonFlag = False) -> None:
    """Rows Kafka refused for their content (too large): the relay passes over them; oldest first."""
    settings = _settings()
    found = _run(lambda _: _read(settings, lambda c: outbox.set_aside_rows(c)))
    if as_json:
        _print_json([asdict(row) for row in found])
        return
    _show(
        ("outbox id", "topic", "key", "code", "bytes", "set aside (UTC)"),
        [
            (str(row.id), row.topic, row.key or "", row.code, str(row.payload_bytes), _utc(row.set_aside_at))
            for row in found
        ],
    )


@outbox_app.command("put-back")
def outbox_put_back(
    row_id: Annotated[int, typer.Argument(metavar="ID", help="The outbox id `outbox set-aside` shows.")],
    as_json: JsonFlag = False,
) -> None:
    """Hand a set-aside row to the relay again, once the broker takes it (e.g. its size limit was raised)."""
    settings = _settings()
    done = _run(lambda _: _read(settings, lambda c: outbox.put_back(c, row_id), commit=True))
    if as_json:
        _print_json({"id": row_id, "put_back": done})
        return
    typer.echo(f"{row_id}: handed to the relay again" if done else f"{row_id}: no set-aside row with this id")


def main() -> None:
    """Console-script entry point."""
    command = typer.main.get_command(app)
    _plain_help(command)
    command(prog_name="order-service")


def _plain_help(command: Any) -> None:
    """Help without Python type placeholders (`<bool>`, `<list[str]>`): a flag shows nothing, an option its
    name in capitals (`--error-code CODE`), an argument its name."""
    for param in getattr(command, "params", ()):
        if param.param_type_name == "argument":
            param.display_type_rich = lambda ctx: None  # the name says what it is
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
            continue
        if param.metavar is None:
            if getattr(param, "is_flag", False):
                param.metavar = ""
            elif param.name:
                param.metavar = param.name.upper().replace("-", "_").removeprefix("AS_")
    plain = command.get_help_option

    def help_option(context: Any) -> Any:
        option = plain(context)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)
