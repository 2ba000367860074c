"""The console script of the service this distribution ships, and `python -m service`: the core's command line built
from the order domain (the one place that picks a domain), loaded with the collector off (service/launch.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.launch import launch

if TYPE_CHECKING:
    from service.ports import Domain


def _domain() -> Domain:
    from service.orders.domain import DOMAIN

    return DOMAIN


def main() -> None:
    """Run the command line of the order domain."""
    launch(_domain)


if __name__ == "__main__":
    main()
