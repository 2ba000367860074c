"""Selecting quarantined records for a bulk command (ids, a file of ids, code, key, age, owner, a range of
first-failed times), and asking first."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from service import bounds
from service.cli.common import domain, echo, timestamp
from service.durations import time_range
from service.operations import Picked, SelectionTooLarge, SeveralConsumers, Wanted

CodeOption = Annotated[str | None, typer.Option("--error-code", help="Select the open records with this code.")]
KeyOption = Annotated[str | None, typer.Option("--key", help="Select the open records of this ordering key.")]
AgeOption = Annotated[
    str | None, typer.Option("--older-than", help="Select the open records first failed this long ago (1h).")
]
OwnerOption = Annotated[
    str | None, typer.Option("--owner", help="Select the open records this owner owns (the console's owner).")
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Select the records first failed at or after this (RFC 3339, or a duration ago: 2h)."),
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help="Select the records first failed before this (RFC 3339, or a duration ago: 30m)."),
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
    """An --older-than value as a duration, at most 100 years (exit 2 otherwise)."""
    try:
        return bounds.age(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None


def wanted_of(
    ids: list[str] | None,
    from_file: Path | None,
    error_code: str | None,
    key: str | None,
    older_than: str | None,
    consumer: str | None = None,
    *,
    owner: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Wanted:
    """What the flags ask for (a bad one is exit 2), with the file of ids read."""
    named = list(ids or [])
    if from_file is not None:
        try:
            text = sys.stdin.read() if str(from_file) == "-" else from_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise typer.BadParameter(f"cannot read {from_file}: {error}", param_hint="--from-file") from None
        named += [line.strip() for line in text.splitlines() if line.strip()]
    for one in named:
        try:
            bounds.text(one)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--from-file" if from_file else "FAILURE_ID") from None
    check_code(error_code)
    after, before = first_failed_range(since, until)
    wanted = Wanted(
        tuple(dict.fromkeys(named)), error_code, key, age_of(older_than), consumer or None, owner or None, after, before
    )
    if not wanted.ids and not wanted.selecting:
        raise typer.BadParameter(
            "name failure ids, --from-file, or select with --error-code / --key / --older-than / --owner / --since / "
            "--until"
        )
    return wanted


def first_failed_range(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """The --since / --until flags as a range of first-failed times; one that ends before it starts is exit 2."""
    try:
        return time_range(timestamp(since, "--since"), timestamp(until, "--until"))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--until") from None


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
    echo(f"{command}: {len(selection)} {noun} selected: {sample}")
    if dry_run:
        return False
    if not sys.stdin.isatty() or not typer.confirm(f"{verb} {len(selection)} {noun}?", err=True):
        typer.echo(f"{command}: not confirmed (pass --yes): nothing changed", err=True)
        raise typer.Exit(1)
    return True
