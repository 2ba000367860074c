"""The `order-service` console script, and `python -m service`: the CLI, loaded with the collector off.

Loading the CLI builds about 160,000 objects the collector tracks (modules, classes, functions, pydantic and
SQLAlchemy structures), all alive until the process ends. With the collector on, their allocations trigger
collections that walk them again and again while they load, about a sixth of the load (docs/performance.md,
"Twelfth session"); frozen, no later collection walks them either.
"""

from __future__ import annotations

import gc


def main() -> None:
    """Load the CLI with the collector off, freeze what loading built, then run the command."""
    gc.disable()
    from service.cli import main as cli  # here, not at the top: the collector must be off while it loads

    gc.freeze()
    gc.enable()
    cli()


if __name__ == "__main__":
    main()
