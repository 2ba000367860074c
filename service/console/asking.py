"""What a console request asks, parsed: its fields, filters, timestamps, durations and page starts.

A value that cannot be used is a 400 naming the field and what it takes, as a bad CLI flag is an exit 2: the bounds
are the CLI's (service/bounds.py), and no value may hold NUL, which no stored text holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request

from service import bounds
from service.console.web import Refused, state_of
from service.durations import time_range
from service.store import quarantine, quarantine_reads
from service.worker.reprocess_run import Selection


def field(fields: dict[str, list[str]], name: str, default: str = "") -> str:
    """The first value of a query or form field, trimmed (`default` when absent)."""
    return (fields.get(name) or [default])[0].strip()


def query_fields(request: Request) -> dict[str, list[str]]:
    """A request's query string as every value of each name; a value holding NUL is 400 naming its field."""
    found: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        found.setdefault(name, []).append(checked_text(value, name))
    return found


def checked_text(value: str, name: str) -> str:
    """A text a request gives (a field, a path segment): 400 naming it when it holds NUL or is too long."""
    try:
        return bounds.text(value)
    except ValueError as error:
        raise Refused(400, f"{name}: {error}") from None


def path_value(request: Request, name: str) -> str:
    """A path parameter (a failure id, an effect's key, a run id), checked as a text filter is."""
    return checked_text(str(request.path_params[name]), name)


def moment(value: str, name: str) -> datetime | None:
    """An RFC 3339 value (UTC when it names no zone); a bad one is 400 naming the field."""
    if not value:
        return None
    try:
        return bounds.moment(value, zone_required=False)
    except ValueError as error:
        raise Refused(400, f"{name}: {error}") from None


def since_or_ago(value: str, name: str) -> datetime | None:
    """A point in time as the CLI's --since / --until take it: RFC 3339 (UTC when it names no zone) or a duration
    ago (`2h`); a bad one is 400 naming the field."""
    if not value:
        return None
    try:
        return bounds.moment_or_ago(value, datetime.now(UTC), zone_required=False)
    except ValueError as error:
        raise Refused(400, f"{name}: {error}") from None


def first_failed_range(since: str, until: str, prefix: str = "") -> tuple[datetime | None, datetime | None]:
    """A form's range of first-failed times; one that ends before it starts is 400."""
    try:
        return time_range(since_or_ago(since, f"{prefix}since"), since_or_ago(until, f"{prefix}until"))
    except ValueError as error:
        raise Refused(400, f"{prefix}until: {error}") from None


def duration(value: str, name: str) -> timedelta | None:
    """A duration (`1h`), at most 100 years; a bad one is 400 naming the field."""
    if not value:
        return None
    try:
        return bounds.age(value)
    except ValueError as error:
        raise Refused(400, f"{name}: {error}") from None


def error_code(request: Request, value: str) -> str | None:
    """A known error code, the core's or the domain's (None when blank); another is 400."""
    if value and value not in state_of(request).wiring.codes:
        raise Refused(400, f"error_code: {value!r} is not an error code")
    return value or None


def quarantine_filters(request: Request, fields: dict[str, list[str]]) -> quarantine_reads.Filters:
    """The quarantine filters of a query string or form (the CLI's `quarantine list` options)."""
    status = field(fields, "status")
    if status and status not in quarantine.STATUSES:
        raise Refused(400, f"status: {status!r} is not one of {', '.join(quarantine.STATUSES)}")
    since, until = first_failed_range(field(fields, "since"), field(fields, "until"))
    return quarantine_reads.Filters(
        error_code=error_code(request, field(fields, "error_code")),
        status=status or None,
        older_than=duration(field(fields, "older_than"), "older_than"),
        key=field(fields, "key") or None,
        message_id=field(fields, "message_id") or None,
        since=since,
        until=until,
        owner=field(fields, "owner") or None,
        consumer=field(fields, "consumer") or None,
    )


def whole(value: str, name: str, *, low: int, high: int, default: int) -> int:
    """A whole number within bounds (`default` when blank); another is 400 naming the field."""
    if not value:
        return default
    try:
        return bounds.whole(value, low=low, high=high)
    except ValueError:
        raise Refused(400, f"{name}: must be a whole number from {low} to {high}") from None


def page_start(sort: str, value: str, failure_id: str, consumer: str) -> tuple[Any, str, str] | None:
    """Where a page starts: the previous page's last sort value, typed as its column, failure id and consumer."""
    if not failure_id:
        return None
    if sort in {"first_failed_at", "last_failed_at"}:
        return moment(value, "after") or datetime.now(UTC), failure_id, consumer
    if sort == "attempts":
        return whole(value, "after", low=0, high=2**31 - 1, default=0), failure_id, consumer
    return value, failure_id, consumer


def cursor(value: Any) -> str:
    """A sort value as a next-page link carries it."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def reprocess_selection(request: Request, fields: dict[str, list[str]]) -> Selection:
    """The records a reprocess form means: the ticked ones, or (`scope=matching`) the open ones of the list's code,
    owner and first-failed range (a failure group from the overview is its code and owner)."""
    ids = tuple(dict.fromkeys(one.strip() for one in fields.get("failure_id", []) if one.strip()))
    if field(fields, "scope") != "matching":
        if not ids:
            raise Refused(400, "select records to reprocess: tick them in the list, or filter by code")
        return Selection(ids)
    since, until = first_failed_range(field(fields, "match_since"), field(fields, "match_until"), "match_")
    code = error_code(request, field(fields, "match_error_code"))
    owner = field(fields, "match_owner") or None
    if not ids and (code, owner, since, until) == (None, None, None, None):
        raise Refused(400, "select records to reprocess: tick them in the list, or filter by code, owner or time")
    return Selection(ids, code, since, until, owner=owner)
