"""`<program> effects`: the effect worker and the effects ledger."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service import operations
from service.bounds import BIGINT_MAX
from service.cli.common import (
    JsonFlag,
    configured,
    domain,
    echo,
    print_json,
    run_async,
    show_rows,
    utc,
    who_acts,
    with_connection,
)
from service.cli.layout import print_sections
from service.cli.selection import first_failed_range, go_ahead
from service.cli.serve import serve_parts
from service.store import effects as effects_store
from service.worker.effect_kinds import retry_state, waiting_for

app = typer.Typer(help="Execute pending external effects until stopped; `effects list` shows the ledger.")


@app.callback(invoke_without_command=True)
def effects(context: typer.Context) -> None:
    """Execute pending external effects (<kinds>) until stopped; `effects list` shows the ledger."""
    if context.invoked_subcommand is not None:
        return
    settings = configured(quiet=False)
    serve_parts(settings, "effect_worker")


@app.command("list")
def effects_list(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", help="pending, in_flight, sent, uncertain or failed (repeatable; default: all but sent)."
        ),
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only this kind (<kinds>).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, max=BIGINT_MAX, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Effects not yet sent, oldest first: what waits, on what, and why (N of M shown). An effect whose
    provider URL is unset stays pending until it is set."""
    settings = configured()
    states = state or [s for s in effects_store.STATES if s != "sent"]
    for chosen in states:
        if chosen not in effects_store.STATES:
            raise typer.BadParameter(
                f"{chosen!r} is not one of {', '.join(effects_store.STATES)}", param_hint="--state"
            )
    rows, total = run_async(
        lambda _: with_connection(
            settings, lambda c: effects_store.listing(c, states, kind=kind, limit=limit, offset=offset)
        )
    )
    if as_json:
        print_json(rows)
        return
    disabled = {spec.name for spec in domain().effect_specs if not getattr(settings, spec.provider_setting)}
    show_rows(
        ("effect", "kind", "state", "attempts", "last error", "next attempt (UTC)"),
        [
            (
                row["idempotency_key"],
                row["kind"],
                row["state"],
                str(row["attempts"]),
                row["last_error_code"] or ("provider not configured" if row["kind"] in disabled else ""),
                utc(row["next_attempt_at"]),
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown",
        prose={4},
    )


@app.command("show")
def effects_show(
    key: Annotated[str, typer.Argument(help="The effect's idempotency key, e.g. A-1001/<kind>.")],
    as_json: JsonFlag = False,
) -> None:
    """One effect: its state, attempts, last error, lease, provider reference and payload."""
    settings = configured()
    row = run_async(lambda _: with_connection(settings, lambda c: effects_store.get(c, key)))
    if row is None:
        echo(_no_effect(key), err=True)
        raise typer.Exit(1)
    if as_json:
        print_json(row)
        return
    print_sections(row)


@app.command("retry")
def effects_retry(
    key: Annotated[
        list[str] | None, typer.Argument(help="Idempotency keys of failed effects (or select with --kind).")
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Select every failed effect of this kind.")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Select the effects that failed at or after this (RFC 3339, or a duration ago)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Select the effects that failed before this (RFC 3339, or a duration ago)."),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why it should be tried again (kept in the audit).")] = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be retried; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Retry a selection without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", help="Who retries it (default: $USER).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Try failed effects again, audited, with a fresh budget: an effect whose provider takes its idempotency key is
    called again (a second call cannot act twice); any other is first looked up by the next `<program> reconcile`
    and made again only if the provider has no trace of it."""
    settings = configured()
    if not reason.strip():
        raise typer.BadParameter("say why: --reason", param_hint="--reason")
    after, before = first_failed_range(since, until)
    if not key and kind is None and after is None and before is None:
        raise typer.BadParameter("name idempotency keys, or select with --kind, --since or --until")
    who = who_acts(author)

    registered = domain().effect_specs
    specs = {spec.name: spec for spec in registered}
    waiting = waiting_for(registered)

    def destination(kind: str) -> str:
        return retry_state(specs.get(kind))

    async def look(connection: Any) -> tuple[list[str], list[str]]:
        selection = await operations.failed_effects(connection, key or [], kind, after, before)
        return selection, await operations.unknown_effects(connection, selection) if dry_run else []

    selection, unknown = run_async(lambda _: with_connection(settings, look))
    if dry_run:
        # What the real run would do: retry the effects that exist, and name (exit 1) each key that names none.
        found = [one for one in selection if one not in unknown]
        go_ahead("effects retry", "retry", found, dry_run=True, yes=yes, noun="effects")
        for one in unknown:
            echo(_no_effect(one), err=True)
        if unknown:
            raise typer.Exit(1)
        return
    if not go_ahead("effects retry", "retry", selection, dry_run=False, yes=yes, noun="effects"):
        return

    outcomes = run_async(
        lambda _: with_connection(
            settings,
            lambda c: operations.retry_effects(c, selection, kind, reason, who, destination, waiting),
            commit=True,
        )
    )
    retried = {one: goes_to for one, (_, goes_to) in outcomes.items() if goes_to}
    if as_json:
        print_json(
            {
                "retried": retried,
                "skipped": {one: was or "not found" for one, (was, goes_to) in outcomes.items() if not goes_to},
            }
        )
    else:
        program = domain().program
    for one, goes_to in retried.items():
        typer.echo(
            f"{one}: pending: the effect worker calls it again"
            if goes_to == "pending"
            else f"{one}: uncertain: the next `{program} reconcile` looks it up, and sends it only if not found"
        )
    for one, (was, went) in outcomes.items():
        if was is None:
            echo(_no_effect(one), err=True)
        elif went is None and was.startswith("failed"):
            echo(f"{one}: not retried: {was}", err=True)
        elif went is None:
            hint = f"; `{program} reconcile` resolves it" if was == "uncertain" else ""
            echo(f"{one} is {was}, not failed: nothing to retry{hint}", err=True)
    if len(retried) < len(outcomes):
        raise typer.Exit(1)


def _no_effect(key: str) -> str:
    """The line naming a key that names no effect."""
    return f"no effect with idempotency key {key}"
