"""`<program> console`: the operator console, served by uvicorn (contract §9)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Awaitable, Iterator
from typing import Any

import typer

from service.cli.common import assembled, configured, domain, provide, run_async, use
from service.cli.reprocess import reprocess_topic_exists
from service.config import Settings
from service.policy.operators import parse_tokens
from service.worker.reprocess_run import Options, Progress, Report, Selection


def refusal(settings: Settings) -> str | None:
    """Why the console must not start with these settings (None: it may): no token configured, or a bind
    beyond loopback without TLS termination acknowledged in front of it."""
    if not parse_tokens(settings.console_tokens.get_secret_value()):
        return (
            f"{settings.variable('console_tokens')} is not set: give at least one name:role:token (role viewer or "
            "operator, the token at least 32 characters)"
        )
    host, _ = settings.console_host_port
    if not _loopback(host) and not settings.console_behind_tls:
        return (
            f"{settings.variable('console_bind')} {settings.console_bind} is not a loopback address: put TLS in front "
            f"of the console and set {settings.variable('console_behind_tls')}=true, or bind 127.0.0.1"
        )
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _server(config: Any) -> Any:
    """uvicorn without its own signal handling: the command's (run_async) stops it, as every command's does.
    (uvicorn and the application are imported here, when the console starts, not by every command.)"""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


async def _reprocess(owner: Settings, selection: Selection, options: Options, progress: Progress) -> Report:
    """A reprocess run as `<program> reprocess` makes it: the owner consumer's container and reprocessor."""
    await reprocess_topic_exists(owner)
    return await use(owner, "reprocessor", lambda runner: runner.run(selection, options, progress, lambda _: False))


def console() -> None:
    """Serve the operator console (<PREFIX>CONSOLE_BIND, default 127.0.0.1:8088): the quarantine queue, held keys,
    effects and reprocess runs; viewers read, operators also reveal payloads and act, every action audited."""
    settings = configured(quiet=False)
    refused = refusal(settings)
    if refused is not None:
        typer.echo(f"{settings.program} console: {refused}", err=True)
        raise typer.Exit(2)
    host, port = settings.console_host_port
    try:
        listening = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, reuse_port=False
        )
    except OSError as error:
        typer.echo(f"{settings.program} console: cannot listen on {settings.console_bind}: {error.strerror}", err=True)
        raise typer.Exit(1) from None
    # Without it each response's body waits for the client's delayed acknowledgement of its head (uvicorn writes
    # them apart; docs/performance.md).
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    import uvicorn

    from service.console.app import create_app
    from service.console.web import Wiring, log

    async def serve(stop: asyncio.Event) -> None:
        async with assembled(settings, "console") as container:
            engine = await provide(container, "engine")
            wiring = Wiring(
                settings=settings,
                engine=engine,
                effect_specs=container.effect_specs(),
                failing_field=container.failing_field(),
                reprocess=_reprocess,
                codes=domain().error_codes,
                decode=container.decode(),
            )
            server = _server(
                uvicorn.Config(
                    create_app(wiring), log_config=None, access_log=False, lifespan="on", server_header=False
                )
            )
            # The console beats as every long-running process does (role `console`, no parts of its own): the
            # Processes page shows who serves it, and a killed console shows as gone.
            heartbeat = container.heartbeat(role="console")
            heartbeat = await heartbeat if isinstance(heartbeat, Awaitable) else heartbeat
            beating = asyncio.Event()
            beats = asyncio.create_task(heartbeat.run(beating))  # stopped and awaited below, whatever happens
            try:
                log.info("console.listening", url=f"http://{settings.console_bind}/")
                serving = asyncio.create_task(server.serve(sockets=[listening]))
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                server.should_exit = True
                stopping.cancel()
                await serving
            finally:
                beating.set()
                await beats

    run_async(serve)
