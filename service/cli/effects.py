"""`order-service effects`: the effect worker and the effects ledger."""

from __future__ import annotations

import json
from typing import Annotated, TypeVar

import typer

from service.cli.common import (
    JsonFlag,
    configured,
    jsonable,
    print_json,
    run_async,
    show_rows,
    tables,
    utc,
    with_connection,
)
from service.cli.serve import serve_parts
from service.store import effects as effects_store

T = TypeVar("T")

app = typer.Typer(help="Execute pending external effects until stopped; `effects list` shows the ledger.")

_EFFECT_STATES = ("pending", "in_flight", "sent", "uncertain", "failed")


@app.callback(invoke_without_command=True)
def effects(context: typer.Context) -> None:
    """Execute pending external effects (payments, emails) until stopped; `effects list` shows the ledger."""
    if context.invoked_subcommand is not None:
        return
    settings = configured()
    serve_parts(settings, "effect_worker")


@app.command("list")
def effects_list(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", help="pending, in_flight, sent, uncertain or failed (repeatable; default: all but sent)."
        ),
    ] = None,
    kind: Annotated[
        str | None, typer.Option(help="Only this kind (payment.capture, payment.refund, email.shipped).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Effects not yet sent, oldest first: what waits, on what, and why (N of M shown). An effect whose
    provider URL is unset stays pending until it is set."""
    settings = configured()
    states = state or [s for s in _EFFECT_STATES if s != "sent"]
    for chosen in states:
        if chosen not in _EFFECT_STATES:
            raise typer.BadParameter(f"{chosen!r} is not one of {', '.join(_EFFECT_STATES)}", param_hint="--state")
    rows, total = run_async(
        lambda _: with_connection(
            settings, lambda c: effects_store.listing(c, states, kind=kind, limit=limit, offset=offset)
        )
    )
    if as_json:
        print_json(rows)
        return
    disabled = {
        family for family, url in (("payment", settings.payments_url), ("email", settings.emails_url)) if not url
    }
    show_rows(
        ("effect", "kind", "state", "attempts", "last error", "next attempt (UTC)"),
        [
            (
                row["idempotency_key"],
                row["kind"],
                row["state"],
                str(row["attempts"]),
                row["last_error_code"] or ("provider not configured" if row["kind"].split(".")[0] in disabled else ""),
                utc(row["next_attempt_at"]),
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown",
    )


@app.command("show")
def effects_show(
    key: Annotated[str, typer.Argument(help="The effect's idempotency key, e.g. A-1001/payment.capture.")],
    as_json: JsonFlag = False,
) -> None:
    """One effect: its state, attempts, last error, lease, provider reference and payload."""
    settings = configured()
    row = run_async(lambda _: with_connection(settings, lambda c: effects_store.get(c, key)))
    if row is None:
        typer.echo(f"no effect with idempotency key {key}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json(row)
        return
    console = tables()
    for name, value in jsonable(row).items():
        console.print(f"{name}: {json.dumps(value) if isinstance(value, dict | list) else value}")
