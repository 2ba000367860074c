"""The `processes` table: each long-running process's heartbeat written, and the processes read back with their status
(live, gone, stopped) on the database's clock, so that hosts whose clocks differ agree on who is gone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy import heartbeat


@dataclass(frozen=True)
class Identity:
    """Who beats: the process id (host, pid and start time: a restarted process with a reused pid is another), its
    role, consumer name, host, pid, package version, heartbeat interval and start time."""

    process_id: str
    role: str
    consumer_name: str
    host: str
    pid: int
    version: str
    interval_seconds: float
    started_at: datetime


_BEAT = text(
    """
    INSERT INTO processes (process_id, role, consumer_name, host, pid, version, interval_seconds, started_at,
                           last_seen, stopped_at, facts)
    VALUES (:process_id, :role, :consumer_name, :host, :pid, :version, :interval_seconds, :started_at,
            now(), NULL, CAST(:facts AS jsonb))
    ON CONFLICT (process_id) DO UPDATE SET last_seen = now(), stopped_at = NULL, facts = EXCLUDED.facts
    """
)
_STOPPED = text("UPDATE processes SET last_seen = now(), stopped_at = now() WHERE process_id = :process_id")
_PURGE = text(
    """
    DELETE FROM processes WHERE process_id IN (
        SELECT process_id FROM processes WHERE last_seen < now() - CAST(:period AS interval) LIMIT :batch
    )
    """
)
_COLUMNS = """
    process_id, role, consumer_name, host, pid, version, interval_seconds, started_at, last_seen, stopped_at, facts,
    extract(epoch FROM last_seen) AS last_seen_epoch, extract(epoch FROM now()) AS now_epoch
"""
# Alive: not stopped and heard from within its own `GONE_AFTER_BEATS` intervals. The first condition is a range of the
# last_seen index no longer than the longest interval allows, however many rows older processes left behind.
_ALIVE = """
    last_seen > now() - make_interval(secs => :longest) AND stopped_at IS NULL
    AND last_seen >= now() - make_interval(secs => :beats * interval_seconds)
"""
_LIVE = text(f"SELECT {_COLUMNS} FROM processes WHERE {_ALIVE} ORDER BY role, host, pid, started_at")
# The others heard from within the retention: the latest first, `:limit` of them (a page lists them, not a day of
# restarts), and how many there are.
_OTHERS = text(
    f"""
    SELECT {_COLUMNS}, count(*) OVER () AS heard FROM processes
    WHERE last_seen > now() - make_interval(secs => :retention) AND NOT ({_ALIVE})
    ORDER BY last_seen DESC LIMIT :limit
    """
)
_CLOCK = text("SELECT extract(epoch FROM now())")
_LONGEST_INTERVAL_SECONDS = 300  # ORDERS_HEARTBEAT_INTERVAL's upper bound (service/config.py)


async def beat(connection: AsyncConnection, identity: Identity, facts: dict[str, Any]) -> None:
    """Insert or refresh the process's row: last seen now, with these facts."""
    await connection.execute(
        _BEAT,
        {
            "process_id": identity.process_id,
            "role": identity.role,
            "consumer_name": identity.consumer_name,
            "host": identity.host,
            "pid": identity.pid,
            "version": identity.version,
            "interval_seconds": identity.interval_seconds,
            "started_at": identity.started_at,
            "facts": json.dumps(facts),
        },
    )


async def stopped(connection: AsyncConnection, process_id: str) -> None:
    """The process stopped cleanly."""
    await connection.execute(_STOPPED, {"process_id": process_id})


async def purge(connection: AsyncConnection, period: timedelta, batch: int) -> int:
    """Delete up to `batch` rows not heard from within `period` (reconcile's purges); how many."""
    result = await connection.execute(_PURGE, {"period": period, "batch": batch})
    return int(getattr(result, "rowcount", 0) or 0)


async def listed(connection: AsyncConnection, others: int = 50) -> tuple[float, list[dict[str, Any]], int]:
    """The database's clock (seconds since the epoch), every live process and the latest `others` of those gone or
    stopped within the retention, each with its `status` (service/policy/heartbeat.py) and `seconds_since_seen`;
    and how many gone or stopped ones were left out."""
    beats = heartbeat.GONE_AFTER_BEATS
    alive = {"beats": beats, "longest": beats * _LONGEST_INTERVAL_SECONDS}
    found = [dict(row._mapping) for row in await connection.execute(_LIVE, alive)]
    left_out = 0
    if others > 0:
        params = {**alive, "retention": heartbeat.RETENTION_SECONDS, "limit": others}
        rest = [dict(row._mapping) for row in await connection.execute(_OTHERS, params)]
        left_out = max(0, int(rest[0]["heard"]) - len(rest)) if rest else 0
        for values in rest:
            values.pop("heard")
        found += rest
    now = float(found[0]["now_epoch"]) if found else float((await connection.execute(_CLOCK)).scalar_one())
    for values in found:
        values.pop("now_epoch")
        seen = values["last_seen_epoch"] = float(values["last_seen_epoch"])
        values["status"] = heartbeat.status(seen, values["interval_seconds"], values["stopped_at"] is not None, now)
        values["seconds_since_seen"] = round(max(0.0, now - seen), 1)
    return now, found, left_out


def summary(now: float, processes: list[dict[str, Any]], left_out: int = 0) -> dict[str, Any]:
    """What the overview, `/api/processes` and `status --json` show besides the processes: lag per topic, the oldest
    unprocessed age and the open breakers (service/policy/heartbeat.py)."""
    return {
        "lag_by_topic": heartbeat.lag_by_topic(processes),
        "oldest_unprocessed_seconds": heartbeat.oldest_unprocessed_seconds(processes, now),
        "open_breakers": heartbeat.open_breakers(processes),
        "live": sum(1 for process in processes if process["status"] == "live"),
        "gone": sum(1 for process in processes if process["status"] == "gone"),
        "not_listed": left_out,
    }


async def system(connection: AsyncConnection, others: int = 50) -> dict[str, Any]:
    """The processes `listed` and their `summary`: what the Processes page, `/api/processes` and `status` show."""
    now, found, left_out = await listed(connection, others)
    return {"processes": found, **summary(now, found, left_out)}
