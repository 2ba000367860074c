"""The `order-service` command line (contract §3): one typer application, a module per command group."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli import console, effects, outbox, parked, quarantine, reprocess, serve, topics
from service.cli.environment import describe
from service.containers import SETTINGS
from service.names import PROGRAM

app = typer.Typer(
    name=PROGRAM,
    help="Apply order events from Kafka to PostgreSQL; every record reaches a known terminal state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(serve.migrate)
app.command()(serve.consume)
app.command()(serve.relay)
app.add_typer(effects.app, name="effects")
app.command()(serve.run)
app.command()(serve.reconcile)
app.add_typer(quarantine.app, name="quarantine")
app.add_typer(reprocess.app, name="reprocess")
app.add_typer(parked.app, name="parked")
app.add_typer(outbox.app, name="outbox")
app.add_typer(topics.app, name="topics")
app.command()(console.console)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # slow to import, and only --version needs it

        typer.echo(f"{PROGRAM} {version(PROGRAM)}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Apply order events from Kafka to PostgreSQL; every record reaches a known terminal state."""


def main() -> None:
    """Console-script entry point."""
    command = typer.main.get_command(app)
    plain_help(command)
    describe(command, SETTINGS)
    command(prog_name=PROGRAM)


def plain_help(command: Any) -> None:
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
        plain_help(sub)
