"""Every long-running process's heartbeat: every interval, a snapshot of what its parts know (partitions, lag, pauses,
breakers, counters, configuration errors) is written to its row in `processes`; a clean stop marks the row stopped.

The heartbeat is a task of its own: a write that fails or hangs (bounded by the interval) never stops or slows a
round, and is logged once per spell of failures. The document it writes is built by a pure function
(service/policy/heartbeat.py); this is the shell that gathers and writes.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol, runtime_checkable

import structlog
from prometheus_client.metrics import MetricWrapperBase
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.breakers import Breakers
from service.metrics import Metrics
from service.policy import heartbeat
from service.policy.heartbeat import Counters, PartitionView, Snapshot
from service.stopping import sleep_unless_stopped
from service.store import processes
from service.store.processes import Identity
from service.store.uow import UnitOfWork
from service.worker.topics_check import TopicsCheck

log = structlog.get_logger("heartbeat")


@runtime_checkable
class Consuming(Protocol):
    """A part that owns partitions (the consumer loop)."""

    def partitions(self) -> tuple[PartitionView, ...]:
        """Its assigned partitions now."""

    def problems(self) -> tuple[str, ...]:
        """What it knows is misconfigured now."""


def identity(role: str, consumer_name: str, program: str, interval: float, started_at: datetime) -> Identity:
    """This process's identity: host, pid and start time make its id."""
    host, pid = socket.gethostname(), os.getpid()
    try:
        release = version(program)
    except PackageNotFoundError:
        release = "unknown"
    process_id = f"{host}:{pid}:{started_at.strftime('%Y%m%dT%H%M%S.%fZ')}"
    return Identity(process_id, role, consumer_name, host, pid, release, interval, started_at)


def _sum(metric: MetricWrapperBase, suffix: str) -> float:
    """The sum of a counter's (or a histogram's `_count`) samples over every label."""
    return sum(sample.value for family in metric.collect() for sample in family.samples if sample.name.endswith(suffix))


class Heartbeat:
    """Writes the process's heartbeat every `interval` seconds until stopped, then marks it stopped."""

    def __init__(
        self,
        engine: AsyncEngine,
        who: Identity,
        metrics: Metrics,
        breakers: Breakers,
        topics_check: TopicsCheck,
    ) -> None:
        self._engine = engine
        self._who = who
        self._metrics = metrics
        self._breakers = breakers
        self._topics_check = topics_check
        self._parts: Sequence[object] = ()
        self._failing = False  # in a spell of failed writes: said once
        self._before: Snapshot | None = None

    @property
    def identity(self) -> Identity:
        """Who beats."""
        return self._who

    def watch(self, parts: Sequence[object]) -> None:
        """The process's parts, once built: the consumer loop among them tells its partitions."""
        self._parts = parts

    def snapshot(self) -> Snapshot:
        """What the process's parts know now."""
        consuming = [part for part in self._parts if isinstance(part, Consuming)]
        breakers = self._breakers.views()
        errors = [problem for part in consuming for problem in part.problems()]
        if self._topics_check.problem:
            errors.append(self._topics_check.problem)
        errors += [
            f"downstream {view.downstream}: its answers are not its API's own (check its URL and credentials)"
            for view in breakers
            if view.misconfigured and view.state != "closed"
        ]
        m = self._metrics
        counters = Counters(
            rounds=_sum(m.batch_seconds, "_count"),
            records=_sum(m.records, "_total"),
            published=_sum(m.published, "_total"),
            effects=_sum(m.effect_outcomes, "_total"),
        )
        return Snapshot(
            at=asyncio.get_running_loop().time(),
            partitions=tuple(view for part in consuming for view in part.partitions()),
            breakers=breakers,
            config_errors=tuple(errors),
            counters=counters,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Beat now and every interval; on the way out, say the process stopped."""
        interval = self._who.interval_seconds
        while not stop.is_set():
            await self.tick()
            await sleep_unless_stopped(stop, interval)
        await self._bounded(self._stopped, interval)

    async def tick(self) -> None:
        """One heartbeat, given up after an interval; a failure is logged (once per spell), never raised."""
        await self._bounded(self.beat, self._who.interval_seconds)

    async def beat(self) -> None:
        """Write one heartbeat."""
        now = self.snapshot()
        document = heartbeat.facts(self._before, now)
        async with UnitOfWork(self._engine) as uow:
            await processes.beat(uow.connection, self._who, document)
            await uow.commit()
        self._before = now

    async def _stopped(self) -> None:
        async with UnitOfWork(self._engine) as uow:
            await processes.stopped(uow.connection, self._who.process_id)
            await uow.commit()

    async def _bounded(self, write: Callable[[], Awaitable[None]], seconds: float) -> None:
        """Run one write within `seconds`; a failure is logged once per spell and otherwise ignored."""
        try:
            async with asyncio.timeout(seconds):
                await write()
        except Exception as error:  # whatever it is, the heartbeat must not take the process down
            if not self._failing:
                log.warning("heartbeat_failed", error=type(error).__name__)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeat_restored")
        self._failing = False
