"""`<program> reprocess`: the controlled reprocess workflow."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict
from typing import Annotated, Any

import typer
from aiokafka.errors import KafkaError
from rich.console import Console

from service import operations
from service.adapters import topics
from service.bounds import BIGINT_MAX
from service.cli import bounded
from service.cli.common import (
    JsonFlag,
    configured,
    domain,
    print_json,
    run_async,
    show_rows,
    use,
    utc,
    who_acts,
    with_connection,
)
from service.cli.layout import print_sections
from service.cli.selection import OwnerOption, SinceOption, UntilOption, check_code, first_failed_range
from service.config import Settings
from service.store import reprocess as reprocess_store
from service.worker.reprocess_run import Options, Selection


class _PlainProgress:
    """Progress as plain lines on stderr (not a terminal: logs, CI, pipes)."""

    def opened(self, run_id: str) -> None:
        typer.echo(f"reprocess: run {run_id}", err=True)

    def start(self, stage: str, total: int) -> None:
        self._stage, self._total = stage, total
        typer.echo(f"reprocess {stage}: {total} items", err=True)

    def advance(self, published: int, verified: int) -> None:
        typer.echo(f"reprocess {self._stage}: published {published}, verified {verified}", err=True)

    def finish(self) -> None:
        typer.echo(f"reprocess {self._stage}: done", err=True)


class _BarProgress:
    """Progress as a rich bar on a terminal."""

    def __init__(self) -> None:
        from rich.progress import Progress

        self._progress = Progress(console=Console(stderr=True))
        self._task: Any = None

    def opened(self, run_id: str) -> None:
        self._progress.console.print(f"reprocess: run {run_id}")

    def start(self, stage: str, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(f"reprocess {stage}", total=total)

    def advance(self, published: int, verified: int) -> None:
        self._progress.update(self._task, completed=verified, description=f"published {published}")

    def finish(self) -> None:
        self._progress.stop()


app = typer.Typer(
    help="Send quarantined records back via `<source>.reprocess`; `reprocess list|show` shows the runs.",
)


@app.callback(invoke_without_command=True)
def reprocess(
    context: typer.Context,
    reason: Annotated[str | None, typer.Option("--reason", help="Why this run is needed (kept in the audit).")] = None,
    failure_id: Annotated[
        list[str] | None, typer.Option("--failure-id", help="A failure id to reprocess (repeatable).")
    ] = None,
    error_code: Annotated[str | None, typer.Option("--error-code", help="Open records with this code.")] = None,
    owner: OwnerOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the volume and selection; write nothing.")] = False,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, max=BIGINT_MAX, help="Verify a sample of N first.")
    ] = None,
    ramp: Annotated[
        bool,
        typer.Option(
            "--ramp",
            help="Send batches of 1, 2, 5, 20, 50 and 100 records, each once the one before is verified, then the "
            "rest at --rate; stop on the first failure (exit 3). Not with --sample.",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Continue after the sample without asking.")] = False,
    rate: Annotated[
        float, typer.Option("--rate", parser=bounded.rate, help="Records per second (token bucket), up to 10000.")
    ] = 10.0,
    max_failure_rate: Annotated[
        float,
        typer.Option("--max-failure-rate", parser=bounded.fraction, help="Stop when more items fail again (0 to 1)."),
    ] = 0.2,
    max_lag: Annotated[
        int, typer.Option("--max-lag", min=0, max=BIGINT_MAX, help="Stop when the consumer lags more.")
    ] = 10_000,
    verify_timeout: Annotated[
        float,
        typer.Option("--verify-timeout", parser=bounded.seconds, help="Seconds to wait for a verdict (1 to 86400)."),
    ] = 120,
    actor: Annotated[str | None, typer.Option("--author", "--actor", help="Who runs it (default: $USER).")] = None,
    consumer: Annotated[
        str | None,
        typer.Option(
            "--consumer",
            help="The consumer name whose records to send back: needed when the selection (or a failure id) is "
            "quarantined under several consumer names, each keeping its own record; without it that is exit 2.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Send quarantined records back via `<source>.reprocess`: selected, checked, rate limited, verified, audited.
    It acts as the consumer and on the source topic the records were quarantined under, not as
    <PREFIX>CONSUMER_NAME / <PREFIX>SOURCE_TOPIC. Each record is sent only if it is as it was when selected (one
    resolved meanwhile is skipped); after --sample, exactly the rest selected then is sent."""
    if context.invoked_subcommand is not None:
        return
    settings = configured()
    if not reason or not reason.strip():
        raise typer.BadParameter("say why this run is needed: --reason", param_hint="--reason")
    if not (failure_id or error_code or owner or since or until):
        raise typer.BadParameter("select something: --failure-id, --error-code, --owner, --since or --until")
    if ramp and sample:
        raise typer.BadParameter("a ramp starts with a batch of one: leave out --sample", param_hint="--ramp")
    check_code(error_code)
    after, before = first_failed_range(since, until)
    selection = Selection(tuple(failure_id or ()), error_code, after, before, owner=owner or None)
    settings = _as_owner_of(settings, selection, consumer)
    options = Options(
        reason=reason,
        actor=who_acts(actor),
        rate=rate,
        sample=sample,
        dry_run=dry_run,
        max_failure_rate=max_failure_rate,
        max_lag=max_lag,
        verify_timeout=verify_timeout,
        ramp=ramp,
    )
    progress = _BarProgress() if sys.stderr.isatty() and not as_json else _PlainProgress()

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            typer.echo(f"{question} (not asked: no terminal; pass --yes)", err=True)
            return False
        return typer.confirm(question, err=True)

    if not dry_run:
        run_async(lambda _: reprocess_topic_exists(settings))
    report = run_async(
        lambda _: use(settings, "reprocessor", lambda runner: runner.run(selection, options, progress, confirm))
    )
    if as_json:
        # Each record's status as an object naming it: a document's keys are names, never data (contract §10).
        statuses = [{"failure_id": one, "status": status} for one, status in report.statuses.items()]
        print_json({**asdict(report), "statuses": statuses})
    else:
        typer.echo(
            f"reprocess {report.run_id or '(dry run)'}: {report.outcome}"
            + (f" ({report.stop_reason})" if report.stop_reason else "")
            + f"; matched {report.selected}: selected {len(report.selection)}, skipped as undecodable "
            f"{len(report.undecodable)}; published {report.published}, "
            f"reprocessed {report.reprocessed}, already applied {report.noop}, failed again {report.failed_again}, "
            f"unverified {report.unverified}, skipped {report.skipped}"
        )
        for skipped in report.undecodable:
            typer.echo(f"  skipped (does not decode with today's schemas): {skipped}")
        if dry_run:
            for chosen in report.selection:
                typer.echo(f"  selected: {chosen}")
    if report.skipped:
        typer.echo(
            f"reprocess: {report.skipped} items not sent: resolved or otherwise changed since they were selected "
            f"(`{domain().program} reprocess show {report.run_id}` says which and how)",
            err=True,
        )
    for failure_id, erased in report.erased.items():
        typer.echo(f"reprocess: {failure_id} was {erased}: its payload is gone, it cannot be reprocessed", err=True)
    if report.outcome == "stopped":
        raise typer.Exit(3)
    if report.unverified:
        typer.echo(
            f"reprocess: {report.unverified} items unverified (no business change seen in time): check them with "
            f"`{domain().program} quarantine show <failure id>` and that a consumer named {settings.consumer_name} "
            "runs",
            err=True,
        )
        raise typer.Exit(1)
    if report.erased:
        raise typer.Exit(1)


async def reprocess_topic_exists(owner: Settings) -> None:
    """A run's start-up check (contract §11): the owner's reprocess topic, which it sends copies to and reads the
    consumer's lag of, exists (TopicsMissing, one line, otherwise). A broker that cannot be reached is left to the
    run, which records the outage in its audit row."""
    with contextlib.suppress(KafkaError, OSError, TimeoutError):
        await topics.require(owner, [owner.topics.reprocess])


def _as_owner_of(settings: Settings, selection: Selection, consumer: str | None) -> Settings:
    """The settings of the consumer the selected records were quarantined under (its name and source topic)."""
    pairs = run_async(
        lambda _: with_connection(
            settings,
            lambda c: operations.reprocess_owners(
                c,
                selection.failure_ids,
                selection.error_code,
                selection.since,
                selection.until,
                consumer,
                selection.owner,
            ),
        )
    )
    if len(pairs) > 1:
        names = ", ".join(f"{name} ({topic})" for name, topic in pairs)
        typer.echo(f"reprocess: the selection spans several consumers: {names}: pass --consumer", err=True)
        raise typer.Exit(2)
    if not pairs:
        return settings if consumer is None else settings.model_copy(update={"consumer_name": consumer})
    name, topic = pairs[0]
    owner = settings.model_copy(update={"consumer_name": name, "source_topic": topic})
    typer.echo(f"reprocess: as consumer {name}, copies to {owner.topics.reprocess}", err=True)
    return owner


@app.command("list")
def reprocess_list(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 50,
    offset: Annotated[int, typer.Option(min=0, max=BIGINT_MAX, help="Skip this many first (paging).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Reprocess runs, newest first: who ran them, why, their outcome and counts (N of M shown)."""
    settings = configured()
    rows, total = run_async(
        lambda _: with_connection(settings, lambda c: reprocess_store.runs(c, limit=limit, offset=offset))
    )
    if as_json:
        print_json(rows)
        return
    show_rows(
        (
            "run",
            "actor",
            "outcome",
            "selected",
            "reprocessed",
            "failed again",
            "unverified",
            "skipped",
            "started (UTC)",
            "reason",
        ),
        [
            (
                row["id"],
                row["actor"],
                row["outcome"] + (f" ({row['stop_reason']})" if row["stop_reason"] else ""),
                *(
                    str(row["counts"].get(name, ""))
                    for name in ("selected", "reprocessed", "failed_again", "unverified", "skipped")
                ),
                utc(row["started_at"]),
                row["reason"],
            )
            for row in rows
        ],
        footer=f"{len(rows)} of {total} shown",
        prose={2, 9},
    )


@app.command("show")
def reprocess_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run id `reprocess list` shows.")],
    as_json: JsonFlag = False,
) -> None:
    """One reprocess run: its audit row (actor, reason, selection, options, counts) and every item's outcome (a
    `skipped` item was not sent: its detail says how its record changed after the run selected it)."""
    settings = configured()
    run = run_async(lambda _: with_connection(settings, lambda c: reprocess_store.run_with_items(c, run_id)))
    if run is None:
        typer.echo(f"no reprocess run {run_id}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json(run)
        return
    items = run.pop("items")
    print_sections(run)
    show_rows(
        ("failure id", "message id", "stage", "attempt", "outcome", "published (UTC)", "settled (UTC)", "detail"),
        [
            (
                item["failure_id"],
                item["message_id"],
                item["stage"],
                str(item["attempt"]),
                item["outcome"],
                utc(item["published_at"]),
                utc(item["verified_at"]),
                item["detail"] or "",
            )
            for item in items
        ],
        footer=f"{len(items)} items",
        prose={7},
    )
