"""The turns of a kind's claims (service/worker/spacing.py): spaced after a short claim, at once after a full one,
one lane at a time, and never in the way of a shutdown."""

from __future__ import annotations

import asyncio
import time

from service.worker.spacing import Spacing

_LONG = 60.0  # a spacing no test could sit out: a turn that waited for it would fail the test's timeout


async def test_the_first_claim_starts_at_once() -> None:
    spacing, stop = Spacing(_LONG), asyncio.Event()
    async with asyncio.timeout(5):
        await spacing.turn(stop)


async def test_after_a_short_claim_the_next_starts_after_the_spacing() -> None:
    spacing, stop = Spacing(0.05), asyncio.Event()
    async with asyncio.timeout(5):
        await spacing.turn(stop)
        first = time.monotonic()
        await spacing.turn(stop)
        second = time.monotonic()
    assert second - first >= 0.05


async def test_after_a_full_claim_the_next_starts_at_once() -> None:
    spacing, stop = Spacing(_LONG), asyncio.Event()
    async with asyncio.timeout(5):
        await spacing.turn(stop)
        spacing.full()
        await spacing.turn(stop)  # a backlog: no spacing


async def test_two_lanes_woken_together_take_turns() -> None:
    spacing, stop = Spacing(_LONG), asyncio.Event()
    async with asyncio.timeout(5):
        await spacing.turn(stop)
        first, second = asyncio.create_task(spacing.turn(stop)), asyncio.create_task(spacing.turn(stop))
        done, _ = await asyncio.wait({first, second}, timeout=0.1)
        assert not done  # both wait for the turn the claim above took
        spacing.full()  # that claim came back full: one of them goes at once, and takes the turn
        done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        still, _ = await asyncio.wait(pending, timeout=0.1)
        assert not still  # the other waits for the spacing after the claim that went
        stop.set()
        await asyncio.gather(*pending)


async def test_a_shutdown_ends_the_wait() -> None:
    spacing, stop = Spacing(_LONG), asyncio.Event()
    async with asyncio.timeout(5):
        await spacing.turn(stop)
        waiting = asyncio.create_task(spacing.turn(stop))
        done, _ = await asyncio.wait({waiting}, timeout=0.1)
        assert not done  # it waits for the spacing
        stop.set()
        await waiting
