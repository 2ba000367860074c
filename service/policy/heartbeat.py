"""What a long-running process says of itself in its heartbeat, and how a reader tells a live process from a gone one.

Pure: the workers expose a `Snapshot` of what they already know (partitions, lag, pauses, breakers, counters), the
shell (service/worker/heartbeat.py) stamps it and writes `facts(...)` to the `processes` table. A process is gone when
it has been silent for longer than `GONE_AFTER_BEATS` of its own heartbeat intervals: it crashed, was killed, or
cannot reach the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GONE_AFTER_BEATS = 3
# A process not heard from for this long is no longer listed (and its row is purged by the next reconcile pass).
RETENTION_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One assigned partition as the consumer sees it: its lag (the broker's high watermark at the last fetch minus
    what the consumer committed, None before its first fetch), why it is paused (None: fetching), and the timestamp
    of the oldest record fetched from it that is not terminal yet (None: none is held)."""

    topic: str
    partition: int
    lag: int | None = None
    paused: str | None = None
    oldest_ms: int | None = None


@dataclass(frozen=True, slots=True)
class BreakerView:
    """One downstream's breaker in the process: its state, the error code that opened it, whether it opened on answers
    that are not the API's own (a misconfiguration), and for how long it has been away from closed."""

    downstream: str
    state: str
    code: str | None = None
    misconfigured: bool = False
    open_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Counters:
    """Monotonic counts of what the process did, as its metrics count them."""

    rounds: float = 0.0
    records: float = 0.0
    published: float = 0.0
    effects: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the process knows of itself at one moment (monotonic seconds), gathered from its workers."""

    at: float
    partitions: tuple[PartitionView, ...] = ()
    breakers: tuple[BreakerView, ...] = ()
    config_errors: tuple[str, ...] = ()
    counters: Counters = field(default_factory=Counters)


def rates(before: Snapshot | None, now: Snapshot) -> dict[str, float]:
    """Per-second rates of each counter between two snapshots (zero for the first, or a clock that did not move)."""
    elapsed = now.at - before.at if before is not None else 0.0
    then = before.counters if before is not None else now.counters
    counts = now.counters

    def per_second(a: float, b: float) -> float:
        return round(max(0.0, b - a) / elapsed, 2) if elapsed > 0 else 0.0

    return {
        "rounds_per_second": per_second(then.rounds, counts.rounds),
        "records_per_second": per_second(then.records, counts.records),
        "published_per_second": per_second(then.published, counts.published),
        "effects_per_second": per_second(then.effects, counts.effects),
    }


def facts(before: Snapshot | None, now: Snapshot) -> dict[str, Any]:
    """The heartbeat's `facts` document (snake_case JSON): partitions with lag and pauses, rates, breakers and
    configuration errors."""
    return {
        "partitions": [
            {
                "topic": view.topic,
                "partition": view.partition,
                "lag": view.lag,
                "paused": view.paused,
                "oldest_ms": view.oldest_ms,
            }
            for view in sorted(now.partitions, key=lambda view: (view.topic, view.partition))
        ],
        "rates": rates(before, now),
        "breakers": [
            {
                "downstream": view.downstream,
                "state": view.state,
                "code": view.code,
                "misconfigured": view.misconfigured,
                "open_seconds": round(view.open_seconds, 1),
            }
            for view in sorted(now.breakers, key=lambda view: view.downstream)
        ],
        "config_errors": list(now.config_errors),
    }


def status(last_seen: float, interval: float, stopped: bool, now: float) -> str:
    """`stopped` (it said so on its way out), `gone` (silent for more than `GONE_AFTER_BEATS` intervals) or `live`;
    times are seconds since the epoch on the database's clock."""
    if stopped:
        return "stopped"
    return "gone" if now - last_seen > GONE_AFTER_BEATS * interval else "live"


def lag_by_topic(processes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Total lag per topic over the live processes' partitions; a partition two processes report (a rebalance in
    between two heartbeats) counts once, by the latest heartbeat."""
    latest: dict[tuple[str, int], tuple[float, int]] = {}
    for process in processes:
        if process["status"] != "live":
            continue
        for view in process["facts"].get("partitions", ()):
            if view.get("lag") is None:
                continue
            place = (view["topic"], view["partition"])
            seen = process["last_seen_epoch"]
            if place not in latest or latest[place][0] < seen:
                latest[place] = (seen, int(view["lag"]))
    totals: dict[str, int] = {}
    for (topic, _), (_, lag) in sorted(latest.items()):
        totals[topic] = totals.get(topic, 0) + lag
    return totals


def oldest_unprocessed_seconds(processes: Iterable[Mapping[str, Any]], now: float) -> float | None:
    """How long ago the oldest record that a live consumer fetched and has not yet made terminal was first written
    (its original timestamp: a retry tier's copy keeps it); None when no live process holds one."""
    oldest = [
        view["oldest_ms"]
        for process in processes
        if process["status"] == "live"
        for view in process["facts"].get("partitions", ())
        if view.get("oldest_ms") is not None and view["oldest_ms"] >= 0
    ]
    return max(0.0, now - min(oldest) / 1000) if oldest else None


def open_breakers(processes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every breaker that is not closed in a live process, with the process that holds it."""
    return [
        {"process_id": process["process_id"], "role": process["role"], "host": process["host"], **breaker}
        for process in processes
        if process["status"] == "live"
        for breaker in process["facts"].get("breakers", ())
        if breaker["state"] != "closed"
    ]
