"""The console script of the service this distribution ships, and `python -m service`: the core's command line built
from the order domain (the one place that picks a domain), loaded with the collector off.

Everything loading the CLI builds (modules, classes, functions, pydantic and SQLAlchemy structures) lives until the
process ends. With the cyclic collector on, its allocations trigger collections that walk those objects again and
again while they load (docs/performance.md, "The garbage collector and the start"); frozen, no later collection
walks them either.
"""

from __future__ import annotations

import gc


def main() -> None:
    """Load the CLI and the domain with the collector off, freeze what loading built, then run the command."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # Here, not at the top: the collector must be off while they load.
        from service.cli import main as cli
        from service.orders.domain import DOMAIN

        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    cli(DOMAIN)


if __name__ == "__main__":
    main()
