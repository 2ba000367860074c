"""The console's read pages and its JSON API (contract §9): the CLI's store queries, rendered.

Every page reads in one unit of work; the record page's payload is shown only through the reveal action.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from service import operations
from service.console import views
from service.console.asking import (
    cursor,
    field,
    page_start,
    path_value,
    quarantine_filters,
    query_fields,
    whole,
)
from service.console.web import (
    InertJSON,
    Refused,
    caller,
    changing,
    checked_form,
    reading,
    render,
    state_of,
)
from service.jsonable import jsonable
from service.store import audit, gauges, parking, processes, quarantine, quarantine_reads
from service.store import console as console_store
from service.store import effects as effects_store
from service.store import reprocess as reprocess_store
from service.store.quarantine import RecordKey
from service.worker.effect_kinds import last_error

PAGE_SIZES = (25, 50, 100, 200)
# The alert thresholds the overview colours by (deploy/prometheus/alerts.yml; a test keeps them equal).
OLDEST_OPEN_ALERT_SECONDS = 3600
OUTBOX_OLDEST_ALERT_SECONDS = 300
SHOWN_AT_MOST = 500  # rows of a run's items or of the held keys a page shows (counted in full)


async def overview(request: Request) -> Response:
    """Open quarantine by code and owner, the oldest open age, the last day's rate, backlogs, the last reconcile, and
    the live system: lag per topic, the oldest unprocessed age, every open breaker."""
    caller(request)
    async with reading(request) as connection:
        readings = await gauges.read(connection)
        now, rate = await console_store.last_day(connection)
        last_reconcile = await console_store.last_reconcile(connection)
        system = await processes.system(connection, others=0)  # the live ones: their lag, age and breakers
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
            "system": system,
        },
    )


async def quarantine_list(request: Request) -> Response:
    """The queue: filtered, sorted, paged by key; `N of M` shown; an htmx request gets the table alone."""
    caller(request)
    fields = query_fields(request)
    filters = quarantine_filters(request, fields)
    sort = field(fields, "sort", "first_failed_at")
    if sort not in quarantine_reads.SORTS:
        raise Refused(400, f"sort: {sort!r} is not one of {', '.join(quarantine_reads.SORTS)}")
    descending = field(fields, "direction") == "desc"
    limit = whole(field(fields, "limit"), "limit", low=1, high=200, default=50)
    after = page_start(sort, field(fields, "after"), field(fields, "after_id"), field(fields, "after_consumer"))
    async with reading(request) as connection:
        page = await quarantine_reads.page(
            connection, filters, sort=sort, descending=descending, after=after, limit=limit
        )
    kept = {
        name: field(fields, name)
        for name in (
            "error_code",
            "status",
            "owner",
            "key",
            "message_id",
            "older_than",
            "since",
            "until",
            "consumer",
            "sort",
            "direction",
        )
        if field(fields, name)
    }
    if limit != 50:
        kept["limit"] = str(limit)
    next_url = None
    if page.next_after is not None:
        value, failure_id, consumer = page.next_after
        next_url = "/quarantine?" + urlencode(
            {**kept, "after": cursor(value), "after_id": failure_id, "after_consumer": consumer}
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
            "statuses": quarantine.STATUSES,
            "limit": limit,
            "page_sizes": PAGE_SIZES,
        },
    )


async def locate(connection: AsyncConnection, failure_id: str, consumer: str | None) -> RecordKey:
    """The record a page or action names: by failure id, and by consumer where several consumer names hold that
    failure id (409 without it, as the CLI's exit 2); 404 when there is none."""
    try:
        found = await operations.locate(connection, failure_id, consumer)
    except operations.SeveralConsumers as error:
        raise Refused(409, f"{error}: name one (consumer=…)") from None
    if found is None:
        under = f" under consumer {consumer}" if consumer else ""
        raise Refused(404, f"no quarantined record with failure id {failure_id}{under}")
    return found


async def _record(request: Request, failure_id: str, consumer: str | None) -> dict[str, Any]:
    async with reading(request) as connection:
        found = await quarantine_reads.get(connection, await locate(connection, failure_id, consumer))
    if found is None:  # gone between the two reads: quarantine rows are never deleted, but say so if one were
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
        "trace": views.trace(record["envelope"], state_of(request).wiring.settings.console_trace_url),
        "headers": record.get("source_headers") or [],
    }


async def quarantine_record(request: Request) -> Response:
    """One record: its envelope, the true timeline, the failing field; the payload only on an operator's reveal."""
    caller(request)
    consumer = field(query_fields(request), "consumer") or None
    record = await _record(request, path_value(request, "failure_id"), consumer)
    return render(request, "record.html", {**_record_context(request, record), "payload": None})


async def reveal(request: Request) -> Response:
    """An operator reveals a record's payload: escaped text or hex, never HTML; audited, in the timeline."""
    who = caller(request, acts=True)
    fields = await checked_form(request, who)
    failure_id, consumer = field(fields, "failure_id"), field(fields, "consumer") or None
    async with changing(request) as connection:
        key = await locate(connection, failure_id, consumer)
        record = await operations.reveal(connection, key, who.operator.name, ["text or hex"], via="console")
    if record is None:
        raise Refused(404, f"no quarantined record with failure id {failure_id}")
    shown = views.payload_view(record.get("payload"))
    async with reading(request) as connection:  # the timeline now holds the reveal
        record = await quarantine_reads.get(connection, key) or record
    return render(request, "record.html", {**_record_context(request, record), "payload": shown})


async def held_keys(request: Request) -> Response:
    """Keys held behind a failed head, per consumer, with what holds each (the CLI's `parked list`)."""
    caller(request)
    consumer = field(query_fields(request), "consumer") or None
    async with reading(request) as connection:
        held = await parking.summary(connection, consumer)
    return render(request, "keys.html", {"held": held[:SHOWN_AT_MOST], "total": len(held), "consumer": consumer or ""})


async def held_key(request: Request) -> Response:
    """One held key: what holds it and the records parked behind it, in the order they will be applied."""
    caller(request)
    fields = query_fields(request)
    consumer, key = field(fields, "consumer"), field(fields, "key")
    if not consumer or not key:
        raise Refused(400, "name the consumer and the key")
    async with reading(request) as connection:
        detail = await console_store.held_key(connection, consumer, key)
    return render(request, "key.html", {"held": detail})


async def effects_list(request: Request) -> Response:
    """The effects ledger by state and kind, oldest first (the CLI's `effects list`)."""
    caller(request)
    fields = query_fields(request)
    states = [state for state in fields.get("state", []) if state] or [s for s in effects_store.STATES if s != "sent"]
    for state in states:
        if state not in effects_store.STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(effects_store.STATES)}")
    kind = field(fields, "kind") or None
    limit = whole(field(fields, "limit"), "limit", low=1, high=200, default=50)
    offset = whole(field(fields, "offset"), "offset", low=0, high=1_000_000, default=0)
    async with reading(request) as connection:
        rows, total = await effects_store.listing(connection, states, kind=kind, limit=limit, offset=offset)
    specs = state_of(request).wiring.effect_specs
    settings = state_of(request).wiring.settings
    unconfigured = {spec.name for spec in specs if not getattr(settings, spec.provider_setting, None)}
    kept = {"kind": kind or "", "limit": str(limit)}
    query = [("state", state) for state in states] + [(k, v) for k, v in kept.items() if v]
    return render(
        request,
        "effects.html",
        {
            "rows": [{**row, "last_error": last_error(row, unconfigured)} for row in rows],
            "total": total,
            "states": states,
            "all_states": effects_store.STATES,
            "kinds": [spec.name for spec in specs],
            "kind": kind or "",
            "offset": offset,
            "next_url": "/effects?" + urlencode([*query, ("offset", str(offset + limit))])
            if offset + limit < total
            else None,
        },
    )


async def effect_detail(request: Request) -> Response:
    """One effect: state, attempts, last error, lease, provider reference, payload (the CLI's `effects show`)."""
    caller(request)
    key = path_value(request, "key")
    async with reading(request) as connection:
        row = await effects_store.get(connection, key)
    if row is None:
        raise Refused(404, f"no effect with idempotency key {key}")
    return render(request, "effect.html", {"effect": row, "payload": views.pretty(row.get("payload"))})


async def runs_list(request: Request) -> Response:
    """Reprocess runs, newest first (the CLI's `reprocess list`)."""
    caller(request)
    fields = query_fields(request)
    offset = whole(field(fields, "offset"), "offset", low=0, high=1_000_000, default=0)
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
    run_id = path_value(request, "run_id")
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
    launch = path_value(request, "launch")
    progress = state_of(request).runs.get(launch)
    if progress is None:
        raise Refused(404, "no such run was started here")
    if progress.run_id is not None:
        if request.headers.get("hx-request"):  # htmx polls this page: have it load the run's page instead
            return Response(status_code=200, headers={"HX-Redirect": f"/runs/{progress.run_id}"})
        return RedirectResponse(f"/runs/{progress.run_id}", status_code=303)
    return render(request, "launch.html", {"launch": launch, "progress": progress})


async def api_quarantine(request: Request) -> Response:
    """`quarantine list` as JSON: the same filters, paged (`limit`, `offset`), with the total."""
    caller(request)
    fields = query_fields(request)
    filters = quarantine_filters(request, fields)
    limit = whole(field(fields, "limit"), "limit", low=1, high=10_000, default=100)
    offset = whole(field(fields, "offset"), "offset", low=0, high=10_000_000, default=0)
    async with reading(request) as connection:
        rows, total = await quarantine_reads.listing(
            connection,
            error_code=filters.error_code,
            status=filters.status,
            older_than=filters.older_than,
            key=filters.key,
            message_id=filters.message_id,
            since=filters.since,
            until=filters.until,
            owner=filters.owner,
            consumer=filters.consumer,
            limit=limit,
            offset=offset,
        )
    return InertJSON({"items": jsonable(rows), "total": total, "limit": limit, "offset": offset})


async def api_record(request: Request) -> Response:
    """`quarantine show --json` without the payload (a reveal is the console's, audited), with the record's trace id
    and link (`trace_id`, `trace_url`); `?consumer=` names the consumer's record where several consumer names
    quarantined the failure id (409 without it)."""
    caller(request)
    consumer = field(query_fields(request), "consumer") or None
    record = await _record(request, path_value(request, "failure_id"), consumer)
    context = _record_context(request, record)
    trace: views.Trace = context["trace"]
    return InertJSON(
        jsonable(
            {
                **context["record"],
                "failing_field": context["failing_field"],
                "trace_id": trace.trace_id,
                "trace_url": trace.url,
            }
        )
    )


async def api_stats(request: Request) -> Response:
    """What `quarantine stats --json` prints (`?owner=`: one owner's records, as `--owner`)."""
    caller(request)
    owner = field(query_fields(request), "owner") or None
    async with reading(request) as connection:
        summary = await quarantine_reads.stats(connection, owner)
    return InertJSON(jsonable(summary))


async def audit_page(request: Request) -> Response:
    """The latest audit rows: who did what, to what, and what came of it."""
    caller(request)
    async with reading(request) as connection:
        rows = await audit.recent(connection, limit=200)
    return render(request, "audit.html", {"rows": rows, "pretty": views.pretty})
