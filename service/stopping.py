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
