"""`<program> quarantine edit | approve-edit | reject-edit`: correct a quarantined record and send it back once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from service import editing, operations
from service.cli.common import (
    JsonFlag,
    configured,
    domain,
    echo,
    print_json,
    run_async,
    who_acts,
    with_connection,
)
from service.cli.selection import RecordConsumerOption
from service.policy.edits import EditRefused, HeaderChanges, parse_setting

ActorOption = Annotated[str | None, typer.Option("--actor", "--author", help="Who does it (audited; default: $USER).")]


def quarantine_edit(
    failure_id: Annotated[str, typer.Argument(help="The failure id, as <topic>/<partition>/<offset>.")],
    payload_file: Annotated[
        Path | None,
        typer.Option(
            "--payload-file", exists=True, dir_okay=False, help="The corrected payload (its bytes as they are)."
        ),
    ] = None,
    set_header: Annotated[
        list[str] | None, typer.Option("--set-header", help="NAME=VALUE: set a header (repeatable).")
    ] = None,
    drop_header: Annotated[
        list[str] | None, typer.Option("--drop-header", help="NAME: drop a header (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the diff and whether the payload is valid; send nothing.")
    ] = False,
    actor: ActorOption = None,
    consumer: RecordConsumerOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Correct an open record's payload or headers and send it back once under its original message id (as
    `reprocess` sends a copy): checked with the consumer's own decoding first (a payload it would quarantine again
    is refused with the reason, nothing sent), kept with its diff, audited; the original stays in the record. With
    <PREFIX>CONSOLE_EDIT_APPROVAL=true it waits for another operator's `quarantine approve-edit`."""
    settings = configured()
    if payload_file is None and not set_header and not drop_header:
        raise typer.BadParameter("give a corrected payload or header: --payload-file, --set-header or --drop-header")
    try:
        changes = HeaderChanges(tuple(parse_setting(one) for one in set_header or ()), tuple(drop_header or ()))
    except EditRefused as error:
        raise typer.BadParameter(str(error), param_hint="--set-header") from None
    payload = payload_file.read_bytes() if payload_file is not None else None
    who = who_acts(actor)
    served = domain()
    checking = editing.Checking(served.decode, served.failing_field)

    async def edit(connection: Any) -> editing.Proposed:
        try:
            record = await operations.locate(connection, failure_id, consumer)
        except operations.SeveralConsumers as error:
            typer.echo(f"quarantine edit: {error}: pass --consumer", err=True)
            raise typer.Exit(2) from None
        if record is None:
            raise EditRefused(f"no quarantined record with failure id {failure_id}")
        return await editing.propose(
            connection,
            record,
            payload=payload,
            changes=changes,
            actor=who,
            checking=checking,
            approval=settings.console_edit_approval,
            topic_of=editing.reprocess_topic_of(settings),
            dry_run=dry_run,
        )

    proposed = _refusing("quarantine edit", lambda: with_connection(settings, edit, commit=not dry_run))
    if as_json:
        print_json(
            {
                "consumer": proposed.record.consumer_name,
                "failure_id": proposed.record.failure_id,
                "edit_id": proposed.edit_id,
                "state": proposed.state,
                "diff": proposed.diff,
                "valid": proposed.verdict.valid,
                "validation": proposed.verdict.reason(),
            }
        )
    else:
        echo(proposed.diff)  # record content: every invisible character escaped
        echo(f"validation: {proposed.verdict.reason()}")
        if proposed.state == "sent":
            typer.echo(f"edit {proposed.edit_id}: sent (once, under the original message id)")
        elif proposed.state == "pending_approval":
            typer.echo(
                f"edit {proposed.edit_id}: pending approval (another operator: "
                f"`{served.program} quarantine approve-edit {proposed.edit_id}`)"
            )
        else:
            typer.echo("dry run: nothing written, nothing sent")
    if not proposed.verdict.valid:
        typer.echo(
            f"quarantine edit: the edited payload {proposed.verdict.reason()}: the real run refuses it", err=True
        )
        raise typer.Exit(1)


def quarantine_approve_edit(
    edit_id: Annotated[int, typer.Argument(metavar="EDIT_ID", min=1, max=2**63 - 1, help="The edit's id.")],
    actor: ActorOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve an edit that waits for approval (not your own): it is sent then, once, under the original message id."""
    _decide(edit_id, approve=True, actor=actor, as_json=as_json)


def quarantine_reject_edit(
    edit_id: Annotated[int, typer.Argument(metavar="EDIT_ID", min=1, max=2**63 - 1, help="The edit's id.")],
    actor: ActorOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject an edit that waits for approval (its author may withdraw it so): it is never sent."""
    _decide(edit_id, approve=False, actor=actor, as_json=as_json)


def _decide(edit_id: int, *, approve: bool, actor: str | None, as_json: bool) -> None:
    settings = configured()
    who = who_acts(actor)
    command = "quarantine approve-edit" if approve else "quarantine reject-edit"
    edit = _refusing(
        command,
        lambda: with_connection(
            settings,
            lambda c: editing.decide(
                c, edit_id, approve=approve, actor=who, topic_of=editing.reprocess_topic_of(settings)
            ),
            commit=True,
        ),
    )
    if as_json:
        print_json({key: value for key, value in edit.items() if key not in {"payload_before", "payload_after"}})
    else:
        echo(f"edit {edit_id} of {edit['failure_id']}: {edit['state']} by {who}")


def _refusing(command: str, work: Any) -> Any:
    """Run `work` (a coroutine factory); an edit refused is one line naming why, and exit 1 (nothing written: the
    unit of work rolls back)."""

    async def guarded() -> Any:
        try:
            return await work()
        except EditRefused as error:
            typer.echo(f"{command}: {error}", err=True)
            raise typer.Exit(1) from None

    return run_async(lambda _: guarded())


def register(group: typer.Typer) -> None:
    """Add the edit commands to the `quarantine` group (once, however often the application is built)."""
    present = {command.name for command in group.registered_commands}
    for name, function in (
        ("edit", quarantine_edit),
        ("approve-edit", quarantine_approve_edit),
        ("reject-edit", quarantine_reject_edit),
    ):
        if name not in present:
            group.command(name)(function)
