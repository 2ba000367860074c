"""Reading the quarantine for operators: filtered listings and pages of records, one record with its notes, reprocess
history and timeline, the consumers a failure is quarantined under, and the counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.quarantine import RecordKey

# The listing's filters, each off when its parameter is NULL: fixed SQL, whatever the filters. PostgreSQL plans
# each execution with its values (custom plans, uow.create_engine), so the filters that are off fold away.
_FILTERS = """
    (CAST(:consumer AS text) IS NULL OR consumer_name = :consumer)
    AND (CAST(:error_code AS text) IS NULL OR error_code = :error_code)
    AND (CAST(:status AS text) IS NULL OR status = :status)
    AND (CAST(:owner AS text) IS NULL OR owner = :owner)
    AND (CAST(:key AS text) IS NULL OR ordering_key = :key)
    AND (CAST(:message_id AS text) IS NULL OR message_id = :message_id)
    AND (CAST(:older_than AS interval) IS NULL OR first_failed_at <= now() - CAST(:older_than AS interval))
    AND (CAST(:since AS timestamptz) IS NULL OR first_failed_at >= :since)
    AND (CAST(:until AS timestamptz) IS NULL OR first_failed_at < :until)
"""


@dataclass(frozen=True)
class Filters:
    """What a listing of quarantined records is narrowed to; an empty filter (a blank code, a zero age) is none."""

    error_code: str | None = None
    status: str | None = None
    older_than: timedelta | None = None
    key: str | None = None
    message_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    owner: str | None = None
    consumer: str | None = None

    def params(self) -> dict[str, Any]:
        """The filters as `_FILTERS`'s parameters."""
        return {
            "consumer": self.consumer or None,
            "error_code": self.error_code or None,
            "status": self.status or None,
            "key": self.key or None,
            "message_id": self.message_id or None,
            "older_than": self.older_than or None,
            "since": self.since,
            "until": self.until,
            "owner": self.owner or None,
        }


_LISTING = text(
    f"""
    SELECT failure_id, message_id, error_code, status, owner, ordering_key, attempts, first_failed_at, last_failed_at,
           consumer_name
    FROM quarantine WHERE {_FILTERS}
    ORDER BY first_failed_at, failure_id, consumer_name LIMIT :limit OFFSET :offset
    """
)
_COUNT = text(f"SELECT count(*) FROM quarantine WHERE {_FILTERS}")


async def listing(
    connection: AsyncConnection,
    *,
    error_code: str | None = None,
    status: str | None = None,
    older_than: timedelta | None = None,
    key: str | None = None,
    message_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    owner: str | None = None,
    consumer: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Quarantined records, oldest first, filtered: one page of them, and how many match in all."""
    filters = Filters(error_code, status, older_than, key, message_id, since, until, owner, consumer).params()
    rows = [
        dict(row._mapping) for row in await connection.execute(_LISTING, {**filters, "limit": limit, "offset": offset})
    ]
    # Counted apart: a window count over the page's query would read every matching row in the page's order
    # (docs/performance.md, "The console at 100,000 quarantined records").
    total = int((await connection.execute(_COUNT, filters)).scalar_one())
    return rows, total


# The console's pages: by key (the sort column, then the record's key: failure id and consumer), never by offset,
# so the thousandth page costs what the first does. One statement per sort column and direction, each fixed SQL.
SORTS = ("first_failed_at", "last_failed_at", "error_code", "owner", "attempts")
_SORT_TYPES = {
    "first_failed_at": "timestamptz",
    "last_failed_at": "timestamptz",
    "error_code": "text",
    "owner": "text",
    "attempts": "int",
}
_PAGE_COLUMNS = (
    "failure_id, message_id, error_code, status, owner, ordering_key, attempts, first_failed_at, last_failed_at,"
    " consumer_name"
)


def _page_statement(column: str, descending: bool) -> Any:
    direction, beyond = ("DESC", "<") if descending else ("ASC", ">")
    cast = _SORT_TYPES[column]
    return text(
        f"""
        SELECT {_PAGE_COLUMNS} FROM quarantine
        WHERE {_FILTERS}
          AND (CAST(:after_id AS text) IS NULL
               OR ({column}, failure_id, consumer_name)
                  {beyond} (CAST(:after_value AS {cast}), CAST(:after_id AS text), CAST(:after_consumer AS text)))
        ORDER BY {column} {direction}, failure_id {direction}, consumer_name {direction} LIMIT :limit
        """
    )


_PAGES = {(column, descending): _page_statement(column, descending) for column in SORTS for descending in (False, True)}


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows, how many match in all, and where the next page starts (None: last): the
    last row's sort value, failure id and consumer name."""

    rows: list[dict[str, Any]]
    total: int
    next_after: tuple[Any, str, str] | None


async def page(
    connection: AsyncConnection,
    filters: Filters,
    *,
    sort: str = "first_failed_at",
    descending: bool = False,
    after: tuple[Any, str, str] | None = None,
    limit: int = 50,
) -> Page:
    """One page of quarantined records sorted by `sort` (then failure id and consumer), starting after `after` (the
    sort value, failure id and consumer name of the previous page's last row)."""
    params = filters.params()
    value, failure_id, consumer = after if after is not None else (None, None, None)
    statement = _PAGES[(sort, descending)]
    found = await connection.execute(
        statement,
        {**params, "after_value": value, "after_id": failure_id, "after_consumer": consumer, "limit": limit + 1},
    )
    rows = [dict(row._mapping) for row in found]
    more = len(rows) > limit
    rows = rows[:limit]
    total = int((await connection.execute(_COUNT, params)).scalar_one())
    last = rows[-1] if rows else None
    following = (last[sort], last["failure_id"], last["consumer_name"]) if more and last is not None else None
    return Page(rows, total, following)


_GET = text(
    """
    SELECT failure_id, consumer_name, message_id, error_code, status, owner, ordering_key, envelope, payload,
           source_headers, attempts, repeat_failures, first_failed_at, last_failed_at, resolution, resolved_by,
           resolved_at, created_at, updated_at, erased_at, erased_by
    FROM quarantine WHERE consumer_name = :consumer AND failure_id = :failure_id
    """
)
_ANNOTATIONS = text(
    """
    SELECT author, note, created_at FROM quarantine_annotations
    WHERE consumer_name = :consumer AND failure_id = :failure_id ORDER BY id
    """
)
_REPROCESSING = text(
    """
    SELECT run_id, attempt, outcome, published_at, verified_at FROM reprocess_items
    WHERE consumer_name = :consumer AND failure_id = :failure_id ORDER BY attempt, verified_at
    """
)
# In the order the database appended them (migration 0009's triggers): every failure and change, none rewritten;
# the times are the clocks that saw each one. The failed attempts come first, in the order they happened: those that
# moved the record to a retry tier (migration 0020) are appended before the quarantine's own first and last.
_TIMELINE = text(
    """
    SELECT at, event, error_code, attempts, actor, detail FROM quarantine_events
    WHERE consumer_name = :consumer AND failure_id = :failure_id
    ORDER BY event <> 'failed', CASE WHEN event = 'failed' THEN attempts END, id
    """
)
# Its edits, without their bytes or diff (record content: shown with the payload, on a reveal).
_EDITS = text(
    """
    SELECT id, actor, created_at, state, decided_by, decided_at, sent_at FROM quarantine_edits
    WHERE consumer_name = :consumer AND failure_id = :failure_id ORDER BY id
    """
)


async def get(connection: AsyncConnection, record: RecordKey) -> dict[str, Any] | None:
    """One quarantined record with its envelope, original bytes, annotations, reprocess history, timeline and edits."""
    params = {"consumer": record.consumer_name, "failure_id": record.failure_id}
    row = (await connection.execute(_GET, params)).first()
    if row is None:
        return None
    found = dict(row._mapping)
    found["annotations"] = [dict(note._mapping) for note in await connection.execute(_ANNOTATIONS, params)]
    found["reprocessing"] = [dict(item._mapping) for item in await connection.execute(_REPROCESSING, params)]
    found["timeline"] = [dict(event._mapping) for event in await connection.execute(_TIMELINE, params)]
    found["edits"] = [dict(edit._mapping) for edit in await connection.execute(_EDITS, params)]
    return found


_CONSUMERS_OF = text(
    """
    SELECT failure_id, consumer_name FROM quarantine
    WHERE failure_id = ANY(CAST(:failure_ids AS text[]))
      AND (CAST(:consumer AS text) IS NULL OR consumer_name = :consumer)
    ORDER BY failure_id, consumer_name
    """
)


async def consumers_of(
    connection: AsyncConnection, failure_ids: Sequence[str], consumer: str | None = None
) -> dict[str, list[str]]:
    """Per failure id, the consumer names it is quarantined under (only `consumer`, when given); an id that is
    quarantined under none is absent."""
    found: dict[str, list[str]] = {}
    rows = await connection.execute(_CONSUMERS_OF, {"failure_ids": list(failure_ids), "consumer": consumer})
    for failure_id, name in rows:
        found.setdefault(failure_id, []).append(name)
    return found


# Two groupings joined: the counts per code and owner from the (status, error_code, owner) index alone, and the
# last hour's from a range of the created_at index; one grouping with both would read the whole table.
# The owner's filter is off when :owner is NULL (fixed SQL, as the listing's).
_OF_OWNER = "(CAST(:owner AS text) IS NULL OR owner = :owner)"
_STATS_BY_CODE = text(
    f"""
    SELECT a.error_code, a.owner, a.open, a.total, coalesce(h.last_hour, 0) AS last_hour
    FROM (SELECT error_code, owner, count(*) FILTER (WHERE status = 'open') AS open, count(*) AS total
          FROM quarantine WHERE {_OF_OWNER} GROUP BY error_code, owner) AS a
    LEFT JOIN (SELECT error_code, owner, count(*) AS last_hour FROM quarantine
               WHERE created_at > now() - interval '1 hour' AND {_OF_OWNER} GROUP BY error_code, owner) AS h
           ON h.error_code = a.error_code AND h.owner = a.owner
    ORDER BY a.error_code, a.owner
    """
)
_OLDEST_OPEN = text(
    f"SELECT extract(epoch FROM now() - min(first_failed_at)) FROM quarantine WHERE status = 'open' AND {_OF_OWNER}"
)


async def stats(connection: AsyncConnection, owner: str | None = None) -> dict[str, Any]:
    """Counts per error code and owner, rates over the last hour, and the age of the oldest open record (of one
    owner's records, when it is given)."""
    params = {"owner": owner or None}
    by_code = await connection.execute(_STATS_BY_CODE, params)
    groups = [
        {
            "error_code": row.error_code,
            "owner": row.owner,
            "open": row.open,
            "total": row.total,
            "rate_per_hour": row.last_hour,
        }
        for row in by_code
    ]
    age = (await connection.execute(_OLDEST_OPEN, params)).scalar_one()
    return {
        "open": sum(group["open"] for group in groups),
        "oldest_open_age_seconds": float(age) if age is not None else None,
        "by_code": groups,
    }
