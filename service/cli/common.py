"""What every command shares: the domain the command line was built with, settings, running, one unit of work,
output for people and scripts."""

from __future__ import annotations

import asyncio
import getpass
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from typer.exceptions import TyperException

from service import bounds, inert, logs
from service.cli.layout import print_table, print_tsv
from service.cli.layout import tables as tables  # what every command prints tables with
from service.config import ConfigurationError, Settings, load_settings
from service.containers import Container
from service.explain import explain
from service.jsonable import jsonable
from service.moments import utc as utc  # the one timestamp style of every output
from service.ports import Domain
from service.store.uow import UnitOfWork

T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_domain: Domain | None = None  # the domain the command line was built with (set by `serve_domain`)
_loaded: Settings | None = None  # the settings of the command being run (set by `configured`)


def serve_domain(domain: Domain) -> None:
    """Make `domain` the one every command of this process serves (service/cli/__init__.py `command`)."""
    global _domain
    _domain = domain


def domain() -> Domain:
    """The domain the command line was built with."""
    if _domain is None:
        raise RuntimeError("the command line was not built from a domain (service.cli.command)")
    return _domain


def configured(*, quiet: bool = True) -> Settings:
    """The settings from the environment; a bad one is one line and exit 2. Configures logging: a short command
    (`quiet`, the default) logs warnings and errors only, unless <PREFIX>LOG_LEVEL=debug, so that no log line lands
    among the human output it prints; a long-running one logs at <PREFIX>LOG_LEVEL."""
    global _loaded
    served = domain()
    try:
        settings = load_settings(served.settings)
    except ConfigurationError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    level = settings.log_level
    if quiet and level == "info":
        level = "warning"
    logs.configure(level, served.logger_root)
    _loaded = settings
    return settings


def run_async(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine with SIGTERM/SIGINT turned into a graceful stop; a failure that ends it is one line on
    stderr and exit 1 (the stack trace only at <PREFIX>LOG_LEVEL=debug)."""

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
        names = settings if settings is not None else domain().settings
        typer.echo(f"{_command()}: {explain(error, names, metrics_port=port)}", err=True)
        raise typer.Exit(1) from None


def _command() -> str:
    """The command being run, as typed up to its first option (`<program> quarantine list`)."""
    words = []
    for word in sys.argv[1:]:
        if word.startswith("-"):
            break
        words.append(word)
    return " ".join([domain().program, *words[:2]])


@asynccontextmanager
async def assembled(settings: Settings, role: str | None = None) -> AsyncIterator[Container]:
    """The container with its resources (engine, HTTP client) open for the block, closed after it; first, the
    database must be at this version's schema (SchemaNotCurrent otherwise), so that no command reads or writes
    tables it does not know (a newer release's, say)."""
    from service.store import schema

    container = Container(settings=settings, domain=domain())
    if role is not None:
        container.role.override(role)  # its traces' `service.role` (service/tracing.py)
    await container.init_resources()  # type: ignore[misc]
    try:
        async with UnitOfWork(await provide(container, "engine")) as uow:
            await schema.require_head_on(uow.connection, domain().migrations, domain().program)
        yield container
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


# The role a one-shot command's traces name, by the part it builds (any other command: `cli`).
_ROLES = {"reconciler": "reconcile", "reprocessor": "reprocess"}


async def use(settings: Settings, name: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """Build one provider and run `work` with it, resources open."""
    async with assembled(settings, _ROLES.get(name)) as container:
        return await work(await provide(container, name))


async def provide(container: Container, name: str) -> Any:
    """The container's provider `name`, awaited when it is async."""
    provided = getattr(container, name)()
    return await provided if isinstance(provided, Awaitable) else provided


async def with_connection(settings: Settings, query: Callable[[Any], Awaitable[T]], *, commit: bool = False) -> T:
    """Run one unit of work for a CLI command; only commands that change something pass `commit=True`."""

    async def work(engine: Any) -> T:
        async with UnitOfWork(engine) as uow:
            result = await query(uow.connection)
            if commit:
                await uow.commit()
            return result

    return await use(settings, "engine", work)


def print_json(value: Any) -> None:
    """Print a value as indented JSON with sorted keys: exact values, every invisible character of record content
    as a `\\uXXXX` escape (`service.inert.json_text`)."""
    sys.stdout.write(inert.json_text(jsonable(value), indent=2, sort_keys=True) + "\n")


def echo(message: str, *, err: bool = False) -> None:
    """Print a line that names record content (a key, an id): every invisible character in it escaped
    (`service.inert.shown`), so that a key holding an escape sequence cannot act on the terminal."""
    typer.echo("\n".join(inert.shown(line) for line in message.split("\n")), err=err)


def show_rows(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, footer: str | None = None, prose: Collection[int] = ()
) -> None:
    """Rows for an operator: a table on a terminal (ids and codes never cut: they are pasted into other commands;
    the `prose` columns wrap at words; too narrow a terminal gets one block of lines per row), tab-separated values
    with a header line when piped (reversibly escaped: `service.inert.escaped`); record content escaped either way."""
    if sys.stdout.isatty():
        print_table(headers, rows, prose=prose)
    else:
        print_tsv(headers, rows)
    if footer:
        typer.echo(footer, err=not sys.stdout.isatty())


def who_acts(given: str | None) -> str:
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


def timestamp(value: str | None, option: str) -> datetime | None:
    """An RFC 3339 flag value with its time zone, or a duration ago (`2h`); anything else is a bad flag (exit 2)."""
    if value is None:
        return None
    try:
        return bounds.moment_or_ago(value, datetime.now(UTC), zone_required=True)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


ConsumerOption = Annotated[
    str | None,
    typer.Option("--consumer", help="Only this consumer name (default: every consumer with records here)."),
]
