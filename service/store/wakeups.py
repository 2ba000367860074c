"""Wake-ups: a worker that found nothing to do waits until PostgreSQL says there may be something now.

Migration 0012's triggers notify a channel when a statement inserts into `outbox` (`OUTBOX`) or `effects`
(`EFFECTS`); since migration 0014 the effects' notification names the kind of effect added, once per kind and
statement. PostgreSQL delivers a notification when the inserting transaction commits, once per transaction,
channel and payload, and only then are the rows visible. A process listens on one connection of its own; each
waiting task has a `Waiter`, for one payload (a kind) or for all, which returns at the first notification for it
after its last wait or at its poll interval, whichever comes first. An empty payload is for every waiter.

A notification only shortens a wait. One that never comes costs the poll interval the worker always had, and
nothing else. That happens with no listening connection (the database is away: the next wait listens again),
behind a pooler in transaction mode that drops `LISTEN`, or for rows that become due without an insert or a
notification of their own (an effect's retry time, one an operator or the reconciler put back to pending). An effect
that waits for another is woken by the transaction that resolves that one (`effects.wake_waiting`).
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.stopping import wait_unless_stopped

log = structlog.get_logger("wakeups")

OUTBOX = "outbox_rows_added"
EFFECTS = "effects_rows_added"

# How long listening may take, and how long after a failed or lost listen the next wait tries again: meanwhile
# the waits are plain poll intervals.
_LISTEN_TIMEOUT_SECONDS = 5.0
_RELISTEN_SECONDS = 5.0


class Wakeups:
    """The notifications of one channel, for the waiters of one process: `async with Wakeups(engine, OUTBOX)`."""

    def __init__(self, engine: AsyncEngine, channel: str) -> None:
        self._engine = engine
        self._channel = channel
        self._waiters: list[tuple[str | None, asyncio.Event]] = []
        self._connection: AsyncConnection | None = None
        self._listen_after = 0.0
        self._listening: asyncio.Task[None] | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications reach this process now (without them each wait is its full poll interval)."""
        return self._connection is not None

    async def __aenter__(self) -> Wakeups:
        await self._listen()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
        await self._drop()

    def waiter(self, payload: str | None = None) -> Waiter:
        """A waiter for one task, woken by the notifications with this payload (and the empty one), or by all when
        it is None; create it before the task's first look, so that no notification after it is missed."""
        event = asyncio.Event()
        self._waiters.append((payload, event))
        return Waiter(self, event)

    def _relisten(self) -> None:
        """Listen again in the background once it is time (a wait never waits for a connection)."""
        idle = self._connection is None and self._listening is None
        if idle and asyncio.get_running_loop().time() >= self._listen_after:
            self._listening = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        try:
            async with asyncio.timeout(_LISTEN_TIMEOUT_SECONDS):
                connection = await self._engine.connect()
                try:
                    driver = (await connection.get_raw_connection()).driver_connection
                    assert driver is not None, "a connection of the pool has its asyncpg connection"
                    await driver.add_listener(self._channel, self._notified)
                    driver.add_termination_listener(self._lost)
                except BaseException:
                    await _quietly_invalidate(connection)
                    raise
        except Exception as error:
            self._listen_after = asyncio.get_running_loop().time() + _RELISTEN_SECONDS
            log.info("wakeups_not_listening", channel=self._channel, error=type(error).__name__)
            return
        finally:
            self._listening = None
        self._connection = connection
        self._wake_all()  # rows may have been inserted while nobody listened: every waiter looks once

    def _notified(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        if not payload:
            self._wake_all()
            return
        for wanted, event in self._waiters:
            if wanted is None or wanted == payload:
                event.set()

    def _lost(self, *_: Any) -> None:
        """The listening connection closed under us (the database restarted, say): listen again later."""
        connection, self._connection = self._connection, None
        self._listen_after = asyncio.get_running_loop().time() + _RELISTEN_SECONDS
        if connection is not None:
            asyncio.get_running_loop().create_task(_quietly_invalidate(connection))
        self._wake_all()

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await _quietly_invalidate(connection)  # closed, not pooled: no LISTEN goes back to the pool

    def _wake_all(self) -> None:
        for _, event in self._waiters:
            event.set()


class Waiter:
    """One task's wait for the next notification of its `Wakeups`."""

    def __init__(self, wakeups: Wakeups, event: asyncio.Event) -> None:
        self._wakeups = wakeups
        self._event = event

    async def wait(self, stop: asyncio.Event, seconds: float) -> None:
        """Return at the first notification since the last wait (at once if one came meanwhile), at `seconds`,
        or when `stop` is set."""
        self._wakeups._relisten()
        await wait_unless_stopped(stop, self._event, seconds)
        self._event.clear()


async def _quietly_invalidate(connection: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.invalidate()
    with contextlib.suppress(Exception):
        await connection.close()
