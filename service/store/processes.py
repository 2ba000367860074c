"""The `processes` table: each long-running process's heartbeat written, and the processes read back with their status
(live, gone, stopped) on the database's clock, so that hosts whose clocks differ agree on who is gone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
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
_PURGE = text("DELETE FROM processes WHERE last_seen < now() - make_interval(secs => :seconds)")
# Only the rows heard from within the retention: the index on last_seen keeps this a short range however many rows
# older processes left behind.
_LIST = text(
    """
    SELECT process_id, role, consumer_name, host, pid, version, interval_seconds, started_at, last_seen, stopped_at,
           facts, extract(epoch FROM last_seen) AS last_seen_epoch, extract(epoch FROM now()) AS now_epoch
    FROM processes WHERE last_seen > now() - make_interval(secs => :seconds)
    ORDER BY role, host, pid, started_at
    """
)


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


async def purge(connection: AsyncConnection, older_than_seconds: float = heartbeat.RETENTION_SECONDS) -> int:
    """Delete the rows not heard from within the retention; return how many."""
    result = await connection.execute(_PURGE, {"seconds": older_than_seconds})
    return int(getattr(result, "rowcount", 0) or 0)


async def listed(
    connection: AsyncConnection, within_seconds: float = heartbeat.RETENTION_SECONDS
) -> tuple[float, list[dict[str, Any]]]:
    """The database's clock (seconds since the epoch) and every process heard from within the retention, each with
    its `status` (service/policy/heartbeat.py) and `seconds_since_seen`."""
    now = None
    found = []
    for row in await connection.execute(_LIST, {"seconds": within_seconds}):
        values = dict(row._mapping)
        now = float(values.pop("now_epoch"))
        seen = float(values["last_seen_epoch"])
        values["last_seen_epoch"] = seen
        values["status"] = heartbeat.status(seen, values["interval_seconds"], values["stopped_at"] is not None, now)
        values["seconds_since_seen"] = round(max(0.0, now - seen), 1)
        found.append(values)
    if now is None:
        now = float((await connection.execute(text("SELECT extract(epoch FROM now())"))).scalar_one())
    return now, found


def summary(now: float, processes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the overview, `/api/processes` and `status --json` show besides the processes: lag per topic, the oldest
    unprocessed age and the open breakers (service/policy/heartbeat.py)."""
    return {
        "lag_by_topic": heartbeat.lag_by_topic(processes),
        "oldest_unprocessed_seconds": heartbeat.oldest_unprocessed_seconds(processes, now),
        "open_breakers": heartbeat.open_breakers(processes),
        "live": sum(1 for process in processes if process["status"] == "live"),
        "gone": sum(1 for process in processes if process["status"] == "gone"),
    }
