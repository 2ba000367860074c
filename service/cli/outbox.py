"""`<program> outbox`: rows the relay set aside."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer

from service.bounds import BIGINT_MAX
from service.cli.common import (
    JsonFlag,
    configured,
    print_json,
    run_async,
    show_rows,
    utc,
    who_acts,
    with_connection,
)
from service.store import audit, outbox

app = typer.Typer(help="Outbox rows the relay set aside (Kafka refused them).", no_args_is_help=True)


@app.command("set-aside")
def outbox_set_aside(as_json: JsonFlag = False) -> None:
    """Rows Kafka refused for their content (too large): the relay passes over them; oldest first."""
    settings = configured()
    found = run_async(lambda _: with_connection(settings, lambda c: outbox.set_aside_rows(c)))
    if as_json:
        print_json([asdict(row) for row in found])
        return
    show_rows(
        ("outbox id", "topic", "key", "code", "bytes", "set aside (UTC)"),
        [
            (str(row.id), row.topic, row.key or "", row.code, str(row.payload_bytes), utc(row.set_aside_at))
            for row in found
        ],
    )


@app.command("put-back")
def outbox_put_back(
    row_id: Annotated[
        int, typer.Argument(metavar="ID", min=1, max=BIGINT_MAX, help="The outbox id `outbox set-aside` shows.")
    ],
    author: Annotated[
        str | None, typer.Option("--author", "--actor", help="Who puts it back (default: $USER).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say whether it would be put back; change nothing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Hand a set-aside row to the relay again, once the broker takes it (e.g. its size limit was raised); an id
    with no set-aside row exits 1."""
    settings = configured()
    who = who_acts(author)

    async def put_back(connection: Any) -> bool:
        if dry_run:
            return await outbox.is_set_aside(connection, row_id)
        done = await outbox.put_back(connection, row_id)
        await audit.record(connection, who, "outbox.put_back", {"id": row_id}, {"put_back": done})
        return done

    found = run_async(lambda _: with_connection(settings, put_back, commit=not dry_run))
    if not found:
        typer.echo(f"outbox put-back: no set-aside row with id {row_id}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json({"id": row_id, "put_back": not dry_run, **({"dry_run": True} if dry_run else {})})
    elif dry_run:
        typer.echo(f"outbox put-back (dry run): {row_id} would be handed to the relay again; nothing changed")
    else:
        typer.echo(f"{row_id}: handed to the relay again")
