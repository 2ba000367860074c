"""`<program> quarantine`: the quarantine queue."""

from __future__ import annotations

import csv
import sys
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from service import inert, operations
from service.bounds import BIGINT_MAX
from service.cli.common import (
    JsonFlag,
    configured,
    domain,
    echo,
    print_json,
    run_async,
    show_rows,
    timestamp,
    utc,
    who_acts,
    with_connection,
)
from service.cli.erase import quarantine_erase
from service.cli.record import print_record
from service.cli.selection import (
    AgeOption,
    CodeOption,
    FileOption,
    KeyOption,
    OwnerOption,
    RecordConsumerOption,
    SinceOption,
    UntilOption,
    age_of,
    check_code,
    go_ahead,
    picked,
    wanted_of,
)
from service.policy import repairs
from service.store import quarantine, quarantine_reads

app = typer.Typer(help="Operate the quarantine queue.", no_args_is_help=True)
app.command("erase")(quarantine_erase)


@app.command("list")
def quarantine_list(
    error_code: Annotated[str | None, typer.Option(help="Only this error code.")] = None,
    status: Annotated[str | None, typer.Option(help="open, resolved, reprocessing or reprocessed.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Only records first failed at least this long ago (5m).")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Only records of this ordering key.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Only records routed to this owner.")] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", help="Only records of this message id.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="First failed at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="First failed before (RFC 3339).")] = None,
    consumer: Annotated[
        str | None,
        typer.Option(
            "--consumer", help="Only the records of this consumer name (each keeps its own record of a failure)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    offset: Annotated[int, typer.Option(min=0, max=BIGINT_MAX, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (every column) instead of a table.")] = False,
) -> None:
    """List quarantined records, oldest first (N of M shown); --csv exports the selection."""
    settings = configured()
    if status is not None and status not in quarantine.STATUSES:
        raise typer.BadParameter(f"{status!r} is not one of {', '.join(quarantine.STATUSES)}", param_hint="--status")
    check_code(error_code)
    age = age_of(older_than)
    after, before = timestamp(since, "--since"), timestamp(until, "--until")
    rows, total = run_async(
        lambda _: with_connection(
            settings,
            lambda c: quarantine_reads.listing(
                c,
                error_code=error_code,
                status=status,
                older_than=age,
                key=key,
                owner=owner or None,
                message_id=message_id,
                since=after,
                until=before,
                consumer=consumer,
                limit=limit,
                offset=offset,
            ),
        )
    )
    if as_json:
        print_json(rows)
        return
    if as_csv:
        # For a spreadsheet or a hand-over to a producing team: every column of the selection, UTC timestamps, each
        # cell escaped as TSV's are (an escape sequence in a key must not act where the file is printed).
        writer = csv.writer(sys.stdout)
        columns = list(rows[0]) if rows else ["failure_id", "message_id", "error_code", "status"]
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(value) for value in row.values()])
        return
    show_rows(
        (
            "failure id",
            "message id",
            "error code",
            "status",
            "owner",
            "key",
            "attempts",
            "first failed (UTC)",
            "consumer",
        ),
        [
            (
                row["failure_id"],
                row["message_id"],
                row["error_code"],
                row["status"],
                row["owner"],
                row["ordering_key"] or "",
                str(row["attempts"]),
                utc(row["first_failed_at"]),
                row["consumer_name"],
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown" + (f" (from {offset + 1})" if offset and rows else ""),
    )


@app.command("show")
def quarantine_show(
    failure_id: Annotated[str, typer.Argument(help="The failure id, as <topic>/<partition>/<offset>.")],
    include_payload: Annotated[bool, typer.Option(help="Also print the original bytes (base64).")] = False,
    payload_as_text: Annotated[
        bool, typer.Option("--payload-as-text", help="Also print the original bytes as text, when they are UTF-8.")
    ] = False,
    author: Annotated[
        str | None, typer.Option("--author", "--actor", help="Who reveals the payload (audited; default: $USER).")
    ] = None,
    consumer: Annotated[
        str | None,
        typer.Option(
            "--consumer",
            help="The consumer name whose record to show: needed when several consumer names quarantined this "
            "failure id (each keeps its own record); without it that is refused (exit 2).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Show one quarantined record: envelope, attempts, annotations, timeline; for invalid input, the failing
    field and the rule it breaks (names only, never values). Revealing the payload is audited."""
    settings = configured()
    revealing = include_payload or payload_as_text
    who = who_acts(author) if revealing else ""

    shown_as = [name for name, asked in (("base64", include_payload), ("text", payload_as_text)) if asked]

    async def look(connection: Any) -> dict[str, Any] | None:
        try:
            record = await operations.locate(connection, failure_id, consumer)
        except operations.SeveralConsumers as error:
            typer.echo(f"quarantine show: {error}: pass --consumer", err=True)
            raise typer.Exit(2) from None
        if record is None:
            return None
        if revealing:
            return await operations.reveal(connection, record, who, shown_as)
        return await quarantine_reads.get(connection, record)

    row = run_async(lambda _: with_connection(settings, look, commit=revealing))
    if row is None:
        echo(_no_record(failure_id, consumer), err=True)
        raise typer.Exit(1)
    payload = row.get("payload")
    if row["error_code"] == "INVALID_FIELD":
        found = domain().failing_field(bytes(payload) if payload is not None else None)
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
    print_record(row)


def _cell(value: Any) -> str:
    """One CSV cell: a timestamp in UTC, nothing as empty, content escaped as TSV's (`service.inert.escaped`)."""
    if isinstance(value, datetime):
        return utc(value)
    return "" if value is None else inert.escaped(value)


@app.command("stats")
def quarantine_stats(
    owner: Annotated[str | None, typer.Option("--owner", help="Only records routed to this owner.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Counts and rates per error code and owner, and the age of the oldest open record."""
    settings = configured()
    summary = run_async(lambda _: with_connection(settings, lambda c: quarantine_reads.stats(c, owner)))
    if as_json:
        print_json(summary)
        return
    age = summary["oldest_open_age_seconds"]
    typer.echo(f"open: {summary['open']}   oldest open: {timedelta(seconds=int(age)) if age is not None else '-'}")
    show_rows(
        ("error code", "owner", "open", "total", "last hour"),
        [
            (group["error_code"], group["owner"], str(group["open"]), str(group["total"]), str(group["rate_per_hour"]))
            for group in summary["by_code"]
        ],
    )


@app.command("annotate")
def quarantine_annotate(
    failure_id: Annotated[
        list[str] | None, typer.Argument(help="Failure ids, <topic>/<partition>/<offset> (or select with the options).")
    ] = None,
    note: Annotated[str, typer.Option("--note", help="What you found or did.")] = "",
    error_code: CodeOption = None,
    key: KeyOption = None,
    older_than: AgeOption = None,
    owner: OwnerOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    from_file: FileOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be annotated; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Annotate a selection without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", "--actor", help="Who writes it (default: $USER).")] = None,
    consumer: RecordConsumerOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Append a note to quarantined records (append-only), one by id or a selection of open ones (code, key, age,
    owner, first failed --since/--until, a file of ids), with --dry-run first; a selection of several is asked
    about first and exactly the records counted then get the note."""
    settings = configured()
    if not note.strip():
        raise typer.BadParameter("say what you found or did: --note", param_hint="--note")
    who = who_acts(author)
    wanted = wanted_of(
        failure_id, from_file, error_code, key, older_than, consumer, owner=owner, since=since, until=until
    )
    chosen = run_async(lambda _: with_connection(settings, lambda c: picked(c, wanted, "quarantine annotate")))
    if dry_run:
        # A note goes to every record that exists: the real run's one refusal is a failure id with no record.
        _annotated(chosen, list(chosen.failure_ids), consumer, as_json=as_json, dry_run=True)
        return
    if not go_ahead("quarantine annotate", "annotate", chosen.named, dry_run=False, yes=yes):
        return

    added = run_async(
        lambda _: with_connection(settings, lambda c: operations.annotate(c, wanted, chosen, who, note), commit=True)
    )
    _annotated(chosen, added, consumer, as_json=as_json, dry_run=False)


def _annotated(
    chosen: operations.Picked, added: list[str], consumer: str | None, *, as_json: bool, dry_run: bool
) -> None:
    """What an annotate did (or its dry run would do): the records noted, a line naming each failure id with no
    record, and exit 1 if there is one."""
    missing = [one for one in chosen.named if one not in added]
    if as_json:
        skipped = [{"failure_id": one, "reason": "not found"} for one in missing]
        document = {"consumer": chosen.consumer, "annotated": added, "skipped": skipped}
        print_json(document | ({"dry_run": True} if dry_run else {}))
    elif dry_run:
        go_ahead("quarantine annotate", "annotate", added, dry_run=True, yes=False)
    else:
        for one in added:
            echo(f"{one}: note added")
    for one in missing:
        echo(_no_record(one, consumer), err=True)
    if missing:
        raise typer.Exit(1)


@app.command("resolve")
def quarantine_resolve(
    failure_id: Annotated[
        list[str] | None, typer.Argument(help="Failure ids, <topic>/<partition>/<offset> (or select with the options).")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why it needs no reprocessing (kept in the audit).")] = "",
    error_code: CodeOption = None,
    key: KeyOption = None,
    older_than: AgeOption = None,
    owner: OwnerOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    from_file: FileOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be resolved; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Resolve a selection without asking.")] = False,
    author: Annotated[str | None, typer.Option("--author", "--actor", help="Who resolves it (default: $USER).")] = None,
    consumer: RecordConsumerOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Close open records without reprocessing them, one by id or a selection (code, key, age, owner, first
    failed --since/--until, a file of ids), with --dry-run first; frees the keys they held (<PREFIX>ORDERING=key).
    A selection of several is asked about first, and exactly the records counted then are resolved (one no longer
    open is left as it is)."""
    settings = configured()
    if not reason.strip():
        raise typer.BadParameter("say why: --reason", param_hint="--reason")
    who = who_acts(author)
    wanted = wanted_of(
        failure_id, from_file, error_code, key, older_than, consumer, owner=owner, since=since, until=until
    )
    chosen = run_async(lambda _: with_connection(settings, lambda c: picked(c, wanted, "quarantine resolve")))
    if dry_run:
        # The real run's decision (repairs.resolves) on each record as it is now.
        preview = run_async(lambda _: with_connection(settings, lambda c: operations.resolve_preview(c, chosen)))
        _resolved(chosen, preview, consumer, as_json=as_json, dry_run=True)
        return
    if not go_ahead("quarantine resolve", "resolve", chosen.named, dry_run=False, yes=yes):
        return

    outcomes = run_async(
        lambda _: with_connection(settings, lambda c: operations.resolve(c, wanted, chosen, who, reason), commit=True)
    )
    _resolved(chosen, outcomes, consumer, as_json=as_json, dry_run=False)


def _resolved(
    chosen: operations.Picked, outcomes: dict[str, str | None], consumer: str | None, *, as_json: bool, dry_run: bool
) -> None:
    """What a resolve did (or its dry run would do), per failure id and its previous status: the records closed, a
    line naming each left as it is (no record, or not open), and exit 1 if there is one."""
    resolved = [one for one, previous in outcomes.items() if repairs.resolves(previous)]
    if as_json:
        document = {
            "consumer": chosen.consumer,
            "resolved": resolved,
            "skipped": [
                {"failure_id": one, "reason": previous or "not found"}
                for one, previous in outcomes.items()
                if one not in resolved
            ],
        }
        print_json(document | ({"dry_run": True} if dry_run else {}))
    elif dry_run:
        go_ahead("quarantine resolve", "resolve", resolved, dry_run=True, yes=False)
    else:
        for one in resolved:
            echo(f"{one}: resolved")
    for one, previous in outcomes.items():
        if previous is None:
            echo(_no_record(one, consumer), err=True)
        elif not repairs.resolves(previous):
            echo(f"{one} is {previous}, not open: nothing to resolve", err=True)
    if len(resolved) < len(outcomes):
        raise typer.Exit(1)


def _no_record(failure_id: str, consumer: str | None) -> str:
    """The line naming a failure id that has no record (under the consumer an operator named, if any)."""
    return f"no quarantined record with failure id {failure_id}" + (f" under consumer {consumer}" if consumer else "")
