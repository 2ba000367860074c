"""`order-service quarantine`: the quarantine queue."""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.cli.common import (
    JsonFlag,
    configured,
    jsonable,
    print_json,
    run_async,
    show_rows,
    timestamp,
    utc,
    who_acts,
    with_connection,
)
from service.domain.codes import ErrorCode
from service.domain.messages import invalid_field
from service.durations import parse_duration
from service.store import parking, quarantine

T = TypeVar("T")

app = typer.Typer(help="Operate the quarantine queue.", no_args_is_help=True)

_STATUSES = ("open", "resolved", "reprocessing", "reprocessed")


@app.command("list")
def quarantine_list(
    error_code: Annotated[str | None, typer.Option(help="Only this error code.")] = None,
    status: Annotated[str | None, typer.Option(help="open, resolved, reprocessing or reprocessed.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Only records first failed at least this long ago (5m).")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Only records of this order key.")] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", help="Only records of this message id.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="First failed at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="First failed before (RFC 3339).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (every column) instead of a table.")] = False,
) -> None:
    """List quarantined records, oldest first (N of M shown); --csv exports the selection."""
    settings = configured()
    if status is not None and status not in _STATUSES:
        raise typer.BadParameter(f"{status!r} is not one of {', '.join(_STATUSES)}", param_hint="--status")
    if error_code is not None and error_code not in ErrorCode.__members__:
        raise typer.BadParameter(
            f"{error_code!r} is not an error code (README, Error codes)", param_hint="--error-code"
        )
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None
    after, before = timestamp(since, "--since"), timestamp(until, "--until")
    rows, total = run_async(
        lambda _: with_connection(
            settings,
            lambda c: quarantine.listing(
                c,
                error_code=error_code,
                status=status,
                older_than=age,
                key=key,
                message_id=message_id,
                since=after,
                until=before,
                limit=limit,
                offset=offset,
            ),
        )
    )
    if as_json:
        print_json(rows)
        return
    if as_csv:
        # For a spreadsheet or a hand-over to a producing team: every column of the selection, UTC timestamps.
        writer = csv.writer(sys.stdout)
        columns = list(rows[0]) if rows else ["failure_id", "message_id", "error_code", "status"]
        writer.writerow(columns)
        for row in rows:
            writer.writerow([utc(v) if isinstance(v, datetime) else ("" if v is None else v) for v in row.values()])
        return
    show_rows(
        ("failure id", "message id", "error code", "status", "owner", "key", "attempts", "first failed (UTC)"),
        [
            (
                row["failure_id"],
                row["message_id"],
                row["error_code"],
                row["status"],
                row["owner"],
                row["order_key"] or "",
                str(row["attempts"]),
                utc(row["first_failed_at"]),
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown" + (f" (from {offset + 1})" if offset and rows else ""),
    )


@app.command("show")
def quarantine_show(
    failure_id: Annotated[str, typer.Argument(help="The failure id, e.g. orders/3/1200.")],
    include_payload: Annotated[bool, typer.Option(help="Also print the original bytes (base64).")] = False,
    payload_as_text: Annotated[
        bool, typer.Option("--payload-as-text", help="Also print the original bytes as text, when they are UTF-8.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show one quarantined record: envelope, attempts, annotations, timeline; for invalid input, the failing
    field and the rule it breaks (names only, never values)."""
    settings = configured()
    row = run_async(lambda _: with_connection(settings, lambda c: quarantine.get(c, failure_id)))
    if row is None:
        typer.echo(f"no quarantined record with failure id {failure_id}", err=True)
        raise typer.Exit(1)
    payload = row.get("payload")
    if row["error_code"] == "INVALID_FIELD":
        found = invalid_field(bytes(payload) if payload is not None else None)
        row["failing_field"] = {"path": found[0], "rule": found[1]} if found else None
    if payload_as_text and payload is not None:
        try:
            row["payload_text"] = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            row["payload_text"] = None  # not text: ask for --include-payload (base64)
    if not include_payload:
        row.pop("payload", None)
    if as_json:
        print_json(row)
        return
    console = Console()
    for name, value in jsonable(row).items():
        # The values come from records: never let them be read as Rich markup.
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        console.print(f"[bold]{name}[/bold]: {escape(shown)}")


@app.command("stats")
def quarantine_stats(as_json: JsonFlag = False) -> None:
    """Counts and rates per error code and owner, and the age of the oldest open record."""
    settings = configured()
    summary = run_async(lambda _: with_connection(settings, quarantine.stats))
    if as_json:
        print_json(summary)
        return
    age = summary["oldest_open_age_seconds"]
    console = Console()
    console.print(f"open: {summary['open']}   oldest open: {timedelta(seconds=int(age)) if age is not None else '-'}")
    table = Table("error code", "owner", "open", "total", "last hour")
    for group in summary["by_code"]:
        table.add_row(
            group["error_code"],
            group["owner"],
            str(group["open"]),
            str(group["total"]),
            str(group["rate_per_hour"]),
        )
    console.print(table)


@app.command("annotate")
def quarantine_annotate(
    failure_id: Annotated[str, typer.Argument(help="The failure id, e.g. orders/3/1200.")],
    note: Annotated[str, typer.Option("--note", help="What you found or did.")],
    author: Annotated[str, typer.Option("--author", help="Who writes it.")],
    as_json: JsonFlag = False,
) -> None:
    """Append a note to a quarantined record (annotations are append-only)."""
    settings = configured()
    added = run_async(
        lambda _: with_connection(settings, lambda c: quarantine.annotate(c, failure_id, author, note), commit=True)
    )
    if not added:
        typer.echo(f"no quarantined record with failure id {failure_id}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json({"failure_id": failure_id, "annotated": True})
    else:
        typer.echo(f"{failure_id}: note added")


@app.command("resolve")
def quarantine_resolve(
    failure_id: Annotated[
        list[str] | None, typer.Argument(help="Failure ids, e.g. orders/3/1200 (or select with the options).")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why it needs no reprocessing (kept in the audit).")] = "",
    error_code: Annotated[
        str | None, typer.Option("--error-code", help="Select the open records with this code.")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Select the open records of this order key.")] = None,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Select the open records first failed this long ago (1h).")
    ] = None,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="Failure ids, one per line ('-': standard input).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be resolved; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Resolve a selection without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", help="Who resolves it (default: $USER).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Close open records without reprocessing them, one by id or a selection (code, key, age, a file of ids),
    with --dry-run first; frees the keys they held (ORDERS_ORDERING=key)."""
    settings = configured()
    if not reason.strip():
        raise typer.BadParameter("say why: --reason", param_hint="--reason")
    who = who_acts(author)
    ids = list(failure_id or [])
    if from_file is not None:
        text = sys.stdin.read() if str(from_file) == "-" else from_file.read_text()
        ids += [line.strip() for line in text.splitlines() if line.strip()]
    selecting = error_code is not None or key is not None or older_than is not None
    if not ids and not selecting:
        raise typer.BadParameter("name failure ids, --from-file, or select with --error-code / --key / --older-than")
    try:
        age = parse_duration(older_than) if older_than else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from None

    async def chosen(connection: Any) -> list[str]:
        if not selecting:
            return ids
        rows, _ = await quarantine.listing(
            connection, error_code=error_code, status="open", older_than=age, key=key, limit=100_000
        )
        picked = [row["failure_id"] for row in rows]
        return [one for one in picked if one in ids] if ids else picked

    selection = run_async(lambda _: with_connection(settings, chosen))
    if dry_run or (len(selection) > 1 and not yes):
        sample = ", ".join(selection[:5]) + (" …" if len(selection) > 5 else "")
        typer.echo(f"quarantine resolve: {len(selection)} records selected" + (f": {sample}" if selection else ""))
        if dry_run or not selection:
            return
        if not sys.stdin.isatty() or not typer.confirm(f"resolve {len(selection)} records?", err=True):
            typer.echo("quarantine resolve: not confirmed (pass --yes): nothing changed", err=True)
            raise typer.Exit(1)

    async def close(connection: Any) -> dict[str, str | None]:
        outcomes: dict[str, str | None] = {}
        for one in selection:
            previous = await quarantine.resolve(connection, one, reason, who)
            if previous == "open":
                await parking.unblock_failures(connection, [one])
            outcomes[one] = previous
        return outcomes

    outcomes = run_async(lambda _: with_connection(settings, close, commit=True))
    resolved = [one for one, previous in outcomes.items() if previous == "open"]
    if as_json:
        print_json(
            {
                "resolved": resolved,
                "skipped": {one: previous or "not found" for one, previous in outcomes.items() if previous != "open"},
            }
        )
    else:
        for one in resolved:
            typer.echo(f"{one}: resolved")
    for one, previous in outcomes.items():
        if previous is None:
            typer.echo(f"no quarantined record with failure id {one}", err=True)
        elif previous != "open":
            typer.echo(f"{one} is {previous}, not open: nothing to resolve", err=True)
    if len(resolved) < len(outcomes) or not outcomes:
        raise typer.Exit(1)
