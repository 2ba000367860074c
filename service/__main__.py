"""The `order-service` console script, and `python -m service`: the CLI, loaded with the collector off.

Everything loading the CLI builds (modules, classes, functions, pydantic and SQLAlchemy structures) lives until the
process ends. With the cyclic collector on, its allocations trigger collections that walk those objects again and
again while they load (docs/performance.md, "The garbage collector and the start"); frozen, no later collection
walks them either.
"""

from __future__ import annotations

import gc


def main() -> None:
    """Load the CLI with the collector off, freeze what loading built, then run the command."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from service.cli import main as cli  # here, not at the top: the collector must be off while it loads

        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    cli()


if __name__ == "__main__":
    main()
