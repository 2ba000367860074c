"""The long-running commands collect cyclic garbage on a clock, with the automatic collector off."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from service.runtime import collect_garbage
from tests.support import eventually


class _Node:
    """Something that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def collector_off() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def _unreachable_cycle() -> weakref.ref[_Node]:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return weakref.ref(first)


async def test_a_cycle_is_collected_on_the_clock_while_the_automatic_collector_is_off(collector_off: None) -> None:
    # Given a reference cycle nothing else points at, which reference counting alone never frees
    cycle = _unreachable_cycle()
    assert cycle() is not None

    # When the garbage clock runs
    stop = asyncio.Event()
    collecting = asyncio.create_task(collect_garbage(stop, every=0.01))

    async def collected() -> bool:
        return cycle() is None

    # Then the cycle is freed, and the clock stops when asked
    await eventually(collected, timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(collecting, timeout=5)
    assert collecting.done()
