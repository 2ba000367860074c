"""The long-running commands and the one-shot ones that run a part of the service (contract §3)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable
from dataclasses import asdict
from typing import Annotated

import structlog
import typer

from service.adapters import certificates, topics
from service.cli import bounded
from service.cli.common import (
    JsonFlag,
    assembled,
    configured,
    domain,
    print_json,
    provide,
    run_async,
    use,
)
from service.config import Settings
from service.errors import InfrastructureUnavailable, SchemaNewer
from service.explain import explain, first_line
from service.policy import topics as topic_plan
from service.policy.backoff import outage_wait
from service.runtime import collect_garbage, tune_garbage_collector
from service.stopping import sleep_unless_stopped

# The topics each long-running part reads or writes itself (contract §11); the effect worker and the gauges use none.
_NEEDS = {"consumer_loop": topic_plan.CONSUMED, "relay": topic_plan.PUBLISHED}


def serve_parts(settings: Settings, *parts: str) -> None:
    """Run long-running loops until SIGTERM/SIGINT, with /metrics, /healthz and /readyz; first wait (not ready) until
    the topics they read and write exist."""
    roles = frozenset().union(*(_NEEDS.get(part, frozenset()) for part in parts))
    needed = topic_plan.named(topics.declared(settings), roles)

    async def serve(stop: asyncio.Event) -> None:
        if not await _schema_ready(settings, stop):
            return
        async with assembled(settings, role_of(parts)) as container:
            health = await provide(container, "health")
            check = await provide(container, "topics_check")
            # The heartbeat beats from here (a missing topic is its first configuration error) until the parts
            # stopped, then marks the process stopped.
            heartbeat = container.heartbeat(role=role_of(parts))
            heartbeat = await heartbeat if isinstance(heartbeat, Awaitable) else heartbeat
            await health.start()
            beating = asyncio.Event()
            beats = asyncio.create_task(heartbeat.run(beating))  # stopped and awaited below, whatever happens
            try:
                if not await check.wait(needed, stop):
                    return
                # Every long-running process also keeps the database-derived gauges fresh for its /metrics.
                loops = [await provide(container, part) for part in (*parts, "gauges")]
                heartbeat.watch(loops)
                tune_garbage_collector()
                async with asyncio.TaskGroup() as group:
                    for part in loops:
                        group.create_task(part.run(stop))
                    group.create_task(collect_garbage(stop))
                    group.create_task(certificates.watch(stop))
            finally:
                beating.set()
                await beats
                await health.stop()

    run_async(serve)


_ROLES = {"consumer_loop": "consume", "relay": "relay", "effect_worker": "effects"}


def role_of(parts: tuple[str, ...]) -> str:
    """The role a process's heartbeat names: its command (`run` for all three parts in one process)."""
    return _ROLES[parts[0]] if len(parts) == 1 and parts[0] in _ROLES else "run"


async def _schema_ready(settings: Settings, stop: asyncio.Event) -> bool:
    """Before a long-running command starts: a database that does not exist or is not at this version's schema
    ends it (one line, exit 1); one that cannot be reached is waited for, one log line per retry. False when
    stopped while waiting."""
    from service.store import schema
    from service.store.uow import is_unavailable

    failures = 0
    while not stop.is_set():
        try:
            await schema.require_head(settings.database, domain().migrations, domain().program)
            return True
        except Exception as error:
            if not is_unavailable(error):
                raise
        failures += 1
        delay = outage_wait(failures)
        structlog.get_logger("cli").warning("database_unavailable", retry_in_seconds=delay)
        await sleep_unless_stopped(stop, delay)
    return False


def migrate() -> None:
    """Bring the database schema to the latest revision of the core and of the domain's branch (`alembic upgrade
    heads`). One line says where it was and where it is (Alembic's own lines only at <PREFIX>LOG_LEVEL=debug); a
    database a newer release migrated is refused, changed in nothing."""
    from sqlalchemy.exc import SQLAlchemyError

    from service.store import schema

    settings = configured()  # Alembic's plugin and upgrade lines only at debug (service/logs.py)
    locations, program = domain().migrations, domain().program
    try:
        before = asyncio.run(schema.current_heads(settings.database))
        schema.refuse_unknown(before, locations, program)
        head = schema.upgrade_to_head(settings.database, locations)
        after = asyncio.run(schema.current_heads(settings.database))
    except SchemaNewer as error:
        typer.echo(f"migrate: {error}", err=True)
        raise typer.Exit(1) from None
    except ssl.SSLError as error:  # (a certificate that does not verify, a handshake refused)
        said = explain(error, settings)
        if said.startswith("unexpected error"):
            said = f"the database's TLS handshake failed: {first_line(error)}"
        typer.echo(f"migrate: {said}", err=True)
        raise typer.Exit(1) from None
    except OSError as error:
        typer.echo(f"migrate: database unreachable ({type(error).__name__})", err=True)
        raise typer.Exit(1) from None
    except SQLAlchemyError as error:
        said = explain(error, settings)  # a refused login, a database that does not exist: the one line for it
        if said.startswith("unexpected error"):
            said = f"failed: {first_line(getattr(error, 'orig', None) or error)}"
        typer.echo(f"migrate: {said}", err=True)
        raise typer.Exit(1) from None
    if not before:
        typer.echo(f"migrated an empty database to the latest revision ({head})")
    elif set(after) == set(before):
        typer.echo(f"database schema is at the latest revision ({head}): nothing to apply")
    else:
        typer.echo(f"migrated from {', '.join(before)} to the latest revision ({head})")


def consume() -> None:
    """Consume the source topic until SIGTERM/SIGINT, then finish in-flight work, commit and exit 0."""
    settings = configured(quiet=False)
    serve_parts(settings, "consumer_loop")


def relay() -> None:
    """Publish outbox rows to Kafka until stopped."""
    settings = configured(quiet=False)
    serve_parts(settings, "relay")


def run() -> None:
    """Consume, relay and execute effects in one process (one metrics port for all)."""
    settings = configured(quiet=False)
    serve_parts(settings, "consumer_loop", "relay", "effect_worker")


def reconcile(
    max_seconds: Annotated[
        float,
        typer.Option(
            parser=bounded.seconds, help="Time budget of the pass in seconds (1 to 86400); the rest waits for the next."
        ),
    ] = 60,
    as_json: JsonFlag = False,
) -> None:
    """One pass for cron: resolve uncertain and stale effects, purge expired inbox rows. Exit 0 unless it failed."""
    settings = configured(quiet=False)

    try:
        summary = run_async(lambda _: use(settings, "reconciler", lambda reconciler: reconciler.run_once(max_seconds)))
    except InfrastructureUnavailable:
        typer.echo("reconcile: failed: database unavailable", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json({"locked_out": True} if summary is None else {"locked_out": False, **asdict(summary)})
        return
    if summary is None:
        typer.echo("reconcile: another reconcile run holds the lock; nothing to do")
        return
    typer.echo(summary.line())
