"""The console script `inventory-service`, and `python -m inventory`: the core's command line built from the
inventory domain's `DOMAIN`."""

from __future__ import annotations

from service.launch import launch
from service.ports import Domain


def _domain() -> Domain:
    # Loaded by `launch`, with the collector off (as the core's own console script loads its domain).
    from inventory.domain import DOMAIN

    return DOMAIN


def main() -> None:
    """Run the command line of the inventory service."""
    launch(_domain)


if __name__ == "__main__":
    main()
