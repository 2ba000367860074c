"""The command line (contract §3), built from a domain: one typer application, a module per command group.

The help texts of the command groups name the program, its variables and the domain's effect kinds by
placeholders (`<program>`, `<PREFIX>`, `<kinds>`, `<kind>`), which `command` fills in from the `Domain`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli import common, console, edits, effects, outbox, parked, quarantine, reprocess, serve, status, topics
from service.cli.environment import describe
from service.ports import Domain


def application(domain: Domain) -> typer.Typer:
    """The typer application of the service `domain` describes; its commands serve that domain."""
    common.serve_domain(domain)
    app = typer.Typer(
        name=domain.program,
        help=domain.summary,
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
    edits.register(quarantine.app)
    app.add_typer(quarantine.app, name="quarantine")
    app.add_typer(reprocess.app, name="reprocess")
    app.add_typer(parked.app, name="parked")
    app.add_typer(outbox.app, name="outbox")
    app.add_typer(topics.app, name="topics")
    app.command()(console.console)
    app.command()(status.status)

    app.callback(help=domain.summary)(_main)
    return app


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # slow to import, and only --version needs it

        program = common.domain().program
        typer.echo(f"{program} {version(program)}")
        raise typer.Exit()


def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """The service's commands."""


def command(domain: Domain) -> Any:
    """The click command of the service `domain` describes: help without type placeholders, each command's
    variables listed, the domain's names in the help texts."""
    built = typer.main.get_command(application(domain))
    plain_help(built)
    describe(built, domain.settings)
    name_in_help(built, domain)
    return built


def main(domain: Domain) -> None:
    """Run the command line of the service `domain` describes (its console script's entry point). A bad flag or
    argument is one line on stderr naming the command and what it takes, exit 2 (contract §10), not a usage box."""
    import sys

    from typer.exceptions import TyperException

    try:
        code = command(domain).main(prog_name=domain.program, standalone_mode=False)
    except typer.Abort:
        typer.echo("aborted: nothing changed", err=True)
        sys.exit(1)
    except TyperException as error:  # typer's click exceptions: a usage error, a bad parameter
        message = error.format_message()
        if "\n" in message.strip():  # a group named without a command: its help is the answer
            error.show()  # type: ignore[attr-defined]
        else:
            context = getattr(error, "ctx", None)
            path = context.command_path if context is not None else domain.program
            said = " ".join(message.split()).replace(": Value error, ", ": ")
            typer.echo(f"{path}: {said} (see {path} --help)", err=True)
        sys.exit(getattr(error, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


def name_in_help(command: Any, domain: Domain) -> None:
    """Fill the help texts' placeholders with the domain's names."""
    kinds = [spec.name for spec in domain.effect_specs]
    names = {
        "<program>": domain.program,
        "<PREFIX>": domain.env_prefix,
        "<kinds>": ", ".join(kinds),
        "<kind>": kinds[0] if kinds else "kind",
    }

    def filled(text: str | None) -> str | None:
        if text:
            for placeholder, name in names.items():
                text = text.replace(placeholder, name)
        return text

    command.help = filled(command.help)
    command.short_help = filled(command.short_help)
    command.epilog = filled(command.epilog)
    for param in getattr(command, "params", ()):
        if getattr(param, "help", None):
            param.help = filled(param.help)
    for sub in getattr(command, "commands", {}).values():
        name_in_help(sub, domain)


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
