"""The console's routes: login, the read pages, the JSON API (contract §9) and the actions.

Every page reads through the CLI's store queries and every action goes through `service.operations`, in one
unit of work with its audit row. An action first answers with a preview (what exactly will happen) and acts
only on the confirmed form.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from service import operations
from service.console import views
from service.console.app import (
    LOGIN_COOKIE,
    Refused,
    RunProgress,
    caller,
    changing,
    checked_form,
    client_of,
    log,
    reading,
    render,
    state_of,
)
from service.console.sessions import COOKIE
from service.console.tokens import match
from service.durations import parse_duration
from service.explain import explain
from service.store import audit, gauges, parking, quarantine
from service.store import console as console_store
from service.store import effects as effects_store
from service.store import reprocess as reprocess_store
from service.store.uow import ping
from service.worker.effect_kinds import retry_state, waiting_for
from service.worker.reprocess import Options, Selection

STATUSES = ("open", "resolved", "reprocessing", "reprocessed")
EFFECT_STATES = ("pending", "in_flight", "sent", "uncertain", "failed")
PAGE_SIZES = (25, 50, 100, 200)
# The alert thresholds the overview colours by (deploy/prometheus/alerts.yml; a test keeps them equal).
OLDEST_OPEN_ALERT_SECONDS = 3600
OUTBOX_OLDEST_ALERT_SECONDS = 300
SAMPLE = 5  # ids a preview lists
SHOWN_AT_MOST = 500  # rows of a run's items or of the held keys a page shows (counted in full)
_LOGIN_TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # what `secrets.token_urlsafe(24)` makes


# ---------------------------------------------------------------- parsing what a request asks


def _one(fields: dict[str, list[str]], name: str, default: str = "") -> str:
    return (fields.get(name) or [default])[0].strip()


def _query(request: Request) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        found.setdefault(name, []).append(value)
    return found


def _moment(value: str, name: str) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Refused(400, f"{name}: {value!r} is not an RFC 3339 timestamp") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _duration(value: str, name: str) -> timedelta | None:
    if not value:
        return None
    try:
        return parse_duration(value)
    except ValueError as error:
        raise Refused(400, f"{name}: {error}") from None


def _code(request: Request, value: str) -> str | None:
    if value and value not in state_of(request).wiring.codes:
        raise Refused(400, f"error_code: {value!r} is not an error code")
    return value or None


def _filters(request: Request, fields: dict[str, list[str]]) -> quarantine.Filters:
    """The quarantine filters of a query string or form (the CLI's `quarantine list` options)."""
    status = _one(fields, "status")
    if status and status not in STATUSES:
        raise Refused(400, f"status: {status!r} is not one of {', '.join(STATUSES)}")
    return quarantine.Filters(
        error_code=_code(request, _one(fields, "error_code")),
        status=status or None,
        older_than=_duration(_one(fields, "older_than"), "older_than"),
        key=_one(fields, "key") or None,
        message_id=_one(fields, "message_id") or None,
        since=_moment(_one(fields, "since"), "since"),
        until=_moment(_one(fields, "until"), "until"),
        owner=_one(fields, "owner") or None,
    )


def _int(value: str, name: str, *, low: int, high: int, default: int) -> int:
    if not value:
        return default
    if not value.isdigit() or not low <= int(value) <= high:
        raise Refused(400, f"{name}: must be a whole number from {low} to {high}")
    return int(value)


def _after(sort: str, value: str, failure_id: str) -> tuple[Any, str] | None:
    """Where a page starts: the previous page's last sort value, typed as its column, and failure id."""
    if not failure_id:
        return None
    if sort in {"first_failed_at", "last_failed_at"}:
        return _moment(value, "after") or datetime.now(UTC), failure_id
    if sort == "attempts":
        return _int(value, "after", low=0, high=2**31 - 1, default=0), failure_id
    return value, failure_id


def _cursor(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


# ---------------------------------------------------------------- health and login


async def favicon(request: Request) -> Response:
    """No icon (the browser asks for one on every page; answered without a login, and cheaply)."""
    return Response(status_code=204)


async def healthz(request: Request) -> Response:
    """Liveness, without authentication: the process answers."""
    return PlainTextResponse("ok")


async def readyz(request: Request) -> Response:
    """Readiness, without authentication: the database answers (503 with the reason in one line otherwise)."""
    try:
        await ping(state_of(request).wiring.engine)
    except Exception as error:
        return PlainTextResponse(f"not ready: {explain(error)}", status_code=503)
    return PlainTextResponse("ready")


async def login_form(request: Request, *, error: str = "", status: int = 200) -> Response:
    """The login form, with a double-submit CSRF token in a cookie of its own: the one the browser holds, if any,
    so that a request the page did not make (the browser's own `/favicon.ico`, sent here as it is not logged in)
    or a second tab does not replace the token of the form already shown."""
    held = request.cookies.get(LOGIN_COOKIE, "")
    token = held if _LOGIN_TOKEN.fullmatch(held) else secrets.token_urlsafe(24)
    response = render(
        request,
        "login.html",
        {"login_csrf": token, "next": _next(request.query_params.get("next", "/")), "error": error},
        status=status,
    )
    response.set_cookie(LOGIN_COOKIE, token, max_age=600, httponly=True, samesite="strict", secure=_secure(request))
    return response


def _next(path: str) -> str:
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


def _secure(request: Request) -> bool:
    return state_of(request).wiring.settings.console_behind_tls


async def login(request: Request) -> Response:
    """Exchange a token for a session cookie; failures are counted per client, logged without the token."""
    state = state_of(request)
    client = client_of(request)
    form = await request.form()
    given_csrf = str(form.get("csrf", ""))
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not secrets.compare_digest(given_csrf.encode(), expected.encode()):
        raise Refused(403, "the login form is stale or forged (no valid CSRF token): reload the page")
    wait = state.limiter.blocked(client)
    if wait is not None:
        log.warning("console.login_limited", client=client)
        response = await login_form(request, error=f"too many failed logins: try again in {int(wait) + 1}s", status=429)
        response.headers["retry-after"] = str(int(wait) + 1)
        return response
    operator = match(state.operators, str(form.get("token", "")).strip())
    if operator is None:
        state.limiter.failed(client)
        log.warning("console.login_failed", client=client)
        return await login_form(request, error="that token is not valid", status=401)
    cookie, _ = state.sessions.issue(operator)
    log.info("console.login", actor=operator.name, role=operator.role, client=client)
    response = RedirectResponse(_next(str(form.get("next", "/"))), status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(state.sessions.ttl_seconds),
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE)
    return response


async def logout(request: Request) -> Response:
    """End the session (its cookie is removed)."""
    who = caller(request)
    await checked_form(request, who)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# ---------------------------------------------------------------- read pages


async def overview(request: Request) -> Response:
    """Open quarantine by code and owner, the oldest open age, the last day's rate, backlogs, the last reconcile."""
    caller(request)
    async with reading(request) as connection:
        readings = await gauges.read(connection)
        now, rate = await console_store.last_day(connection)
        last_reconcile = await console_store.last_reconcile(connection)
    groups = sorted(readings.quarantine_open.items(), key=lambda item: (-item[1], item[0]))
    chart = views.chart(now, rate)
    return render(
        request,
        "overview.html",
        {
            "readings": readings,
            "groups": [{"error_code": code, "owner": owner, "open": int(count)} for (code, owner), count in groups],
            "open": int(sum(readings.quarantine_open.values())),
            "oldest_alert": readings.quarantine_oldest > OLDEST_OPEN_ALERT_SECONDS,
            "outbox_alert": readings.outbox_oldest > OUTBOX_OLDEST_ALERT_SECONDS,
            "chart": chart,
            "series": {code: views.palette_index(code, chart.codes) for code in chart.codes},
            "last_reconcile": last_reconcile,
        },
    )


async def quarantine_list(request: Request) -> Response:
    """The queue: filtered, sorted, paged by key; `N of M` shown; an htmx request gets the table alone."""
    caller(request)
    fields = _query(request)
    filters = _filters(request, fields)
    sort = _one(fields, "sort", "first_failed_at")
    if sort not in quarantine.SORTS:
        raise Refused(400, f"sort: {sort!r} is not one of {', '.join(quarantine.SORTS)}")
    descending = _one(fields, "direction") == "desc"
    limit = _int(_one(fields, "limit"), "limit", low=1, high=200, default=50)
    after = _after(sort, _one(fields, "after"), _one(fields, "after_id"))
    async with reading(request) as connection:
        page = await quarantine.page(connection, filters, sort=sort, descending=descending, after=after, limit=limit)
    kept = {
        name: _one(fields, name)
        for name in (
            "error_code",
            "status",
            "owner",
            "key",
            "message_id",
            "older_than",
            "since",
            "until",
            "sort",
            "direction",
        )
        if _one(fields, name)
    }
    if limit != 50:
        kept["limit"] = str(limit)
    next_url = (
        "/quarantine?" + urlencode({**kept, "after": _cursor(page.next_after[0]), "after_id": page.next_after[1]})
        if page.next_after is not None
        else None
    )

    def sorted_by(column: str) -> str:
        flip = "asc" if sort == column and descending else "desc" if sort == column else "asc"
        return "/quarantine?" + urlencode(
            {**{k: v for k, v in kept.items() if k not in {"sort", "direction"}}, "sort": column, "direction": flip}
        )

    template = (
        "quarantine_rows.html"
        if request.headers.get("hx-request") and request.headers.get("hx-target") == "queue"
        else "quarantine.html"
    )
    return render(
        request,
        template,
        {
            "page": page,
            "filters": kept,
            "first_url": "/quarantine?" + urlencode(kept) if after is not None else None,
            "next_url": next_url,
            "sort": sort,
            "descending": descending,
            "sorted_by": sorted_by,
            "codes": sorted(state_of(request).wiring.codes),
            "statuses": STATUSES,
            "limit": limit,
            "page_sizes": PAGE_SIZES,
        },
    )


async def _record(request: Request, failure_id: str) -> dict[str, Any]:
    async with reading(request) as connection:
        found = await quarantine.get(connection, failure_id)
    if found is None:
        raise Refused(404, f"no quarantined record with failure id {failure_id}")
    return found


def _record_context(request: Request, record: dict[str, Any]) -> dict[str, Any]:
    payload = record.pop("payload", None)
    failing = None
    if record["error_code"] == "INVALID_FIELD":
        found = state_of(request).wiring.failing_field(bytes(payload) if payload is not None else None)
        failing = {"path": found[0], "rule": found[1]} if found else None
    return {
        "record": record,
        "failing_field": failing,
        "payload_size": len(bytes(payload)) if payload is not None else None,
        "envelope": views.pretty(record["envelope"]),
        "headers": record.get("source_headers") or [],
    }


async def quarantine_record(request: Request) -> Response:
    """One record: its envelope, the true timeline, the failing field; the payload only on an operator's reveal."""
    caller(request)
    failure_id = request.path_params["failure_id"]
    record = await _record(request, failure_id)
    return render(request, "record.html", {**_record_context(request, record), "payload": None})


async def reveal(request: Request) -> Response:
    """An operator reveals a record's payload: escaped text or hex, never HTML; audited, in the timeline."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    failure_id = _one(fields, "failure_id")
    async with changing(request) as connection:
        record = await operations.reveal(connection, failure_id, who.operator.name, ["text or hex"], via="console")
    if record is None:
        raise Refused(404, f"no quarantined record with failure id {failure_id}")
    shown = views.payload_view(record.get("payload"))
    async with reading(request) as connection:  # the timeline now holds the reveal
        record = await quarantine.get(connection, failure_id) or record
    return render(request, "record.html", {**_record_context(request, record), "payload": shown})


async def held_keys(request: Request) -> Response:
    """Keys held behind a failed head, per consumer, with what holds each (the CLI's `parked list`)."""
    caller(request)
    consumer = _one(_query(request), "consumer") or None
    async with reading(request) as connection:
        held = await parking.summary(connection, consumer)
    return render(request, "keys.html", {"held": held[:SHOWN_AT_MOST], "total": len(held), "consumer": consumer or ""})


async def held_key(request: Request) -> Response:
    """One held key: what holds it and the records parked behind it, in the order they will be applied."""
    caller(request)
    fields = _query(request)
    consumer, key = _one(fields, "consumer"), _one(fields, "key")
    if not consumer or not key:
        raise Refused(400, "name the consumer and the key")
    async with reading(request) as connection:
        detail = await console_store.held_key(connection, consumer, key)
    return render(request, "key.html", {"held": detail})


async def effects_list(request: Request) -> Response:
    """The effects ledger by state and kind, oldest first (the CLI's `effects list`)."""
    caller(request)
    fields = _query(request)
    states = [state for state in fields.get("state", []) if state] or [s for s in EFFECT_STATES if s != "sent"]
    for state in states:
        if state not in EFFECT_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(EFFECT_STATES)}")
    kind = _one(fields, "kind") or None
    limit = _int(_one(fields, "limit"), "limit", low=1, high=200, default=50)
    offset = _int(_one(fields, "offset"), "offset", low=0, high=1_000_000, default=0)
    async with reading(request) as connection:
        rows, total = await effects_store.listing(connection, states, kind=kind, limit=limit, offset=offset)
    specs = state_of(request).wiring.effect_specs
    settings = state_of(request).wiring.settings
    disabled = {spec.name for spec in specs if not getattr(settings, spec.provider_setting, None)}
    kept = {"kind": kind or "", "limit": str(limit)}
    query = [("state", state) for state in states] + [(k, v) for k, v in kept.items() if v]
    return render(
        request,
        "effects.html",
        {
            "rows": rows,
            "total": total,
            "states": states,
            "all_states": EFFECT_STATES,
            "kinds": [spec.name for spec in specs],
            "kind": kind or "",
            "disabled": disabled,
            "offset": offset,
            "next_url": "/effects?" + urlencode([*query, ("offset", str(offset + limit))])
            if offset + limit < total
            else None,
        },
    )


async def effect_detail(request: Request) -> Response:
    """One effect: state, attempts, last error, lease, provider reference, payload (the CLI's `effects show`)."""
    caller(request)
    key = request.path_params["key"]
    async with reading(request) as connection:
        row = await effects_store.get(connection, key)
    if row is None:
        raise Refused(404, f"no effect with idempotency key {key}")
    return render(request, "effect.html", {"effect": row, "payload": views.pretty(row.get("payload"))})


async def runs_list(request: Request) -> Response:
    """Reprocess runs, newest first (the CLI's `reprocess list`)."""
    caller(request)
    fields = _query(request)
    offset = _int(_one(fields, "offset"), "offset", low=0, high=1_000_000, default=0)
    async with reading(request) as connection:
        rows, total = await reprocess_store.runs(connection, limit=50, offset=offset)
    live = {run.run_id: launch for launch, run in state_of(request).runs.items() if run.run_id}
    return render(
        request,
        "runs.html",
        {
            "rows": rows,
            "total": total,
            "offset": offset,
            "live": live,
            "next_url": f"/runs?offset={offset + 50}" if offset + 50 < total else None,
        },
    )


async def run_detail(request: Request) -> Response:
    """One run: its audit row and every item's verified outcome; while it runs, its progress refreshes itself."""
    caller(request)
    run_id = request.path_params["run_id"]
    async with reading(request) as connection:
        run = await reprocess_store.run_with_items(connection, run_id)
    if run is None:
        raise Refused(404, f"no reprocess run {run_id}")
    items = run["items"]
    run["items"], run["item_count"] = items[:SHOWN_AT_MOST], len(items)  # a page of a huge run stays fast
    fragment = request.headers.get("hx-request") and request.headers.get("hx-target") == "run"
    return render(
        request, "run_body.html" if fragment else "run.html", {"run": run, "running": run["finished_at"] is None}
    )


async def launch_status(request: Request) -> Response:
    """A run started from this console, before its run id exists: where it is, or where it went."""
    caller(request)
    launch = request.path_params["launch"]
    progress = state_of(request).runs.get(launch)
    if progress is None:
        raise Refused(404, "no such run was started here")
    if progress.run_id is not None:
        if request.headers.get("hx-request"):  # htmx polls this page: have it load the run's page instead
            return Response(status_code=200, headers={"HX-Redirect": f"/runs/{progress.run_id}"})
        return RedirectResponse(f"/runs/{progress.run_id}", status_code=303)
    return render(request, "launch.html", {"launch": launch, "progress": progress})


# ---------------------------------------------------------------- the JSON API (contract §9)


async def api_quarantine(request: Request) -> Response:
    """`quarantine list` as JSON: the same filters, paged (`limit`, `offset`), with the total."""
    caller(request)
    fields = _query(request)
    filters = _filters(request, fields)
    limit = _int(_one(fields, "limit"), "limit", low=1, high=10_000, default=100)
    offset = _int(_one(fields, "offset"), "offset", low=0, high=10_000_000, default=0)
    async with reading(request) as connection:
        rows, total = await quarantine.listing(
            connection,
            error_code=filters.error_code,
            status=filters.status,
            older_than=filters.older_than,
            key=filters.key,
            message_id=filters.message_id,
            since=filters.since,
            until=filters.until,
            owner=filters.owner,
            limit=limit,
            offset=offset,
        )
    return JSONResponse({"items": _jsonable(rows), "total": total, "limit": limit, "offset": offset})


async def api_record(request: Request) -> Response:
    """`quarantine show --json` without the payload (a reveal is the console's, audited)."""
    caller(request)
    record = await _record(request, request.path_params["failure_id"])
    context = _record_context(request, record)
    return JSONResponse(_jsonable({**context["record"], "failing_field": context["failing_field"]}))


async def api_stats(request: Request) -> Response:
    """What `quarantine stats --json` prints."""
    caller(request)
    async with reading(request) as connection:
        summary = await quarantine.stats(connection)
    return JSONResponse(_jsonable(summary))


# ---------------------------------------------------------------- actions: a preview, then the confirmed form


def _wanted(request: Request, fields: dict[str, list[str]]) -> operations.Wanted:
    """The records an action means: the ticked ones, or (`scope=matching`) every open one matching the list's
    code, key and age filters (the ticked ones among them, if any): the CLI's selection rule."""
    ids = tuple(dict.fromkeys(one.strip() for one in fields.get("failure_id", []) if one.strip()))
    prefix = "match_" if _one(fields, "scope") == "matching" else ""
    wanted = operations.Wanted(
        ids,
        _code(request, _one(fields, f"{prefix}error_code")) if prefix else None,
        (_one(fields, f"{prefix}key") or None) if prefix else None,
        _duration(_one(fields, f"{prefix}older_than"), "older_than") if prefix else None,
    )
    if not wanted.ids and not wanted.selecting:
        raise Refused(400, "select records: tick them in the list, or filter by code, key or age")
    return wanted


def _confirmed(fields: dict[str, list[str]]) -> bool:
    return _one(fields, "confirm") == "yes"


async def _picked(request: Request, wanted: operations.Wanted) -> list[str]:
    async with reading(request) as connection:
        try:
            return await wanted.pick(connection)
        except operations.SelectionTooLarge as error:
            raise Refused(400, str(error)) from None


def _preview(
    request: Request, action: str, fields: dict[str, list[str]], selection: list[str], facts: dict[str, Any]
) -> Response:
    kept = [(name, value) for name, values in fields.items() if name not in {"csrf", "confirm"} for value in values]
    return render(
        request,
        "preview.html",
        {"action": action, "count": len(selection), "sample": selection[:SAMPLE], "kept": kept, "facts": facts},
    )


def _done(request: Request, action: str, lines: list[str], *, back: str) -> Response:
    return render(request, "done.html", {"action": action, "lines": lines, "back": back})


async def annotate(request: Request) -> Response:
    """Append a note to the selected records (append-only)."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    note = _one(fields, "note") or _one(fields, "text")
    if not note:
        raise Refused(400, "say what you found or did: the note is empty")
    wanted = _wanted(request, fields)
    selection = await _picked(request, wanted)
    if not _confirmed(fields):
        return _preview(request, "annotate", fields, selection, {"note": note})
    async with changing(request) as connection:
        added = await operations.annotate(connection, wanted, selection, who.operator.name, note)
    lines = [f"{one}: note added" for one in added] + [
        f"{one}: no such record" for one in selection if one not in added
    ]
    return _done(request, "annotate", lines or ["nothing selected: nothing changed"], back=_back(selection))


async def resolve(request: Request) -> Response:
    """Close the selected open records without reprocessing them; frees the keys they held."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    reason = _one(fields, "reason") or _one(fields, "text")
    if not reason:
        raise Refused(400, "say why they need no reprocessing: the reason is empty")
    wanted = _wanted(request, fields)
    selection = await _picked(request, wanted)
    if not _confirmed(fields):
        return _preview(request, "resolve", fields, selection, {"reason": reason})
    async with changing(request) as connection:
        outcomes = await operations.resolve(connection, wanted, selection, who.operator.name, reason)
    lines = [
        f"{one}: resolved" if previous == "open" else f"{one}: {previous or 'no such record'}, not open: unchanged"
        for one, previous in outcomes.items()
    ]
    return _done(request, "resolve", lines or ["nothing selected: nothing changed"], back=_back(selection))


def _back(selection: list[str]) -> str:
    return f"/quarantine/{selection[0]}" if len(selection) == 1 else "/quarantine"


async def release(request: Request) -> Response:
    """Free a held key; its parked records are then applied in order by a running consumer."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    key, consumer = _one(fields, "key"), _one(fields, "consumer") or None
    if not key:
        raise Refused(400, "name the key to release")
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
    reason = _one(fields, "reason")
    if not reason:
        raise Refused(400, "say why it should be tried again: the reason is empty")
    keys = [one.strip() for one in fields.get("key", []) if one.strip()]
    kind = _one(fields, "kind") or None
    if not keys and kind is None:
        raise Refused(400, "name the effects to retry")
    specs = list(state_of(request).wiring.effect_specs)
    by_name = {spec.name: spec for spec in specs}
    async with reading(request) as connection:
        selection = await operations.failed_effects(connection, keys, kind)
    if not _confirmed(fields):
        return _preview(request, "retry", fields, selection, {"reason": reason})
    async with changing(request) as connection:
        outcomes = await operations.retry_effects(
            connection,
            selection,
            kind,
            reason,
            who.operator.name,
            lambda name: retry_state(by_name.get(name)),
            waiting_for(specs),
        )
    lines = [
        f"{one}: {went}: " + ("the effect worker calls it again" if went == "pending" else "the reconciler looks it up")
        if went
        else f"{one}: {was or 'no such effect'}: not retried"
        for one, (was, went) in outcomes.items()
    ]
    return _done(request, "retry", lines, back=f"/effects/{selection[0]}" if len(selection) == 1 else "/effects")


async def reprocess(request: Request) -> Response:
    """Send selected records back through `<source>.reprocess`: a dry run first (count, target topic, sample,
    rate), then, confirmed, a run in the background whose page shows its progress and verified outcome."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    reason = _one(fields, "reason") or _one(fields, "text")
    if not reason:
        raise Refused(400, "say why this run is needed: the reason is empty")
    ids = tuple(dict.fromkeys(one.strip() for one in fields.get("failure_id", []) if one.strip()))
    code = _code(request, _one(fields, "match_error_code")) if _one(fields, "scope") == "matching" else None
    if not ids and code is None:
        raise Refused(400, "select records to reprocess: tick them in the list, or filter by code")
    rate = _rate(_one(fields, "rate"))
    selection = Selection(ids, code, None, None)
    state = state_of(request)
    settings = state.wiring.settings
    async with reading(request) as connection:
        pairs = await operations.reprocess_owners(connection, ids, code, None, None, _one(fields, "consumer") or None)
    if len(pairs) > 1:
        names = ", ".join(f"{name} ({topic})" for name, topic in pairs)
        raise Refused(409, f"the selection spans several consumers: {names}: select one consumer's records")
    owner = settings
    if pairs:
        owner = settings.model_copy(update={"consumer_name": pairs[0][0], "source_topic": pairs[0][1]})
    options = Options(reason=reason, actor=who.operator.name, rate=rate)
    if any(not run.done for run in state.runs.values()):
        # One run at a time from a console: a second (a double click, a second tab) could send records twice.
        raise Refused(409, "a reprocess run started here is still running: wait for it to finish (Reprocess runs)")
    if not _confirmed(fields):
        dry = RunProgress()
        report = await state.wiring.reprocess(owner, selection, dataclasses.replace(options, dry_run=True), dry)
        usable = [one for one in report.selection if one not in set(report.undecodable)]
        facts = {
            "consumer": owner.consumer_name,
            "target topic": owner.topics.reprocess,
            "rate": f"{rate:g} records/s",
            "skipped (no longer decodes)": str(len(report.undecodable)),
            "reason": reason,
        }
        return _preview(request, "reprocess", fields, usable, facts)
    launch = secrets.token_hex(8)
    progress = RunProgress()
    state.runs[launch] = progress

    async def run() -> None:
        try:
            await state.wiring.reprocess(owner, selection, options, progress)
        except Exception as error:  # the run's row says so too (the reprocessor marks it failed)
            progress.error = explain(error)
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


async def audit_page(request: Request) -> Response:
    """The latest audit rows: who did what, to what, and what came of it."""
    caller(request)
    async with reading(request) as connection:
        rows = await audit.recent(connection, limit=200)
    return render(request, "audit.html", {"rows": rows, "pretty": views.pretty})


ROUTES = [
    Route("/healthz", healthz),
    Route("/favicon.ico", favicon),
    Route("/readyz", readyz),
    Route("/login", login_form, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
    Route("/", overview),
    Route("/quarantine", quarantine_list),
    Route("/quarantine/{failure_id:path}", quarantine_record),
    Route("/keys", held_keys),
    Route("/keys/detail", held_key),
    Route("/effects", effects_list),
    Route("/effects/{key:path}", effect_detail),
    Route("/runs", runs_list),
    Route("/runs/{run_id}", run_detail),
    Route("/launches/{launch}", launch_status),
    Route("/audit", audit_page),
    Route("/api/quarantine", api_quarantine),
    Route("/api/quarantine/{failure_id:path}", api_record),
    Route("/api/stats", api_stats),
    Route("/actions/reveal", reveal, methods=["POST"]),
    Route("/actions/annotate", annotate, methods=["POST"]),
    Route("/actions/resolve", resolve, methods=["POST"]),
    Route("/actions/reprocess", reprocess, methods=["POST"]),
    Route("/actions/release", release, methods=["POST"]),
    Route("/actions/retry", retry_effect, methods=["POST"]),
]
