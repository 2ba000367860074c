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
from service.worker.effect_kinds import last_error, retry_state, waiting_for

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
    unconfigured = {spec.name for spec in domain().effect_specs if not getattr(settings, spec.provider_setting)}
    show_rows(
        ("effect", "kind", "state", "attempts", "last error", "next attempt (UTC)"),
        [
            (
                row["idempotency_key"],
                row["kind"],
                row["state"],
                str(row["attempts"]),
                last_error(row, unconfigured),
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
    author: Annotated[str | None, typer.Option("--author", "--actor", help="Who retries it (default: $USER).")] = None,
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

    selection = run_async(
        lambda _: with_connection(settings, lambda c: operations.failed_effects(c, key or [], kind, after, before))
    )
    if dry_run:
        # The real run's decisions on the rows as they are now: what it would retry, and each key it would refuse.
        outcomes = run_async(
            lambda _: with_connection(settings, lambda c: operations.retry_preview(c, selection, destination, waiting))
        )
        if as_json:
            print_json({**_retry_document(outcomes), "dry_run": True})
        else:
            found = [one for one, (_, goes_to) in outcomes.items() if goes_to]
            go_ahead("effects retry", "retry", found, dry_run=True, yes=yes, noun="effects")
        _refusals(outcomes)
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
    if as_json:
        print_json(_retry_document(outcomes))
    else:
        program = domain().program
        for one, (_, goes_to) in outcomes.items():
            if goes_to == "pending":
                typer.echo(f"{one}: pending: the effect worker calls it again")
            elif goes_to:
                typer.echo(
                    f"{one}: uncertain: the next `{program} reconcile` looks it up, and sends it only if not found"
                )
    _refusals(outcomes)


Outcomes = dict[str, tuple[str | None, str | None]]


def _retry_document(outcomes: Outcomes) -> dict[str, Any]:
    """A retry's outcomes (or its dry run's) as `--json` prints them: the keys are names, never data (contract
    §10), so each effect is an object naming its key."""
    return {
        "retried": [{"key": one, "state": goes_to} for one, (_, goes_to) in outcomes.items() if goes_to],
        "skipped": [
            {"key": one, "reason": was or "not found"} for one, (was, goes_to) in outcomes.items() if not goes_to
        ],
    }


def _refusals(outcomes: Outcomes) -> None:
    """A line on stderr for each key a retry (or its dry run) leaves as it is, and then exit 1 if there is one."""
    program = domain().program
    for one, (was, went) in outcomes.items():
        if was is None:
            echo(_no_effect(one), err=True)
        elif went is None and was.startswith("failed"):
            echo(f"{one}: not retried: {was}", err=True)
        elif went is None:
            hint = f"; `{program} reconcile` resolves it" if was == "uncertain" else ""
            echo(f"{one} is {was}, not failed: nothing to retry{hint}", err=True)
    if any(went is None for _, went in outcomes.values()):
        raise typer.Exit(1)


def _no_effect(key: str) -> str:
    """The line naming a key that names no effect."""
    return f"no effect with idempotency key {key}"
