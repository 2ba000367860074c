"""`<program> parked`: keys held behind a failed head (<PREFIX>ORDERING=key)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service import operations
from service.cli.common import (
    ConsumerOption,
    JsonFlag,
    configured,
    echo,
    print_json,
    run_async,
    show_rows,
    utc,
    who_acts,
    with_connection,
)
from service.store import parking

app = typer.Typer(help="Records parked behind a held key (<PREFIX>ORDERING=key).", no_args_is_help=True)


@app.command("list")
def parked_list(consumer: ConsumerOption = None, as_json: JsonFlag = False) -> None:
    """Held keys of every consumer (the consumer name stored with each record, not <PREFIX>CONSUMER_NAME): how many
    records wait behind each, since when, and what holds the key."""
    settings = configured()
    held = run_async(lambda _: with_connection(settings, lambda c: parking.summary(c, consumer)))
    if as_json:
        print_json(held)
        return
    show_rows(
        ("consumer", "key", "parked", "oldest parked (UTC)", "held by"),
        [
            (row["consumer_name"], row["ordering_key"], str(row["parked"]), utc(row["oldest_parked_at"]), _holder(row))
            for row in held
        ],
        prose={4},
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


@app.command("release")
def parked_release(
    key: Annotated[str, typer.Argument(help="The ordering key to free; its parked records are then applied in order.")],
    consumer: ConsumerOption = None,
    author: Annotated[str | None, typer.Option("--author", "--actor", help="Who releases it (default: $USER).")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say which consumer's key it would free; change nothing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Free a key whatever holds it (a quarantined head, or a head in a retry tier, which keeps retrying on its
    own), under the consumer name its records are stored with; a running consumer of that name then applies its
    parked records in order. A key that nothing holds and nothing waits behind exits 1."""
    settings = configured()
    who = who_acts(author)

    async def release(connection: Any) -> tuple[list[str], operations.Release | None]:
        names = await operations.key_holders(connection, key, consumer)
        if dry_run or len(names) > 1:
            return names, None
        # A key nothing holds goes through release_key all the same: the attempt is audited, having changed nothing.
        return names, await operations.release_key(connection, key, consumer, settings.consumer_name, who)

    names, outcome = run_async(lambda _: with_connection(settings, release, commit=not dry_run))
    if not names:
        under = f" under consumer {consumer}" if consumer else ""
        echo(f"parked release: nothing holds {key}{under} and nothing is parked behind it", err=True)
        raise typer.Exit(1)
    if len(names) > 1:
        typer.echo(
            f"parked release: {key} is held under several consumers ({', '.join(names)}): pass --consumer", err=True
        )
        raise typer.Exit(2)
    if outcome is None or outcome.released is None:
        if as_json:
            print_json({"key": key, "consumer": names[0], "dry_run": True})
        else:
            echo(f"parked release (dry run): would free {key} under consumer {names[0]}; nothing changed")
        return
    _report(key, outcome.consumer, outcome.released, as_json=as_json)


def _report(key: str, chosen: str, released: parking.Released, *, as_json: bool) -> None:
    """What a release freed the key from, as a line (the consumer on stderr) or a JSON document."""
    if as_json:
        print_json(
            {
                "key": key,
                "consumer": chosen,
                "released": released.freed,
                "blocked_by": released.blocked_by,
                "retrying": released.retrying,
                "parked": released.parked,
            }
        )
        return
    echo(f"consumer {chosen}:", err=True)
    if released.blocked_by:
        echo(f"{key}: released (was held by quarantined head {released.blocked_by}); {released.parked} parked")
    elif released.retrying:
        heads = ", ".join(released.retrying)
        typer.echo(
            f"{key}: released (was held by {heads} in a retry tier, which retries on its own); {released.parked} parked"
        )
    else:
        echo(f"{key}: nothing held it; its {released.parked} parked records are released by a running consumer")
