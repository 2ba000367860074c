"""`python -m service` runs the same CLI as the `order-service` console script."""

from __future__ import annotations

from service.cli import main

main()
