"""`<program> quarantine erase`: remove quarantined records' original bytes and header values on request."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from service import erasing
from service.cli.common import JsonFlag, configured, print_json, run_async, who_acts, with_connection
from service.cli.selection import FileOption, go_ahead, wanted_of
from service.operations import SeveralConsumers
from service.store.quarantine import RecordKey

COMMAND = "quarantine erase"


def quarantine_erase(
    failure_id: Annotated[
        list[str] | None, typer.Argument(help="Failure ids, <topic>/<partition>/<offset> (or --key).")
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="Every record of this ordering key, whatever its status.")
    ] = None,
    from_file: FileOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be erased; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Erase a selection of several without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", help="Who erases (default: $USER).")] = None,
    consumer: Annotated[
        str | None,
        typer.Option(
            "--consumer",
            help="Only this consumer name's records. A failure id several consumer names quarantined needs it (exit 2 "
            "without); --key without it takes the key's records of every consumer name.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove the original bytes and header values of the records named (ids, a file of ids, or every record of
    one ordering key, open or closed); their facts stay, marked erased, and the erasure is audited. An erased record
    cannot be reprocessed. A named failure id with no record exits 1, in a dry run too; a key nothing holds
    selects nothing (exit 0)."""
    settings = configured()
    who = who_acts(author)
    if key is not None and (failure_id or from_file is not None):
        raise typer.BadParameter("name failure ids or --key, not both", param_hint="--key")
    if key is not None and not key:
        raise typer.BadParameter("the key is empty", param_hint="--key")
    ids = () if key is not None else wanted_of(failure_id, from_file, None, None, None, consumer).ids
    selection = erasing.ErasureSelection(ids, key, consumer or None)

    async def choose(connection: AsyncConnection) -> tuple[erasing.Picked, list[RecordKey]]:
        try:
            chosen = await selection.pick(connection)
        except SeveralConsumers as error:
            typer.echo(f"{COMMAND}: {error}: pass --consumer", err=True)
            raise typer.Exit(2) from None
        return chosen, await erasing.already_erased(connection, chosen)

    chosen, before = run_async(lambda _: with_connection(settings, choose))
    names = [record.failure_id for record in chosen.records]
    if dry_run:
        if as_json:
            print_json(
                {
                    "dry_run": True,
                    "selected": [_named(record) for record in chosen.records],
                    "already_erased": [_named(record) for record in before],
                    "missing": chosen.missing,
                }
            )
        else:
            go_ahead(COMMAND, "erase", names, dry_run=True, yes=False)
        _missing(chosen)
        return
    if not names:
        if not as_json:
            typer.echo(f"{COMMAND}: no records selected: nothing changed", err=True)
    elif as_json and len(names) > 1 and not yes:
        typer.echo(f"{COMMAND}: {len(names)} records selected: pass --yes to erase them with --json", err=True)
        raise typer.Exit(1)
    elif not as_json and not go_ahead(COMMAND, "erase", names, dry_run=False, yes=yes):
        return
    erased, already = run_async(
        lambda _: with_connection(settings, lambda c: erasing.erase(c, selection, chosen, who), commit=True)
    )
    if as_json:
        print_json(
            {
                "dry_run": False,
                "erased": [_named(record) for record in erased],
                "already_erased": [_named(record) for record in already],
                "missing": chosen.missing,
            }
        )
    else:
        for record in erased:
            typer.echo(f"{record.failure_id}: erased")
        for record in already:
            typer.echo(f"{record.failure_id}: erased already")
    _missing(chosen)


def _named(record: RecordKey) -> dict[str, str]:
    return {"consumer": record.consumer_name, "failure_id": record.failure_id}


def _missing(chosen: erasing.Picked) -> None:
    """Name each failure id that has no record, and exit 1 if there is one."""
    for one in chosen.missing:
        typer.echo(f"no quarantined record with failure id {one}", err=True)
    if chosen.missing:
        raise typer.Exit(1)
