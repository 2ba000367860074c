"""Starting a console script: the core's command line and the domain it serves, loaded with the collector off.

Everything loading the CLI builds (modules, classes, functions, pydantic and SQLAlchemy structures) lives until the
process ends. With the cyclic collector on, its allocations trigger collections that walk those objects again and
again while they load (docs/performance.md); frozen, no later collection walks them either.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.ports import Domain


def launch(load: Callable[[], Domain]) -> None:
    """Load the CLI and the domain `load` returns with the collector off, freeze what loading built, then run the
    command the process was started with."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # Here, not at the top: the collector must be off while they load.
        from service.cli import main as cli

        domain = load()
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    cli(domain)
