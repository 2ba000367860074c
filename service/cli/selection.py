"""Selecting quarantined records for a bulk command (ids, a file of ids, code, key, age), and asking first."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.common import domain
from service.durations import parse_duration
from service.operations import Picked, SelectionTooLarge, SeveralConsumers, Wanted

CodeOption = Annotated[str | None, typer.Option("--error-code", help="Select the open records with this code.")]
KeyOption = Annotated[str | None, typer.Option("--key", help="Select the open records of this ordering key.")]
AgeOption = Annotated[
    str | None, typer.Option("--older-than", help="Select the open records first failed this long ago (1h).")
]
OwnerOption = Annotated[
    str | None, typer.Option("--owner", help="Select the open records routed to this owner (README, Error codes).")
]
FileOption = Annotated[
    Path | None, typer.Option("--from-file", help="Failure ids, one per line ('-': standard input).")
]
RecordConsumerOption = Annotated[
    str | None,
    typer.Option(
        "--consumer",
        help="The consumer name whose records these are: needed when a failure id, or the selection, is quarantined "
        "under several consumer names (each keeps its own record); without it such a selection is refused (exit 2).",
    ),
]


def check_code(error_code: str | None) -> None:
    """An --error-code value must be a known code (exit 2 otherwise)."""
    if error_code is not None and error_code not in domain().error_codes:
        raise typer.BadParameter(
            f"{error_code!r} is not an error code (README, Error codes)", param_hint="--error-code"
        )


def age_of(older_than: str | None) -> timedelta | None:
    """An --older-than value as a duration (exit 2 when it is not one)."""
    try:
        return parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None


def wanted_of(
    ids: list[str] | None,
    from_file: Path | None,
    error_code: str | None,
    key: str | None,
    older_than: str | None,
    consumer: str | None = None,
    owner: str | None = None,
) -> Wanted:
    """What the flags ask for (a bad one is exit 2), with the file of ids read."""
    named = list(ids or [])
    if from_file is not None:
        try:
            text = sys.stdin.read() if str(from_file) == "-" else from_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise typer.BadParameter(f"cannot read {from_file}: {error}", param_hint="--from-file") from None
        named += [line.strip() for line in text.splitlines() if line.strip()]
    check_code(error_code)
    wanted = Wanted(tuple(dict.fromkeys(named)), error_code, key, age_of(older_than), consumer or None, owner or None)
    if not wanted.ids and not wanted.selecting:
        raise typer.BadParameter(
            "name failure ids, --from-file, or select with --error-code / --key / --older-than / --owner"
        )
    return wanted


async def picked(connection: Any, wanted: Wanted, command: str) -> Picked:
    """The records a selection means now; one too large, or several consumers' without --consumer, is exit 2."""
    try:
        return await wanted.pick(connection)
    except SelectionTooLarge as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    except SeveralConsumers as error:
        typer.echo(f"{command}: {error}: pass --consumer", err=True)
        raise typer.Exit(2) from None


def go_ahead(command: str, verb: str, selection: list[str], *, dry_run: bool, yes: bool, noun: str = "records") -> bool:
    """Say what a dry run or a selection of several would change; for a real run of several, ask (or take
    --yes). False: do nothing (a dry run, or nothing selected: a filter that selects nothing is no error, dry run
    or not). Not confirmed: exit 1, nothing changed. Confirmed, the caller acts on `selection` itself, never on its
    filters again: what was counted is what changes."""
    if not selection:
        typer.echo(f"{command}: no {noun} selected: nothing changed", err=True)
        return False
    if not dry_run and (len(selection) == 1 or yes):
        return True
    sample = ", ".join(selection[:5]) + (" …" if len(selection) > 5 else "")
    typer.echo(f"{command}: {len(selection)} {noun} selected: {sample}")
    if dry_run:
        return False
    if not sys.stdin.isatty() or not typer.confirm(f"{verb} {len(selection)} {noun}?", err=True):
        typer.echo(f"{command}: not confirmed (pass --yes): nothing changed", err=True)
        raise typer.Exit(1)
    return True
