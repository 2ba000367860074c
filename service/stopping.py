"""Waiting that a shutdown request interrupts."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Sleep up to `seconds`, waking early when `stop` is set (SIGTERM must not wait for a backoff)."""
    if seconds <= 0 or stop.is_set():
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def wait_unless_stopped(stop: asyncio.Event, event: asyncio.Event, seconds: float) -> None:
    """Wait up to `seconds` for `event`, waking early when `stop` is set."""
    if event.is_set() or stop.is_set() or seconds <= 0:
        return
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
