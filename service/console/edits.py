"""Edit and retry in the console: an operator corrects a quarantined record's payload or headers, previews the
diff and the domain's verdict, and confirms; with approvals on (<PREFIX>CONSOLE_EDIT_APPROVAL), another operator
approves it on the record's page. Every rule is `service.editing`'s, which the CLI calls too."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service import editing, operations
from service.console import views
from service.console.asking import field
from service.console.pages import locate
from service.console.web import Refused, caller, changing, checked_form, render, state_of
from service.policy.edits import EditRefused, HeaderChanges, parse_setting
from service.store import audit
from service.store import edits as edits_store


def _topic_of(request: Request) -> editing.TopicOf:
    return editing.reprocess_topic_of(state_of(request).wiring.settings)


def _checking(request: Request) -> editing.Checking:
    wiring = state_of(request).wiring
    if wiring.decode is None:
        raise Refused(503, "this console was started without the domain's decoding: edit with the CLI")
    return editing.Checking(wiring.decode, wiring.failing_field)


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.replace("\r\n", "\n").split("\n") if line.strip()]


async def edit_form(request: Request) -> Response:
    """The edit form of one open record, its payload in a text box: showing it is a reveal (audited), so it is
    asked for as a reveal is, by a form with its CSRF token."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    failure_id, consumer = field(fields, "failure_id"), field(fields, "consumer") or None
    async with changing(request) as connection:
        key = await locate(connection, failure_id, consumer)
        record = await operations.reveal(connection, key, who.operator.name, ["edit form"], via="console")
    if record is None:
        raise Refused(404, f"no quarantined record with failure id {failure_id}")
    shown = views.payload_view(record.get("payload"))
    editable = shown.kind in ("json", "text") and not shown.cut
    return render(
        request,
        "edit.html",
        {
            "record": record,
            "payload_text": shown.body if editable else "",
            "editable": editable,
            "headers": record.get("source_headers") or [],
            "approval": state_of(request).wiring.settings.console_edit_approval,
        },
    )


async def edit(request: Request) -> Response:
    """Preview an edit (its diff and the domain's verdict) or, confirmed, make it: sent once, or waiting for
    another operator's approval."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    failure_id, consumer = field(fields, "failure_id"), field(fields, "consumer") or None
    payload_text = (fields.get("payload") or [""])[0].replace("\r\n", "\n")
    try:
        changes = HeaderChanges(
            tuple(parse_setting(line) for line in _lines(field(fields, "set_headers"))),
            tuple(_lines(field(fields, "drop_headers"))),
        )
    except EditRefused as error:
        raise Refused(400, f"headers to set: {error}") from None
    confirmed = field(fields, "confirm") == "yes"
    settings = state_of(request).wiring.settings
    checking = _checking(request)
    try:
        async with changing(request) as connection:
            key = await locate(connection, failure_id, consumer)
            proposed = await editing.propose(
                connection,
                key,
                payload=payload_text.encode() if payload_text.strip() else None,
                changes=changes,
                actor=who.operator.name,
                checking=checking,
                approval=settings.console_edit_approval,
                topic_of=_topic_of(request),
                dry_run=not confirmed,
            )
    except EditRefused as error:
        raise Refused(409 if confirmed else 400, str(error)) from None
    kept = [(name, value) for name, values in fields.items() if name not in {"csrf", "confirm"} for value in values]
    return render(
        request,
        "edit_done.html" if confirmed else "edit_preview.html",
        {"proposed": proposed, "kept": kept, "approval": settings.console_edit_approval},
    )


async def decide_edit(request: Request) -> Response:
    """Approve (send) or reject an edit that waits for approval; its author may reject it, never approve it."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    try:
        edit_id = int(field(fields, "edit_id"))
    except ValueError:
        raise Refused(400, "edit_id: not a number") from None
    if not 1 <= edit_id < 2**63:
        raise Refused(400, "edit_id: no such edit")
    approve = field(fields, "decision") == "approve"
    try:
        async with changing(request) as connection:
            decided = await editing.decide(
                connection, edit_id, approve=approve, actor=who.operator.name, topic_of=_topic_of(request)
            )
    except EditRefused as error:
        raise Refused(409, str(error)) from None
    line = f"edit {edit_id} of {decided['failure_id']}: {decided['state']} by {who.operator.name}"
    return render(
        request,
        "done.html",
        {
            "action": "approve edit" if approve else "reject edit",
            "lines": [line],
            "back": f"/quarantine/{decided['failure_id']}",
            "back_query": {"consumer": decided["consumer_name"]},
        },
    )


async def edit_page(request: Request) -> Response:
    """One edit: who made it, its state, its diff and the edited payload beside the original (record content:
    operators only), and, while it waits, the buttons that approve or reject it."""
    who = caller(request, acts=True)
    try:
        edit_id = int(request.path_params["edit_id"])
    except ValueError:
        raise Refused(404, "no such edit") from None
    async with changing(request) as connection:
        found = await edits_store.get(connection, edit_id) if 1 <= edit_id < 2**63 else None
        if found is not None:
            # The page shows the record's bytes and header values: a reveal, audited as the record page's is.
            await audit.record(
                connection,
                who.operator.name,
                "quarantine.reveal",
                {
                    "consumer": found["consumer_name"],
                    "failure_id": found["failure_id"],
                    "as": [f"edit {edit_id}"],
                    "via": "console",
                },
                {"revealed": True},
            )
    if found is None:
        raise Refused(404, f"no edit {edit_id}")
    return render(
        request,
        "edit_detail.html",
        {
            "edit": found,
            "original": views.payload_view(found["payload_before"]),
            "edited": views.payload_view(found["payload_after"]),
        },
    )
