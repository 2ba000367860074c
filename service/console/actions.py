"""The console's actions: each answers first with a preview of exactly what it will do, and acts only on the
confirmed form, through `service.operations` (the CLI's own functions) in one unit of work with its audit row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
from typing import Any
from urllib.parse import quote_plus

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from service import operations
from service.console import outcomes as said
from service.console.asking import (
    duration,
    error_code,
    field,
    first_failed_range,
    reprocess_selection,
)
from service.console.web import (
    Refused,
    RunProgress,
    caller,
    changing,
    checked_form,
    log,
    reading,
    render,
    state_of,
)
from service.explain import explain
from service.store import console as console_store
from service.worker.effect_kinds import retry_state, waiting_for
from service.worker.reprocess_run import Options, Selection

SAMPLE = 5  # ids a preview lists
# The dry run's selection travels in its confirm form, as one field: at most this many bytes as the browser sends
# it (percent-encoded), under the 1 MiB a form field may hold (Starlette's limit, kept), with room for the rest.
PICKED_AT_MOST = 900_000


def _wanted(request: Request, fields: dict[str, list[str]]) -> operations.Wanted:
    """The records an action means: the ticked ones, or (`scope=matching`) every open one matching the list's
    code, key, age, owner and first-failed range (the ticked ones among them, if any), of the named consumer
    (when the list is filtered by one): the CLI's selection rule. A failure group from the overview is its code
    and owner."""
    ids = tuple(dict.fromkeys(one.strip() for one in fields.get("failure_id", []) if one.strip()))
    wanted = operations.Wanted(ids, consumer=field(fields, "consumer") or None)
    if field(fields, "scope") == "matching":
        since, until = first_failed_range(field(fields, "match_since"), field(fields, "match_until"), "match_")
        wanted = dataclasses.replace(
            wanted,
            error_code=error_code(request, field(fields, "match_error_code")),
            key=field(fields, "match_key") or None,
            older_than=duration(field(fields, "match_older_than"), "older_than"),
            owner=field(fields, "match_owner") or None,
            since=since,
            until=until,
        )
    if not wanted.ids and not wanted.selecting:
        raise Refused(400, "select records: tick them in the list, or filter by code, key, age, owner or time")
    return wanted


def _confirmed(fields: dict[str, list[str]]) -> bool:
    return field(fields, "confirm") == "yes"


def dry_run_list(fields: dict[str, list[str]]) -> dict[str, Any] | None:
    """What the dry run this form confirms listed (its `picked` field), or None when the form comes from no dry run.
    A confirmation acts on exactly that, never on its filters again: the records matching them may have changed
    since the operator read the dry run."""
    value = field(fields, "picked")
    if not value:
        return None
    try:
        picked = json.loads(value)
    except ValueError:
        picked = None
    if not isinstance(picked, dict) or not all(
        isinstance(items, list) and all(isinstance(one, str) for one in items)
        for name, items in picked.items()
        if name != "consumer"
    ):
        raise Refused(400, "the dry run's selection is garbled: run the dry run again")
    if not isinstance(picked.get("consumer"), str | None):
        raise Refused(400, "the dry run's selection is garbled: run the dry run again")
    return picked


def confirm_field(picked: dict[str, Any], count: int) -> str:
    """A dry run's selection as its confirm form carries it; one too large to carry is refused (400)."""
    value = json.dumps(picked, separators=(",", ":"), ensure_ascii=False)
    if len(quote_plus(value)) > PICKED_AT_MOST:
        raise Refused(
            400,
            f"the selection holds {count} records, more than a console confirmation carries: narrow it, or use the "
            "CLI (no such limit)",
        )
    return value


async def _records(request: Request, fields: dict[str, list[str]]) -> tuple[operations.Wanted, operations.Picked]:
    """What a form's action means: the records its dry run listed, when it confirms one; else what its selection
    means now."""
    wanted = _wanted(request, fields)
    listed = dry_run_list(fields)
    if listed is not None:
        found, missing = tuple(listed.get("failure_ids", ())), tuple(listed.get("missing", ()))
        return wanted, operations.Picked(listed.get("consumer"), found, missing)
    async with reading(request) as connection:
        try:
            return wanted, await wanted.pick(connection)
        except operations.SelectionTooLarge as error:
            raise Refused(400, str(error)) from None
        except operations.SeveralConsumers as error:
            raise Refused(409, f"{error}: filter the list by consumer first") from None


def _acts(fields: dict[str, list[str]], wanted: operations.Wanted) -> bool:
    """Whether a form is confirmed and says exactly what to act on: a dry run's list, or ids named one by one. A
    selection by filters is only ever confirmed from its dry run."""
    return _confirmed(fields) and (bool(field(fields, "picked")) or not wanted.selecting)


def _preview(
    request: Request,
    action: str,
    fields: dict[str, list[str]],
    selection: list[str],
    facts: dict[str, Any],
    picked: dict[str, Any] | None = None,
    refused: list[str] | None = None,
) -> Response:
    """The dry run: what the action will do (`selection`), what it will leave as it is and why (`refused`: the real
    run's own lines), and the form that confirms it, carrying what it listed (`picked`)."""
    hidden = {"csrf", "confirm", "picked"}
    kept = [(name, value) for name, values in fields.items() if name not in hidden for value in values]
    if picked is not None:
        kept.append(("picked", confirm_field(picked, len(selection))))
    return render(
        request,
        "preview.html",
        {
            "action": action,
            "count": len(selection),
            "sample": selection[:SAMPLE],
            "kept": kept,
            "facts": facts,
            "refused": refused or [],
        },
    )


def _done(
    request: Request, action: str, lines: list[str], *, back: str, back_query: dict[str, str] | None = None
) -> Response:
    return render(request, "done.html", {"action": action, "lines": lines, "back": back, "back_query": back_query})


def _listed(picked: operations.Picked) -> dict[str, Any]:
    """What a dry run of a quarantine action lists, as its confirm form carries it."""
    return {"consumer": picked.consumer, "failure_ids": list(picked.failure_ids), "missing": list(picked.missing)}


def _quarantine_facts(picked: operations.Picked, **facts: str) -> dict[str, str]:
    return ({"consumer": picked.consumer} if picked.consumer is not None else {}) | facts


async def annotate(request: Request) -> Response:
    """Append a note to the selected records (append-only)."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    note = field(fields, "note") or field(fields, "text")
    if not note:
        raise Refused(400, "say what you found or did: the note is empty")
    wanted, picked = await _records(request, fields)
    if not _acts(fields, wanted):
        facts = _quarantine_facts(picked, note=note)
        refused = [said.no_record(one) for one in picked.missing]
        return _preview(request, "annotate", fields, list(picked.failure_ids), facts, _listed(picked), refused)
    async with changing(request) as connection:
        added = await operations.annotate(connection, wanted, picked, who.operator.name, note)
    lines = [f"{one}: note added" for one in added] + [said.no_record(one) for one in picked.named if one not in added]
    return _done(request, "annotate", lines or ["nothing selected: nothing changed"], **_back(picked))


async def resolve(request: Request) -> Response:
    """Close the selected open records without reprocessing them; frees the keys they held."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    reason = field(fields, "reason") or field(fields, "text")
    if not reason:
        raise Refused(400, "say why they need no reprocessing: the reason is empty")
    wanted, picked = await _records(request, fields)
    if not _acts(fields, wanted):
        async with reading(request) as connection:
            preview = await operations.resolve_preview(connection, picked)
        closes = [one for one, previous in preview.items() if said.resolves(previous)]
        refused = [said.resolved(one, previous) for one, previous in preview.items() if one not in closes]
        facts = _quarantine_facts(picked, reason=reason)
        return _preview(request, "resolve", fields, closes, facts, _listed(picked), refused)
    async with changing(request) as connection:
        outcomes = await operations.resolve(connection, wanted, picked, who.operator.name, reason)
    lines = [said.resolved(one, previous) for one, previous in outcomes.items()]
    return _done(request, "resolve", lines or ["nothing selected: nothing changed"], **_back(picked))


def _back(picked: operations.Picked) -> dict[str, Any]:
    """Where the done page leads back to: the one record acted on, or the queue."""
    if len(picked.failure_ids) == 1 and picked.consumer is not None:
        return {"back": f"/quarantine/{picked.failure_ids[0]}", "back_query": {"consumer": picked.consumer}}
    return {"back": "/quarantine"}


async def release(request: Request) -> Response:
    """Free a held key; its parked records are then applied in order by a running consumer."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    key, consumer = field(fields, "key"), field(fields, "consumer") or None
    if not key:
        raise Refused(400, "name the key to release")
    async with reading(request) as connection:
        holders = await operations.key_holders(connection, key, consumer)
    if not holders:
        # As the CLI's: a key nothing holds and nothing waits behind is left alone (and nothing is audited).
        nothing = f"{key}: nothing holds it and nothing is parked behind it: unchanged"
        if not _confirmed(fields):
            return _preview(request, "release", fields, [], {"key": key}, refused=[nothing])
        return _done(request, "release", [nothing], back="/keys")
    if not _confirmed(fields):
        async with reading(request) as connection:
            detail = await console_store.held_key(connection, consumer or "", key) if consumer else None
        facts = {"key": key, "consumer": consumer or "(the one holding it)"}
        if detail is not None:
            facts |= {
                "held by": detail["blocked_by"] or ", ".join(detail["retrying"]) or "nothing",
                "parked behind it": str(len(detail["parked"])),
            }
        return _preview(request, "release", fields, [key], facts)
    settings = state_of(request).wiring.settings
    async with changing(request) as connection:
        outcome = await operations.release_key(connection, key, consumer, settings.consumer_name, who.operator.name)
    if outcome.released is None:
        raise Refused(409, f"{key} is held under several consumers ({outcome.consumer}): release it from its row")
    released = outcome.released
    if released.blocked_by:
        line = f"{key}: released (was held by quarantined head {released.blocked_by}); {released.parked} parked"
    elif released.retrying:
        line = f"{key}: released (was held by {', '.join(released.retrying)} in a retry tier); {released.parked} parked"
    else:
        line = f"{key}: nothing held it; {released.parked} parked records are released by a running consumer"
    return _done(request, "release", [f"consumer {outcome.consumer}: {line}"], back="/keys")


async def retry_effect(request: Request) -> Response:
    """Try failed effects again with a fresh budget (idempotent kinds called again, the others looked up first)."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    reason = field(fields, "reason")
    if not reason:
        raise Refused(400, "say why it should be tried again: the reason is empty")
    keys = [one.strip() for one in fields.get("key", []) if one.strip()]
    kind = field(fields, "kind") or None
    if not keys and kind is None:
        raise Refused(400, "name the effects to retry")
    specs = list(state_of(request).wiring.effect_specs)
    by_name = {spec.name: spec for spec in specs}

    def goes_to(name: str) -> str:
        return retry_state(by_name.get(name))

    listed = dry_run_list(fields)
    if listed is not None:
        selection = list(listed.get("keys", ()))
    else:
        async with reading(request) as connection:
            selection = await operations.failed_effects(connection, keys, kind)
    # A selection by kind is only ever confirmed from its dry run: the failed effects of a kind change meanwhile.
    if not _confirmed(fields) or (listed is None and kind is not None):
        async with reading(request) as connection:
            preview = await operations.retry_preview(connection, selection, goes_to, waiting_for(specs))
        retried = [one for one, (_, went) in preview.items() if went]
        refused = [said.retried(one, was, went) for one, (was, went) in preview.items() if not went]
        return _preview(request, "retry", fields, retried, {"reason": reason}, {"keys": selection}, refused)
    if not selection:
        return _done(request, "retry", ["nothing selected: nothing changed"], back="/effects")
    async with changing(request) as connection:
        outcomes = await operations.retry_effects(
            connection,
            selection,
            kind,
            reason,
            who.operator.name,
            goes_to,
            waiting_for(specs),
        )
    lines = [said.retried(one, was, went) for one, (was, went) in outcomes.items()]
    return _done(request, "retry", lines, back=f"/effects/{selection[0]}" if len(selection) == 1 else "/effects")


async def reprocess(request: Request) -> Response:
    """Send selected records back through `<source>.reprocess`: a dry run first (count, target topic, sample,
    rate), then, confirmed, a run in the background whose page shows its progress and verified outcome."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    reason = field(fields, "reason") or field(fields, "text")
    if not reason:
        raise Refused(400, "say why this run is needed: the reason is empty")
    selection = reprocess_selection(request, fields)
    code = selection.error_code
    rate = _rate(field(fields, "rate"))
    consumer = field(fields, "consumer") or None
    listed = dry_run_list(fields)
    if listed is not None:
        # Exactly what the dry run listed, each held to the status it had then (a record resolved since is skipped).
        named = tuple(listed.get("failure_ids", ()))
        seen = tuple(zip(named, listed.get("statuses", ()), strict=False))
        selection, consumer = Selection(named, None, None, None, seen), listed.get("consumer")
    elif (code, selection.owner, selection.since, selection.until) != (None, None, None, None) and _confirmed(fields):
        fields = {name: values for name, values in fields.items() if name != "confirm"}  # a dry run first
    state = state_of(request)
    settings = state.wiring.settings
    async with reading(request) as connection:
        pairs = await operations.reprocess_owners(
            connection,
            selection.failure_ids,
            selection.error_code,
            selection.since,
            selection.until,
            consumer,
            selection.owner,
        )
    if len(pairs) > 1:
        names = ", ".join(f"{name} ({topic})" for name, topic in pairs)
        raise Refused(409, f"the selection spans several consumers: {names}: select one consumer's records")
    owner = settings
    if pairs:
        owner = settings.model_copy(update={"consumer_name": pairs[0][0], "source_topic": pairs[0][1]})
    options = Options(reason=reason, actor=who.operator.name, rate=rate, ramp=field(fields, "ramp") == "yes")
    if any(not run.done for run in state.runs.values()):
        # One run at a time from a console: a second (a double click, a second tab) could send records twice.
        raise Refused(409, "a reprocess run started here is still running: wait for it to finish (Reprocess runs)")
    if not _confirmed(fields):
        dry = RunProgress()
        report = await state.wiring.reprocess(owner, selection, dataclasses.replace(options, dry_run=True), dry)
        usable = report.selection
        facts = {
            "consumer": owner.consumer_name,
            "target topic": owner.topics.reprocess,
            "rate": f"{rate:g} records/s",
            "ramp": "batches of 1, 2, 5, 20, 50, 100, each once the one before is verified; stops on the first failure"
            if options.ramp
            else "no",
            "skipped (no longer decodes)": str(len(report.undecodable)),
            "reason": reason,
        }
        picked = {
            "consumer": owner.consumer_name,
            "failure_ids": usable,
            "statuses": [report.statuses.get(one, "") for one in usable],
        }
        return _preview(request, "reprocess", fields, usable, facts, picked)
    launch = secrets.token_hex(8)
    progress = RunProgress()
    state.runs[launch] = progress

    async def run() -> None:
        try:
            await state.wiring.reprocess(owner, selection, options, progress)
        except Exception as error:  # the run's row says so too (the reprocessor marks it failed)
            progress.error = explain(error, state.wiring.settings)
            log.warning("console.reprocess_failed", actor=who.operator.name, error=progress.error)
        finally:
            progress.done = True
            progress.ready.set()

    task = asyncio.create_task(run())
    state.tasks.add(task)
    task.add_done_callback(state.tasks.discard)
    # The run id is written before the first record is sent: go to its page as soon as it exists.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(progress.ready.wait(), timeout=5)
    target = f"/runs/{progress.run_id}" if progress.run_id is not None else f"/launches/{launch}"
    return RedirectResponse(target, status_code=303)


def _rate(value: str) -> float:
    if not value:
        return 10.0
    try:
        rate = float(value)
    except ValueError:
        raise Refused(400, "rate: must be a number of records per second") from None
    if not 0.01 <= rate <= 10_000:
        raise Refused(400, "rate: must be from 0.01 to 10000 records per second")
    return rate
