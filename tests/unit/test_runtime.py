"""The long-running commands collect cyclic garbage on a clock, with the automatic collector off."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.runtime import collect_garbage, worth_collecting
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
    # (every object of this test process counts as few)
    collecting = asyncio.create_task(collect_garbage(stop, every=0.01, cheap=10**9))

    async def collected() -> bool:
        return cycle() is None

    # Then the cycle is freed, and the clock stops when asked
    await eventually(collected, timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(collecting, timeout=5)
    assert collecting.done()


@pytest.mark.parametrize(
    ("alive", "since_last", "expected"),
    [
        (0, 0.0, True),  # nothing in flight: a collection is nearly free
        (50_000, 10.0, True),  # at the bound
        (50_001, 10.0, False),  # a backlog's records alive: wait for a quieter moment
        (250_000, 59.9, False),
        (250_000, 60.0, True),  # but never longer than a minute
    ],
)
def test_the_clock_collects_when_little_is_alive_or_a_minute_has_passed(
    alive: int, since_last: float, expected: bool
) -> None:
    assert worth_collecting(alive, since_last, cheap=50_000, at_least_every=60.0) is expected


async def test_a_cycle_is_collected_within_the_bound_while_many_objects_are_alive(collector_off: None) -> None:
    # Given a cycle, and more live objects than a cheap collection allows
    cycle = _unreachable_cycle()
    alive = [[n] for n in range(1_000)]

    # When the clock runs with a bound of a few ticks
    stop = asyncio.Event()
    collecting = asyncio.create_task(collect_garbage(stop, every=0.01, cheap=100, at_least_every=0.05))

    async def collected() -> bool:
        return cycle() is None

    # Then the cycle is still freed
    await eventually(collected, timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(collecting, timeout=5)
    assert len(alive) == 1_000


_LOAD_THE_CLI = """
import gc, json, sys
collections = []
# A collection once the CLI began to load and before anything is frozen walks its modules while they load.
loading = lambda: "service.cli" in sys.modules and not gc.get_freeze_count()
gc.callbacks.append(lambda phase, info: phase == "start" and loading() and collections.append(1))
sys.argv = ["order-service", "--help"]
from service.__main__ import main
try:
    main()
except SystemExit:
    pass
print(json.dumps({"collections": collections, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "loaded": "service.cli" in sys.modules}))
"""


def test_the_console_script_loads_the_cli_without_a_collection_and_freezes_what_it_built() -> None:
    # Given a fresh interpreter, with every collection it starts recorded
    # When the console script's entry point runs a command
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_THE_CLI],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    outcome = json.loads(result.stdout.strip().splitlines()[-1])

    # Then no collection walked the modules while they loaded, what they built is frozen, and the collector is
    # back on for the command
    assert outcome["loaded"] is True
    assert outcome["collections"] == []
    assert outcome["frozen"] > 0
    assert outcome["enabled"] is True


def test_python_dash_m_service_runs_the_same_cli() -> None:
    # Given the package run as a module, as the console script's entry point is
    # When it is asked for its version
    result = subprocess.run(
        [sys.executable, "-m", "service", "--version"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )

    # Then the CLI answers and exits 0
    assert (result.returncode, result.stdout.split()[0]) == (0, "order-service")


def test_loading_the_cli_leaves_a_callers_collector_as_it_found_it() -> None:
    # Given a caller that runs with the collector off, then calls the console script's entry point
    code = (
        "import gc, sys; gc.disable(); sys.argv = ['order-service', '--version']\n"
        "from service.__main__ import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(gc.isenabled())"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)

    # Then the collector is still off afterwards
    assert result.stdout.strip().splitlines()[-1] == "False"
